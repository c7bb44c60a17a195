"""Llama-architecture GGUF models with random weights and a small byte-level BPE vocabulary
built here, so that llama.cpp's llama-server runs a real KV cache on 2 CPU cores with nothing
downloaded from a model hub (needs the `gguf` package: `pip install 'kvbench[llamacpp]'`).

    python engines/llamacpp/make_model.py OUT.gguf [--size tiny|bench]

Sizes (SIZES): `tiny` (2 layers, hidden 128, 4 query / 2 KV heads: fast tests) and `bench`
(KV bytes per token and prefill cost per token in a proportion like real models', so that
recomputing a long prompt takes seconds on 2 cores and restoring its KV much less; figures in
docs/performance.md). Context 131072; vocabulary: the 256 byte tokens, merges that spell the
words of kvbench's synthetic prompts, and ChatML control tokens with a chat template. Output
weights of control and non-printable byte tokens are zero, so generation never stops early on
EOS and every streamed chunk carries a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import InputError
from harness.inputs.prompts import VOCAB  # the words prompts are made of


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, f16 (llama.cpp's default KV type), every layer."""
        return 2 * self.layers * self.kv_heads * (self.hidden // self.heads) * 2


SIZES = {
    "tiny": Size(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256),
    "bench": Size(hidden=256, layers=4, heads=8, kv_heads=2, ffn=768),
}
CTX = 131072
ROPE_THETA = 500000.0  # Llama 3's; any base works for random weights
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise InputError(
            "making a model for llama.cpp needs the gguf package: pip install 'kvbench[llamacpp]'"
        ) from None
    return gguf


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    gguf = _gguf()
    byte_map = bytes_to_unicode()
    tokens = [byte_map[b] for b in range(256)]
    # Byte-level BPE (tokenizer "gpt2"): the 256 byte tokens are ordinary tokens, not <0xNN> ones.
    types = [gguf.TokenType.NORMAL] * 256
    merges: list[str] = []
    known = set(tokens)
    words = sorted({w for w in VOCAB} | {w.capitalize() for w in VOCAB} | {"kvbench", "prompt", "and"})
    for word in words:
        for text in (word, " " + word):
            chars = "".join(byte_map[b] for b in text.encode())
            cur = chars[0]
            for ch in chars[1:]:
                new = cur + ch
                if new not in known:
                    merges.append(f"{cur} {ch}")
                    tokens.append(new)
                    types.append(gguf.TokenType.NORMAL)
                    known.add(new)
                cur = new
    for s in SPECIAL:
        tokens.append(s)
        types.append(gguf.TokenType.CONTROL)
    return tokens, types, merges


def make(out: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write the model of that size to `out` (the same bytes for the same size and seed)."""
    gguf = _gguf()
    z = SIZES[size]
    tokens, types, merges = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    head_dim = z.hidden // z.heads
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(f"kvbench-{size}-llama")
    w.add_context_length(CTX)
    w.add_embedding_length(z.hidden)
    w.add_block_count(z.layers)
    w.add_feed_forward_length(z.ffn)
    w.add_head_count(z.heads)
    w.add_head_count_kv(z.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.08).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(n_vocab, z.hidden))
    for i in range(z.layers):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", np.ones(z.hidden, np.float32))
        w.add_tensor(f"{p}.attn_q.weight", rand(z.hidden, z.hidden))
        w.add_tensor(f"{p}.attn_k.weight", rand(z.kv_heads * head_dim, z.hidden))
        w.add_tensor(f"{p}.attn_v.weight", rand(z.kv_heads * head_dim, z.hidden))
        w.add_tensor(f"{p}.attn_output.weight", rand(z.hidden, z.hidden))
        w.add_tensor(f"{p}.ffn_norm.weight", np.ones(z.hidden, np.float32))
        w.add_tensor(f"{p}.ffn_gate.weight", rand(z.ffn, z.hidden))
        w.add_tensor(f"{p}.ffn_up.weight", rand(z.ffn, z.hidden))
        w.add_tensor(f"{p}.ffn_down.weight", rand(z.hidden, z.ffn))
    w.add_tensor("output_norm.weight", np.ones(z.hidden, np.float32))
    output = rand(n_vocab, z.hidden)
    for i, t in enumerate(types):
        if t != gguf.TokenType.NORMAL or (i < 256 and not 32 <= i < 127):
            output[i] = 0.0  # never generated: no early EOS, no partial UTF-8 in a chunk
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
