"""Start llama.cpp's llama-server on an ephemeral loopback port with the tiny model, wait for
/health, and always stop it by PID (also on SIGTERM): for anyone trying kvbench on a real engine.
A scenario's `[engine] kind = "llamacpp"` does the same from `kvbench run` (harness/engines/).

    python engines/llamacpp/serve.py [--parallel 4] [--cache-ram MIB] [--slot-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.engines.llamacpp import LlamaServer, binary
from harness.engines.models import SIZES, make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny", help="the model made (models.py)")
    ap.add_argument("--cache-ram", type=int, default=None, help="MiB of host-memory prompt cache (0: none)")
    ap.add_argument("--slot-dir", type=Path, default=None, help="where slots are saved (--slot-save-path)")
    args = ap.parse_args()
    server = binary()
    if server is None:
        raise SystemExit("llama-server is not built: run engines/llamacpp/build.sh")
    # SIGTERM unwinds like Ctrl-C: the server is stopped by PID and the model's folder removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory() as tmp:
        model = make(Path(tmp) / f"{args.size}.gguf", args.size)
        with LlamaServer(
            server, model, parallel=args.parallel, slot_dir=args.slot_dir, cache_ram_mib=args.cache_ram
        ) as srv:
            print(srv.base_url, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)


if __name__ == "__main__":
    main()
