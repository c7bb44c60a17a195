"""A model directory for Dynamo's mocker workers, made here (nothing from a model hub): the tiny
byte-level BPE tokenizer and ChatML template of engines/vllm/make_model.py, a weightless
`config.json` with gpt-oss-120b's attention geometry (36 layers, 8 KV heads of 64: 73,728 bytes
of KV per token, what the mocker moves between its tiers), and `answers.jsonl`, the answers the
mocker streams. Run it with the Python that has Dynamo (engines/dynamo/install.sh):

    VENV/bin/python engines/dynamo/make_model.py OUT_DIR [--answers 4,16,64]

The mocker's own tokens are random 32-bit ids, which no tokenizer decodes: the frontend streams
no text for them, and a client sees no token. Given `--response-replay-trace-path answers.jsonl`,
a request annotated `output_replay_id:kvbench-N` (harness.engines.dynamo.annotation) is answered
with N real tokens of the vocabulary instead: one SSE chunk each, as a real model's. N is the
request's `max_tokens`, which the mocker otherwise ignores for such an answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.vllm.make_model import CTX, tokenizer  # noqa: E402

# gpt-oss-120b's attention: KV bytes per token = 2 (K and V) x layers x KV heads x head dim x 2 bytes
LAYERS, KV_HEADS, HEAD_DIM = 36, 8, 64
ANSWER_TEXT = " kvbench prompt and"
KEY = "kvbench-{n}"  # harness/engines/dynamo.py ANSWER_KEY


def main(out: Path, answers: list[int]) -> None:
    from tokenizers import Tokenizer

    vocab = tokenizer(out)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": 2880,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 64,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": CTX,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(ANSWER_TEXT).ids
    with open(out / "answers.jsonl", "w") as f:
        for n in answers:
            tokens = (ids * (n // len(ids) + 1))[:n]
            # a Mooncake trace line, as the mocker reads it: the key, and the answer's token ids
            line = {"request_id": KEY.format(n=n), "timestamp": 0, "input_length": 1, "hash_ids": [0]}
            f.write(json.dumps({**line, "output_length": n, "output_token_ids": tokens}) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--answers"):
        raise SystemExit("usage: make_model.py OUT_DIR [--answers N,N,...]")
    lengths = sorted({int(x) for x in args[2].split(",")}) if len(args) == 3 else [16]
    if any(n < 1 for n in lengths):
        raise SystemExit("make_model.py: --answers: lengths of at least 1 token")
    main(Path(args[0]), lengths)
