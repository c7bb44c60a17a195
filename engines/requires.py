"""A wheel's own requirements (its METADATA's Requires-Dist, without extras' ones), one per line,
but those named after it: what an install script installs after the wheel itself, installed with
--no-deps, when one of its dependencies must not come (vLLM's CUDA torch, Dynamo's aisimulate).
Standard library only: it runs with the engine's fresh virtual environment's Python.

    python engines/requires.py WHEEL [NAME ...] > requirements.txt
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import Parser


def requires(wheel: str, leave_out: set[str]) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    out = []
    for req in msg.get_all("Requires-Dist") or []:
        name = re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower()
        if "extra ==" not in req and name not in leave_out:
            out.append(req)
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: requires.py WHEEL [NAME ...]")
    print("\n".join(requires(sys.argv[1], {n.lower() for n in sys.argv[2:]})))
