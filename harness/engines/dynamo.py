"""NVIDIA Dynamo's own serving stack without a GPU: its frontend (OpenAI server, preprocessor,
KV-aware router) in front of mocker workers (Dynamo's simulated vLLM engine: block KV cache with
prefix caching and LRU eviction, continuous batching, modelled prefill and decode times, and a
host tier "G2" with transfer bandwidths), installed by engines/dynamo/install.sh into a Python of
its own, serving a model directory engines/dynamo/make_model.py makes. Found through a file
store: no etcd, no NATS. Used by `[engine] kind = "dynamo"` scenarios (`start`) and the tests.

Each process is started and stopped as process.py does (by PID, its process group, and by the
kernel if kvbench dies). The frontend's /health answers before any worker has registered, so the
deployment is ready when /v1/models lists the model and the frontend's /health lists every
worker's `generate` endpoint."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.engines import DynamoEngineCfg, EngineCfg, FittedTiming, MockerTiming
from harness.engines import Started
from harness.engines.process import ServerProcess, installed

VERSION = "1.6.1"  # the ai-dynamo release engines/dynamo/install.sh installs
SERVED_NAME = "tiny"
ANSWER_KEY = "kvbench-{n}"  # engines/dynamo/make_model.py KEY
READY_TIMEOUT_S = 120.0  # a busy machine starts Python and Dynamo's runtime slowly
ENGINE_PREFIX = "kvbench-dynamo-engine-"  # the temporary folder of an [engine]'s model and processes
MAKE_MODEL = Path(__file__).resolve().parents[2] / "engines" / "dynamo" / "make_model.py"


def python() -> Path | None:
    """The Python that has Dynamo: $KVBENCH_DYNAMO_PYTHON or install.sh's cache, if it is there."""
    return installed("KVBENCH_DYNAMO_PYTHON", f"dynamo-{VERSION}/bin/python")


def annotation(max_tokens: int) -> dict[str, Any]:
    """The request field that has a mocker answer with `max_tokens` real tokens (make_model.py
    says why): every body of a run against the deployment `start` made carries it."""
    return {"nvext": {"annotations": [f"output_replay_id:{ANSWER_KEY.format(n=max_tokens)}"]}}


@dataclass(frozen=True)
class Workers:
    """What each mocker worker models (the flags of `python -m dynamo.mocker`)."""

    count: int = 1
    block_size: int = 16
    gpu_blocks: int = 2048  # G1, the device's KV blocks
    host_blocks: int = 0  # G2, the host tier's blocks (0: none)
    host_gbps: float = 32.0  # G2 <-> G1 bandwidth, both ways (GB/s)
    kv_bytes_per_token: int | None = None  # None: the model config's (gpt-oss-120b's, make_model.py)
    profile: Path | None = None  # the times, as `write_profile` writes them (None: the mocker's own)

    def flags(self) -> list[str]:
        out = ["--block-size", str(self.block_size), "--num-gpu-blocks-override", str(self.gpu_blocks)]
        if self.profile is not None:
            out += ["--planner-profile-data", str(self.profile)]
        if self.kv_bytes_per_token is not None:
            out += ["--kv-bytes-per-token", str(self.kv_bytes_per_token)]
        if self.host_blocks:
            out += ["--num-host-blocks", str(self.host_blocks)]
            for way in ("h2d", "d2h"):
                out += [f"--host-offload-{way}-bandwidth-gbps", f"{self.host_gbps:g}"]
        return out


def write_profile(timing: MockerTiming, path: Path, context: int, block_size: int) -> Path:
    """`timing` as the mocker reads a profile of an engine (`--planner-profile-data`: an NPZ of the
    prefill time in ms at prompt lengths, which it interpolates linearly at the tokens a request
    computes, and of the decode time per token in ms on a grid of the KV tokens active and the
    context): a point per block up to `context`, so that between two the b*n^2 term is off by
    b*block_size^2/4 at most; the decode time the same at every corner of its grid."""
    n = np.arange(0, context + block_size, block_size, dtype=np.float64)
    np.savez(
        path,
        prefill_isl=n,
        prefill_ttft_ms=1000.0 * (timing.prefill_a * n + timing.prefill_b * n * n),
        decode_active_kv_tokens=np.array([0.0, float(n[-1])]),
        decode_context_length=np.array([1.0, float(n[-1])]),
        decode_itl=np.full((2, 2), 1000.0 * timing.decode_s_per_token),
    )
    return path


