"""A tiny llama-architecture GGUF model with random weights and a small byte-level BPE
vocabulary built here, so that llama.cpp's llama-server runs a real KV cache on 2 CPU cores with
nothing downloaded from a model hub.

    python engines/llamacpp/make_model.py OUT.gguf

2 layers, hidden 128, 4 query / 2 KV heads, context 131072; vocabulary: the 256 byte tokens,
merges that spell the words of kvbench's synthetic prompts, and ChatML control tokens with a
chat template. Output weights of control and non-printable byte tokens are zero, so generation
never stops early on EOS and every streamed chunk carries a token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.prompts import _VOCAB  # noqa: E402  (the words prompts are made of)

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CTX = 128, 2, 4, 2, 256, 131072
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


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    byte_map = bytes_to_unicode()
    tokens = [byte_map[b] for b in range(256)]
    # Byte-level BPE (tokenizer "gpt2"): the 256 byte tokens are ordinary tokens, not <0xNN> ones.
    types = [gguf.TokenType.NORMAL] * 256
    merges: list[str] = []
    known = set(tokens)
    words = sorted({w for w in _VOCAB} | {w.capitalize() for w in _VOCAB} | {"kvbench", "prompt", "and"})
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


def main(out: Path, seed: int = 0) -> None:
    tokens, types, merges = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("kvbench-tiny-llama")
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
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

    w.add_tensor("token_embd.weight", rand(n_vocab, HIDDEN))
    for i in range(LAYERS):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(f"{p}.attn_q.weight", rand(HIDDEN, HIDDEN))
        w.add_tensor(f"{p}.attn_k.weight", rand(KV_HEADS * head_dim, HIDDEN))
        w.add_tensor(f"{p}.attn_v.weight", rand(KV_HEADS * head_dim, HIDDEN))
        w.add_tensor(f"{p}.attn_output.weight", rand(HIDDEN, HIDDEN))
        w.add_tensor(f"{p}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(f"{p}.ffn_gate.weight", rand(FFN, HIDDEN))
        w.add_tensor(f"{p}.ffn_up.weight", rand(FFN, HIDDEN))
        w.add_tensor(f"{p}.ffn_down.weight", rand(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    output = rand(n_vocab, HIDDEN)
    for i, t in enumerate(types):
        if t != gguf.TokenType.NORMAL or (i < 256 and not 32 <= i < 127):
            output[i] = 0.0  # never generated: no early EOS, no partial UTF-8 in a chunk
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_model.py OUT.gguf")
    main(Path(sys.argv[1]))
