"""A tiny llama model in Hugging Face format with random weights and a byte-level BPE tokenizer
trained here on the words of kvbench's synthetic prompts, for vLLM's CPU build: nothing comes
from a model hub. Run it with the Python that has vLLM (transformers, tokenizers, torch):

    VENV/bin/python engines/vllm/make_model.py OUT_DIR [--tokenizer-only]

4 layers, hidden 256, 4 query / 2 KV heads, context 16384; ChatML control tokens and template.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.inputs.prompts import VOCAB  # noqa: E402  (stdlib only: importable from vLLM's Python)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CTX = 16384


def tokenizer(out: Path) -> int:
    """Write the tokenizer (and its chat template) to `out`; return its vocabulary size. Needs
    only transformers and tokenizers (bench/genai_perf.py gives it to genai-perf this way)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = sorted(set(VOCAB) | {w.capitalize() for w in VOCAB} | {"kvbench", "prompt", "and"})
    trainer = trainers.BpeTrainer(
        vocab_size=2048, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([" ".join(words)] * 4 + [" " + w for w in words], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return int(tok.get_vocab_size())


def main(out: Path, seed: int = 0) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = tokenizer(out)
    ids = PreTrainedTokenizerFast.from_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CTX,
        bos_token_id=ids.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=ids.convert_tokens_to_ids("<|im_end|>"),
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--tokenizer-only"]):
        raise SystemExit("usage: make_model.py OUT_DIR [--tokenizer-only]")
    if sys.argv[2:]:
        tokenizer(Path(sys.argv[1]))
    else:
        main(Path(sys.argv[1]))