class _Dynamo(ServerProcess):
    """A Dynamo process: its environment keeps everything on loopback and in `home`."""

    def __init__(self, py: Path, home: Path, port: int = 0) -> None:
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
            },
            port,
        )
        self.py = py


class Frontend(_Dynamo):
    name = "dynamo-frontend"

    def __init__(self, py: Path, home: Path, router_mode: str, port: int = 0) -> None:
        super().__init__(py, home, port)
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

    def __init__(
        self, py: Path, model: Path, workers: Workers = Workers(), router_mode: str = "kv", home: Path | None = None
    ) -> None:
        self.py, self.model, self.workers, self.router_mode = py, model, workers, router_mode
        self.frontend: Frontend | None = None
        self.mockers: list[Mocker] = []
        # the processes' HOME and discovery store: `home`, or a folder of its own it removes
        self._own_home: tempfile.TemporaryDirectory[str] | None = None
        if home is None:
            self._own_home = tempfile.TemporaryDirectory(prefix="kvbench-dynamo-")
            home = Path(self._own_home.name)
        self.home = home

    @property
    def base_url(self) -> str:
        assert self.frontend is not None
        return self.frontend.base_url

    def __enter__(self) -> Deployment:
        self.home.mkdir(exist_ok=True)
        try:
            self.frontend = Frontend(self.py, self.home, self.router_mode).__enter__()
            for _ in range(self.workers.count):
                self.mockers.append(Mocker(self.py, self.home, self.model, self.workers).__enter__())
            self._wait_registered()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def restart_workers(self, workers: Workers | None = None, router_mode: str | None = None) -> str:
        """Every mocker stopped and started again (as `workers` says, if given), so that their KV
        caches (G1 and G2) start empty: Dynamo 1.6 offers no other reset for them (the frontend
        has no /clear_kv_blocks and the mocker no such endpoint); and the frontend too, on the
        same port, where `router_mode` changes (its router's view of the caches starts empty with
        them). Returns what it did, for run.json."""
        gone = self._workers_listed()
        for m in reversed(self.mockers):
            m.__exit__(None, None, None)
        self.mockers = []
        self._wait_dropped(gone)
        said = ""
        if router_mode is not None and router_mode != self.router_mode:
            assert self.frontend is not None
            port = self.frontend.port
            self.frontend.__exit__(None, None, None)
            self.router_mode = router_mode
            self.frontend = Frontend(self.py, self.home, router_mode, port).__enter__()
            said = f"; the frontend restarted with router mode {router_mode}"
        self.workers = workers or self.workers
        for _ in range(self.workers.count):
            self.mockers.append(Mocker(self.py, self.home, self.model, self.workers).__enter__())
        self._wait_registered()
        return f"Dynamo's {self.workers.count} mocker worker(s) restarted: their KV caches (G1, G2) start empty{said}"

    def worker_metrics(self) -> dict[str, str]:
        """Each mocker's /metrics (its system port: vLLM-style first-token times and KV usage)."""
        return {f"http://127.0.0.1:{m.port}/metrics": f"mocker-{k}" for k, m in enumerate(self.mockers)}

    def _wait_registered(self) -> None:
        """Until the frontend lists the model and knows every worker's `generate` endpoint."""
        self._wait(
            lambda: self._model_listed() and len(self._workers_listed()) >= self.workers.count,
            f"list model {SERVED_NAME!r} with {self.workers.count} worker(s)",
        )

    def _wait_dropped(self, gone: frozenset[int]) -> None:
        """Until the frontend has dropped the stopped workers `gone` and, with the last of them, the
        model (it removes a model with its last worker's card: its log says so). The new workers
        register only then, so that no removal of an old worker's card comes after them: once, on
        a busy host, an arm's requests after such a restart were answered 404 from the sixth on,
        the model gone while its new worker was listed."""
        self._wait(
            lambda: not self._model_listed() and not self._workers_listed() & gone,
            f"drop model {SERVED_NAME!r} and its stopped worker(s)",
        )

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if done():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"dynamo: the frontend did not {what} within {READY_TIMEOUT_S:g} s")

    def _model_listed(self) -> bool:
        with urllib.request.urlopen(self.base_url + "/models", timeout=5) as r:
            return any(m.get("id") == SERVED_NAME for m in json.loads(r.read()).get("data", []))

    def _workers_listed(self) -> frozenset[int]:
        """The instance ids of the workers whose `generate` endpoint the frontend knows."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/health", timeout=5) as r:
            instances = json.loads(r.read()).get("instances", [])
        return frozenset(i["instance_id"] for i in instances if i.get("endpoint") == "generate")

    def __exit__(self, *_exc: object) -> None:
        for m in reversed(self.mockers):
            m.__exit__(None, None, None)
        if self.frontend is not None:
            self.frontend.__exit__(None, None, None)
        if self._own_home is not None:
            self._own_home.cleanup()


def make_model(py: Path, out: Path, answer_lengths: Collection[int], where: str) -> None:
    """The model directory make_model.py writes, with an answer for every length asked for."""
    from harness.core.errors import EndpointError

    if not MAKE_MODEL.is_file():
        raise EndpointError(
            f'{where}: [engine] kind = "dynamo": {MAKE_MODEL} is not here: run kvbench from its source '
            "checkout (pip install -e .), whose engines/ folder makes Dynamo's model"
        )
    lengths = ",".join(str(n) for n in sorted(set(answer_lengths)))
    try:
        subprocess.run(
            [str(py), str(MAKE_MODEL), str(out), "--answers", lengths],
            check=True,
            timeout=300,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as e:
        raise EndpointError(f"{where}: [engine]: making Dynamo's model failed: {e.stderr[-1500:]}") from None
    except subprocess.TimeoutExpired:
        raise EndpointError(f"{where}: [engine]: making Dynamo's model took over 300 s") from None


def version(py: Path) -> str:
    """The ai-dynamo release `py` has, as its package metadata says."""
    code = "import importlib.metadata as m; print(m.version('ai-dynamo'))"
    try:
        got = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return got.stdout.strip() or f"unknown ({got.stderr.strip()[-200:]})"


@contextlib.contextmanager
def start(cfg: DynamoEngineCfg, where: str, answer_lengths: Collection[int]) -> Iterator[Started]:
    """A frontend and `cfg.workers` mockers as the scenario's `[engine]` says, serving a model made
    here with an answer for every length in `answer_lengths`; every process stopped by PID and the
    model removed on the way out, whatever happens."""
    from harness.core.errors import EndpointError

    py = python()
    if py is None:
        raise EndpointError(
            f'{where}: [engine] kind = "dynamo": Dynamo is not installed here: run engines/dynamo/install.sh '
            "(or set KVBENCH_DYNAMO_PYTHON to a Python that has ai-dynamo)"
        )
    timing, source = _resolved(cfg.timing, where)  # (a fit refused before anything is started)
    with tempfile.TemporaryDirectory(prefix=ENGINE_PREFIX) as tmp:
        model = Path(tmp) / SERVED_NAME
        make_model(py, model, answer_lengths, where)
        profile = None
        if timing is not None:
            profile = write_profile(timing, Path(tmp) / "timing.npz", cfg.context.tokens, cfg.block_size)
        deployment = Deployment(py, model, _workers(cfg, profile), cfg.router_mode, home=Path(tmp) / "home")
        try:
            deployment.__enter__()
        except RuntimeError as e:
            raise EndpointError(f"{where}: [engine]: {e}") from None
        assert deployment.frontend is not None
        started = Started(
            deployment.base_url,
            info={
                "kind": "dynamo",
                "started_by": "kvbench",
                "version": version(py),
                "model": {
                    "made": SERVED_NAME,
                    "kv_bytes_per_token": cfg.kv_bytes_per_token,
                    "context_tokens": cfg.context.tokens,
                    "answer_lengths": sorted(set(answer_lengths)),
                },
                "workers": cfg.workers,
                "router_mode": cfg.router_mode,
                "tiers": _tiers(cfg),
                "timing": _timing(timing, source),
                "flags": {
                    "frontend": _shown(deployment.frontend.argv, model),
                    "mocker": _shown(deployment.mockers[0].argv, model),
                },
            },
            tokenizer=str(model),
            body_fields=annotation,
            metrics_urls=deployment.worker_metrics(),
        )

        def reset(arm: EngineCfg | None) -> str:
            """Before an arm: the workers restarted, as the arm's config says (or the run's)."""
            own = arm if isinstance(arm, DynamoEngineCfg) else cfg
            try:
                said = deployment.restart_workers(_workers(own, profile), own.router_mode)
            except (RuntimeError, OSError, ValueError) as e:
                raise EndpointError(f"{where}: [engine]: restarting Dynamo's workers before an arm: {e}") from None
            assert deployment.frontend is not None
            started.info["router_mode"] = own.router_mode
            started.info["flags"]["frontend"] = _shown(deployment.frontend.argv, model)
            started.info["flags"]["mocker"] = _shown(deployment.mockers[0].argv, model)
            started.info["tiers"] = _tiers(own)
            started.metrics_urls = deployment.worker_metrics()
            return said

        started.reset = reset
        try:
            yield started
        finally:
            deployment.__exit__(None, None, None)


def _tiers(cfg: DynamoEngineCfg) -> dict[str, Any]:
    """run.json's `engine.tiers`: each worker's KV tiers as the mocker models them."""
    g2 = {"blocks": cfg.g2_blocks, "bandwidth": cfg.g2_bandwidth} if cfg.g2_blocks else None
    return {"block_size": cfg.block_size, "g1": {"blocks": cfg.g1_blocks}, "g2": g2}


def _resolved(timing: MockerTiming | FittedTiming | None, where: str) -> tuple[MockerTiming | None, str]:
    """`[engine] timing` as numbers (a fit made now, where it asks for one), and where they came
    from."""
    if not isinstance(timing, FittedTiming):
        return timing, "[engine] timing" if timing is not None else "the mocker's built-in polynomials"
    from harness.core.errors import InputError
    from harness.sizing.recorded import fitted_cost

    try:
        fit = fitted_cost(Path(timing.fit_from))
    except InputError as e:
        raise InputError(f"{where}: engine.timing.fit_from: {e}") from None
    return MockerTiming(fit.prefill_a, fit.prefill_b, fit.decode_s_per_token), f"[engine] timing, {fit.said}"


def _timing(timing: MockerTiming | None, source: str) -> dict[str, Any]:
    """run.json's `engine.timing`: what timed the mocker's requests, and where it came from."""
    if timing is None:
        return {"model": source}
    return {
        "model": "a*n + b*n^2 s for the n prompt tokens computed, d s an output token after the first",
        "source": source,
        **{k: getattr(timing, k) for k in timing.keys},
    }


def _workers(cfg: DynamoEngineCfg, profile: Path | None) -> Workers:
    return Workers(
        count=cfg.workers,
        block_size=cfg.block_size,
        gpu_blocks=cfg.g1_blocks,
        host_blocks=cfg.g2_blocks,
        host_gbps=cfg.g2_bytes_per_s / 1e9,
        kv_bytes_per_token=cfg.kv_bytes_per_token,
        profile=profile,
    )


def _shown(argv: list[str], model: Path) -> list[str]:
    """A process's flags for run.json: the module and flags, the files in the temporary folder
    of the model (the model's, and the timing profile) by their names there."""
    return [a.replace(str(model.parent) + os.sep, "") for a in argv[1:]]
