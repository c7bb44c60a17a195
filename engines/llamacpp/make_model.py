"""Write a llama-architecture GGUF model with random weights (harness/engines/models.py).

python engines/llamacpp/make_model.py OUT.gguf [--size tiny|bench]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.engines.models import SIZES, make

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = ap.parse_args()
    print(make(args.out, args.size))
