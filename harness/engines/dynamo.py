"""NVIDIA Dynamo's own serving stack without a GPU: its frontend (OpenAI server, preprocessor,
KV-aware router) in front of mocker workers (Dynamo's simulated vLLM engine: block KV cache with
prefix caching and LRU eviction, continuous batching, modelled prefill and decode times, and a
host tier "G2" with transfer bandwidths), installed by engines/dynamo/install.sh into a Python of
its own, serving a model directory engines/dynamo/make_model.py makes. Found through a file
store: no etcd, no NATS. For the tests and for anyone trying kvbench on Dynamo's code here.

Each process is started and stopped as process.py does (by PID, its process group, and by the
kernel if kvbench dies). The frontend's /health answers before any worker has registered, so the
deployment is ready when /v1/models lists the model and the frontend's /health lists every
worker's `generate` endpoint."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines.process import ServerProcess, installed

VERSION = "1.6.1"  # the ai-dynamo release engines/dynamo/install.sh installs
SERVED_NAME = "tiny"
ANSWER_KEY = "kvbench-{n}"  # engines/dynamo/make_model.py KEY
READY_TIMEOUT_S = 120.0  # a busy machine starts Python and Dynamo's runtime slowly


def python() -> Path | None:
    """The Python that has Dynamo: $KVBENCH_DYNAMO_PYTHON or install.sh's cache, if it is there."""
    return installed("KVBENCH_DYNAMO_PYTHON", f"dynamo-{VERSION}/bin/python")


def annotation(max_tokens: int) -> dict[str, Any]:
    """The request field that has a mocker answer with `max_tokens` real tokens (make_model.py
    says why): for `[endpoint] extra_body`."""
    return {"nvext": {"annotations": [f"output_replay_id:{ANSWER_KEY.format(n=max_tokens)}"]}}


@dataclass(frozen=True)
class Workers:
    """What each mocker worker models (the flags of `python -m dynamo.mocker`)."""

    count: int = 1
    block_size: int = 16
    gpu_blocks: int = 2048  # G1, the device's KV blocks
    host_blocks: int = 0  # G2, the host tier's blocks (0: none)
    host_gbps: float = 32.0  # G2 <-> G1 bandwidth, both ways (GB/s)

    def flags(self) -> list[str]:
        out = ["--block-size", str(self.block_size), "--num-gpu-blocks-override", str(self.gpu_blocks)]
        if self.host_blocks:
            out += ["--num-host-blocks", str(self.host_blocks)]
            for way in ("h2d", "d2h"):
                out += [f"--host-offload-{way}-bandwidth-gbps", f"{self.host_gbps:g}"]
        return out


class _Dynamo(ServerProcess):
    """A Dynamo process: its environment keeps everything on loopback and in `home`."""

    def __init__(self, py: Path, home: Path) -> None:
        super().__init__(
            {
                **os.environ,
                "HOME": str(home),  # the frontend caches model cards under ~/.cache/dynamo
                "DYN_FILE_KV": str(home / "kvstore"),  # file-based discovery, shared by all
                "DYN_TCP_RPC_HOST": "127.0.0.1",
                "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1",
                "DYN_SYSTEM_HOST": "127.0.0.1",
                "HF_HUB_OFFLINE": "1",
            }
        )
        self.py = py


class Frontend(_Dynamo):
    name = "dynamo-frontend"

    def __init__(self, py: Path, home: Path, router_mode: str) -> None:
        super().__init__(py, home)
        self.router_mode = router_mode

    def command(self, port: int) -> list[str]:
        return [
            str(self.py), "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
            "--discovery-backend", "file", "--router-mode", self.router_mode,
        ]  # fmt: skip


class Mocker(_Dynamo):
    """One mocker worker; `port` is its system port (/health, /metrics)."""

    name = "dynamo-mocker"
    port_below = 32768  # Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a signed 16-bit number
    # its /health says "notready" for good without a health-check payload configured; its system
    # server is up when /metrics answers, and the frontend says when it has registered
    health_path = "/metrics"

    def __init__(self, py: Path, home: Path, model: Path, workers: Workers) -> None:
        super().__init__(py, home)
        self.model, self.workers = model, workers

    def command(self, port: int) -> list[str]:
        assert self.env is not None
        self.env["DYN_SYSTEM_PORT"] = str(port)  # its only way to be told; read when it starts
        return [
            str(self.py), "-m", "dynamo.mocker", "--model-path", str(self.model), "--model-name", SERVED_NAME,
            "--discovery-backend", "file", *self.workers.flags(),
            "--response-replay-trace-path", str(self.model / "answers.jsonl"),
        ]  # fmt: skip


class Deployment:
    """A frontend and `workers.count` mocker workers serving `model` (make_model.py's); stopped
    by PID on the way out, whatever happens. `router_mode`: the frontend's choice of worker, "kv"
    (where the prompt's blocks are: Dynamo's KV-aware router) or "round-robin"."""

    def __init__(self, py: Path, model: Path, workers: Workers = Workers(), router_mode: str = "kv") -> None:
        self.py, self.model, self.workers, self.router_mode = py, model, workers, router_mode
        self.frontend: Frontend | None = None
        self.mockers: list[Mocker] = []
        self._home = tempfile.TemporaryDirectory(prefix="kvbench-dynamo-")

    @property
    def base_url(self) -> str:
        assert self.frontend is not None
        return self.frontend.base_url

    def __enter__(self) -> Deployment:
        home = Path(self._home.name)
        try:
            self.frontend = Frontend(self.py, home, self.router_mode).__enter__()
            for _ in range(self.workers.count):
                self.mockers.append(Mocker(self.py, home, self.model, self.workers).__enter__())
            self._wait_registered()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_registered(self) -> None:
        """Until the frontend lists the model and knows every worker's `generate` endpoint."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if self._registered():
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"dynamo: the frontend did not list model {SERVED_NAME!r} with {self.workers.count} worker(s) "
            f"within {READY_TIMEOUT_S:g} s"
        )

    def _registered(self) -> bool:
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(self.base_url + "/models", timeout=5) as r:
            if not any(m.get("id") == SERVED_NAME for m in json.loads(r.read()).get("data", [])):
                return False
        with urllib.request.urlopen(root + "/health", timeout=5) as r:
            instances = json.loads(r.read()).get("instances", [])
        return sum(i.get("endpoint") == "generate" for i in instances) >= self.workers.count

    def __exit__(self, *_exc: object) -> None:
        for m in reversed(self.mockers):
            m.__exit__(None, None, None)
        if self.frontend is not None:
            self.frontend.__exit__(None, None, None)
        self._home.cleanup()
