"""kvbench against a real engine: llama.cpp's llama-server (built by engines/llamacpp/build.sh,
which .ci/run runs) with a tiny random-weight model made here. Timing on shared 2-core machines
is noisy: these tests check cached tokens, lengths and ratios, never absolute latencies."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engines.llamacpp import LlamaServer, binary
from harness.engines.models import make as make_model
from harness.report.build import render
from harness.results import load_runs, read_requests
from harness.server.checks import COLD_START_TOKENS
from tests.browser import assert_clean, inspect_page
from tests.conftest import arm_folders, interrupt, kvbench, other_warnings, write_scenario

SERVER = binary()
pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        SERVER is None, reason="llama-server is not built here: run engines/llamacpp/build.sh (.ci/run does)"
    ),
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    assert SERVER is not None
    tmp = tmp_path_factory.mktemp("llama")
    make_model(tmp / "tiny.gguf")
    with LlamaServer(SERVER, tmp / "tiny.gguf", parallel=4, ctx_per_slot=8192, slot_dir=tmp / "slots") as srv:
        yield srv
    assert srv.proc is None  # stopped by PID


def test_sweep_cold_warm_and_exact_lengths(llama: LlamaServer, tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "s.toml",
        """
name = "llama-sweep"
[endpoint]
max_tokens = 2
[workload]
kind = "sweep"
lengths = [1000, 4000]
repetitions = 2
warm_repeats = 2
""",
    )
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "out", "llama-sweep").values()
    meta = json.loads((folder / "run.json").read_text())
    assert meta["prompt_counting"] == "server /tokenize (llama.cpp format)" and meta["emulated"] is False
    assert meta["warm_rule"]["block_tokens"] == 1  # llama.cpp caches a prefix of any length
    recs = read_requests(folder)
    assert len(recs) == 2 * 2 * 3 and all(x.ok for x in recs)
    for x in recs:
        assert abs(x.prompt_tokens - x.target_tokens) <= 0.005 * x.target_tokens
        if x.phase == "cold":
            assert x.cached_tokens == 0
        else:
            assert x.cached_tokens >= 0.95 * x.prompt_tokens
    cold = sorted(x.ttft_s for x in recs if x.phase == "cold" and x.target_tokens == 4000)
    warm = sorted(x.ttft_s for x in recs if x.phase == "warm" and x.target_tokens == 4000)
    assert warm[len(warm) // 2] < 0.5 * cold[0]  # a ratio within one run, not an absolute time
    server = json.loads((folder / "metrics.json").read_text())
    assert server["phases"]["warm"]["server_hit_ratio"] > 0.9
    assert server["phases"]["cold"]["server_hit_ratio"] < 0.1
    assert meta["server_metrics"]["verdict"].startswith("warm requests hit the cache")


def test_closed_loop_both_arms_bust_never_hits(llama: LlamaServer, tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "c.toml",
        """
name = "llama-loop"
[endpoint]
max_tokens = 4
[workload]
kind = "closed_loop"
requests = 16
concurrency = 3
pool = 4
prompt_tokens = 1500
[[arms]]
name = "bust"
cache = "bust"
[[arms]]
name = "reuse"
""",
    )
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    arms = arm_folders(tmp_path / "out", "llama-loop")
    bust, reuse = read_requests(arms["bust"]), read_requests(arms["reuse"])
    assert len(bust) == len(reuse) == 16 and all(x.ok for x in bust + reuse)
    assert all(x.cached_tokens == 0 for x in bust)
    # llama.cpp keeps a prompt's KV in the slot that computed it: a repeat finds it unless the same
    # prompt is in flight on that slot at the time, which a pool of 4 over 3 connections often is.
    first_uses = {x.prompt_id: min(y.start_s for y in reuse if y.prompt_id == x.prompt_id) for x in reuse}
    assert all(x.cached_tokens < 64 for x in reuse if x.start_s == first_uses[x.prompt_id])
    assert sum(x.cached_tokens > 0.9 * x.prompt_tokens for x in reuse) >= 4
    loop = json.loads((arms["bust"] / "metrics.json").read_text())["phases"]["run"]
    assert loop["server_hit_ratio"] < 0.1


def test_open_loop_at_two_rates_records_goodput(llama: LlamaServer, tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "s.toml",
        """
name = "llama-open"
[endpoint]
max_tokens = 4
[workload]
kind = "open_loop"
arrivals = "poisson"
rates = [1.0, 3.0]
requests = 12
warmup_requests = 1
pool = 4
prompt_tokens = 600
[slo]
ttft_s = 30.0
e2e_s = 60.0
""",
    )
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    found = arm_folders(tmp_path / "out", "llama-open")
    assert sorted(found) == ["default-r1", "default-r3"]
    for name, rate in (("default-r1", 1.0), ("default-r3", 3.0)):
        meta = json.loads((found[name] / "run.json").read_text())
        assert meta["load"] == {"mode": "rate", "rate": rate, "index": 0 if rate == 1.0 else 1}
        slo = meta["summary"]["slo"]
        assert slo["requests"] == 12 and slo["met"] == 12 and slo["goodput_req_per_s"] > 0
        recs = read_requests(found[name])
        assert sorted(x.schedule_index for x in recs) == list(range(13))
        assert all(x.ok and x.intended_s is not None for x in recs)
    doc = json.loads(next((tmp_path / "out" / "llama-open").glob("*-capacity.json")).read_text())
    (arm,) = doc["arms"]
    assert arm["capacity_at_slo"]["bound"] == "at_least" and arm["capacity_at_slo"]["req_per_s"] == 3.0


def test_trace_requests_sharing_hash_ids_find_those_blocks_cached(llama: LlamaServer, tmp_path: Path) -> None:
    block = 256
    # (hash_ids, full blocks an earlier request held): each request's last block is partial, so
    # block 3 of the first is never whole and the last request shares two
    rows = [([1, 2, 3], 0), ([1, 2, 4], 2), ([5, 6], 0), ([1, 2, 3, 7], 2)]
    (tmp_path / "t.jsonl").write_text(
        "".join(
            json.dumps({"timestamp": 10 * k, "input_length": len(ids) * block - 3, "output_length": 2, "hash_ids": ids})
            + "\n"
            for k, (ids, _) in enumerate(rows)
        )
    )
    sc = write_scenario(
        tmp_path / "s.toml",
        f"""
name = "llama-trace"
[workload]
kind = "trace"
path = "{tmp_path / "t.jsonl"}"
block_tokens = {block}
concurrency = 1
""",
    )
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "out", "llama-trace").values()
    recs = {x.prompt_id: x for x in read_requests(folder)}
    for k, (_ids, shared) in enumerate(rows):
        x = recs[f"t{k + 1}"]
        assert x.ok and x.prompt_tokens == x.target_tokens, x
        # the shared blocks (and the chat template's opening before them) come from cache
        assert (x.cached_tokens or 0) >= shared * block, (k, x.cached_tokens)


SESSIONS = """
name = "{name}"
[workload]
kind = "sessions"
users = 2
turns = 3
think_s = 0.2
system_prompt_tokens = 200
user_context_tokens = 600
message_tokens = 30
answer_tokens = {answer}
{extra}"""


def test_sessions_later_turns_find_their_history_cached(llama: LlamaServer, tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "s.toml", SESSIONS.format(name="llama-sessions", answer=4, extra=""))
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "out", "llama-sessions").values()
    by = {(x.session, x.turn): x for x in read_requests(folder)}
    assert len(by) == 6
    for (u, k), x in by.items():
        assert x.ok and x.prompt_tokens == x.target_tokens, x
        if k > 1:  # the history sent before, but for the chat template's closing, is cached
            assert (x.cached_tokens or 0) >= by[(u, k - 1)].prompt_tokens - 32, (u, k, x.cached_tokens)


def test_sessions_with_real_history_resend_the_engines_answers(llama: LlamaServer, tmp_path: Path) -> None:
    extra = 'history = "real"\n[endpoint]\napi = "completions"\n'
    sc = write_scenario(tmp_path / "s.toml", SESSIONS.format(name="llama-real", answer=8, extra=extra))
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "out", "llama-real").values()
    by = {(x.session, x.turn): x for x in read_requests(folder)}
    assert len(by) == 6 and all(x.ok and x.prompt_tokens for x in by.values())
    grown = []
    for (u, k), x in by.items():
        if k > 1:
            prev = by[(u, k - 1)]
            assert x.target_tokens is None and prev.prompt_tokens and x.prompt_tokens
            grown.append(x.prompt_tokens - prev.prompt_tokens - 30)  # the answer's tokens, as text
            assert (x.cached_tokens or 0) >= prev.prompt_tokens - 1, (u, k, x.cached_tokens)
    print("answer tokens resent", grown, [(x.cached_tokens, x.prompt_tokens) for x in by.values()])
    assert sum(grown) > 0


TIERS = """
name = "llama-tiers"
[endpoint]
api = "completions"
max_tokens = 2
[workload]
kind = "sweep"
lengths = [1000, 3000]
repetitions = 1
warm_repeats = 2
"""


@pytest.fixture(scope="module")
def tier_runs(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A sweep whose warm requests come back from the slot's neighbour tiers: host memory, disk."""
    assert llama.slot_dir is not None
    tmp = tmp_path_factory.mktemp("tiers")
    arms = f"""
[[arms]]
name = "cold"
cache = "bust"
[[arms]]
name = "host"
warm_from = "host"
[[arms]]
name = "disk"
warm_from = "disk"
slot_dir = "{llama.slot_dir}"
"""
    sc = write_scenario(tmp / "t.toml", TIERS + arms)
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    return tmp / "out", r.stderr


def test_warm_requests_come_back_from_host_memory_and_from_disk(
    llama: LlamaServer, tier_runs: tuple[Path, str]
) -> None:
    out, stderr = tier_runs
    got = arm_folders(out, "llama-tiers")
    for arm, folder in got.items():
        assert other_warnings(json.loads((folder / "run.json").read_text())) == [], stderr
        for x in read_requests(folder):
            assert x.ok and x.prompt_tokens and x.cached_tokens is not None
            if x.phase == "cold":
                assert x.cached_tokens <= COLD_START_TOKENS and x.warm_from is None
                continue
            assert x.warm_from == arm and x.cached_tokens >= x.prompt_tokens - 1  # nothing recomputed
            if arm == "host":
                assert x.restore_tokens is None
            else:  # the whole prompt read back from its file, as the engine reports it
                assert x.restore_tokens is not None and x.restore_tokens >= x.prompt_tokens
                assert x.restore_bytes and x.restore_bytes > 100 * x.prompt_tokens and x.restore_s is not None
    meta = json.loads((got["disk"] / "run.json").read_text())
    tiers = meta["tiers"]
    assert tiers["warm_from"] == "disk" and tiers["page_cache"].startswith("dropped")
    assert [s["prompt_id"] for s in tiers["saves"]] == ["L1000-r0", "L3000-r0"]
    assert all(s["bytes"] > 0 for s in tiers["saves"])
    if shutil.which("fio"):  # the directory's read bandwidth as fio measures it, beside the restores'
        assert tiers["fio_read"]["bytes_per_s"] > 0, tiers["fio_read"]
    assert llama.slot_dir is not None and not list(llama.slot_dir.iterdir())  # its slot files are gone


def test_a_disk_arm_headlines_ttft_with_its_restore(tier_runs: tuple[Path, str], tmp_path: Path) -> None:
    """Issue 37: the disk arm's warm TTFT and speedup include the restore kvbench performed before
    each warm request, in run.json, the terminal, the report, the gate, and as the restore
    table's "with restore" column; the request alone stays under its own name."""
    import numpy as np

    from harness.analysis.findings import restores
    from harness.analysis.stats import RESTORE_NOTE
    from harness.gate.figures import run_level

    out, stderr = tier_runs
    folder = arm_folders(out, "llama-tiers")["disk"]
    records = read_requests(folder)
    meta = json.loads((folder / "run.json").read_text())
    assert meta["summary"]["ttft_includes_restore"] is True
    (run,) = load_runs([folder])
    gate = run_level(run)
    table = {row["length"]: row for row in restores(records)["rows"]}  # type: ignore[index]
    for row in meta["summary"]["by_length"]:
        at = [x for x in records if x.target_tokens == row["length"] and x.ok]
        cold = float(np.median([x.ttft_s for x in at if x.phase == "cold"]))
        warm = [x for x in at if x.phase == "warm"]
        whole = float(np.median([(x.ttft_s or 0) + (x.restore_s or 0) for x in warm]))
        assert row["warm_ttft_p50_s"] == pytest.approx(whole) and row["speedup"] == pytest.approx(cold / whole)
        assert row["warm_request_ttft_p50_s"] == pytest.approx(float(np.median([x.ttft_s for x in warm])))
        assert table[row["length"]]["with_restore_s_p50"] == pytest.approx(whole)
        assert gate[("speedup", row["length"])] == pytest.approx(cold / whole)
        assert f"{row['speedup']:.1f}x" in stderr  # the terminal's table
    assert RESTORE_NOTE in " ".join(stderr.split())
    html = render(load_runs([folder]), tmp_path / "r.html").read_text()
    assert "Warm TTFT here includes the restore" in html and "(restore included)" in html


def test_real_tier_runs_in_a_real_browser(tier_runs: tuple[Path, str], tmp_path: Path, browser: str) -> None:
    out, _ = tier_runs
    page = render(load_runs([out / "llama-tiers"]), tmp_path / "r.html")
    html = page.read_text()
    assert "Restores from disk, as the engine reported them" in html and "a real engine and real storage" in html
    assert "Page cache: dropped before each restore" in html and "host-memory prompt cache" in html
    assert "fio on the same directory" in html or not shutil.which("fio")
    assert_clean(asyncio.run(inspect_page(browser, page.as_uri())), page)


def test_with_no_host_cache_a_pushed_out_prompt_is_recomputed(tmp_path: Path) -> None:
    """The other side of "host": what the step does is push the prompt out of its slot."""
    assert SERVER is not None
    make_model(tmp_path / "tiny.gguf")
    with LlamaServer(SERVER, tmp_path / "tiny.gguf", parallel=1, cache_ram_mib=0) as srv:
        sc = write_scenario(tmp_path / "t.toml", TIERS + '[[arms]]\nname = "host"\nwarm_from = "host"\n')
        r = kvbench("run", str(sc), "--endpoint", srv.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "meant to be warm" in r.stderr
    (folder,) = arm_folders(tmp_path / "out", "llama-tiers").values()
    warm = [x for x in read_requests(folder) if x.phase == "warm"]
    assert len(warm) == 4 and all((x.cached_tokens or 0) <= COLD_START_TOKENS for x in warm)


def test_a_disk_arm_on_an_engine_without_slot_saving_says_how_to_start_it(tmp_path: Path) -> None:
    assert SERVER is not None
    make_model(tmp_path / "tiny.gguf")
    with LlamaServer(SERVER, tmp_path / "tiny.gguf", parallel=1) as srv:
        sc = write_scenario(tmp_path / "t.toml", TIERS + '[[arms]]\nname = "disk"\nwarm_from = "disk"\n')
        r = kvbench("run", str(sc), "--endpoint", srv.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 3 and "--slot-save-path" in r.stderr and "Traceback" not in r.stderr, r.stderr
    (folder,) = arm_folders(tmp_path / "out", "llama-tiers").values()
    assert json.loads((folder / "run.json").read_text())["status"] == "failed"


def engine_processes() -> list[str]:
    """Command lines of llama-servers that kvbench started for a scenario's [engine] (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"llama-server") and any(b"kvbench-engine-" in a for a in args):
            out.append(b" ".join(args).decode(errors="replace"))
    return out


ENGINE = """
name = "eng"
[engine]
kind = "llamacpp"
model = "tiny"
cache_ram_mib = 0
[endpoint]
api = "completions"
max_tokens = 2
[workload]
kind = "sweep"
lengths = [2000, 6000]
repetitions = {reps}
warm_repeats = 2
[[arms]]
name = "cold"
cache = "bust"
[[arms]]
name = "disk"
warm_from = "disk"
"""


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (.ci/run installs it with apt-get)")
def test_kvbench_starts_the_engine_measures_disk_under_fio_and_stops_it(tmp_path: Path) -> None:
    traffic = f'[traffic]\ntool = "fio"\ntarget = "20MB/s"\nrw = "write"\ndirectory = "{tmp_path / "fio"}"\n'
    traffic += "file_size = 16777216\nstart_before_s = 0.5\n"
    sc = write_scenario(tmp_path / "e.toml", ENGINE.format(reps=1) + traffic)
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "starting llama.cpp's llama-server" in r.stdout + r.stderr
    got = arm_folders(tmp_path / "out", "eng")
    meta = json.loads((got["disk"] / "run.json").read_text())
    engine = meta["engine"]
    assert engine["kind"] == "llamacpp" and engine["started_by"] == "kvbench" and engine["version"] != "unknown"
    assert engine["model"]["made"] == "tiny" and "--cache-ram" in engine["flags"] and meta["emulated"] is False
    # its slot files were where kvbench could drop them from the page cache
    assert meta["tiers"]["page_cache"].startswith("dropped")
    warm = [x for x in read_requests(got["disk"]) if x.phase == "warm"]
    assert len(warm) == 4 and all(x.restore_tokens and x.restore_tokens >= (x.prompt_tokens or 0) for x in warm)
    assert meta["traffic"]["tool"] == "fio" and meta["traffic"]["achieved_bytes_per_s"] > 0
    assert engine_processes() == []


def test_sigterm_stops_the_engine_kvbench_started(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "e.toml", ENGINE.format(reps=50))
    out = tmp_path / "out"

    def ready() -> bool:
        return any(p.stat().st_size > 0 for p in out.glob("eng/*/requests.jsonl"))

    code, err = interrupt(["run", str(sc), "--out", str(out)], ready, sig=signal.SIGTERM)
    assert code == 130, err
    assert engine_processes() == []
    assert not list(Path(tempfile.gettempdir()).glob("kvbench-engine-*"))  # its model and slot files


def test_a_closed_loop_from_disk_restores_every_prompt_it_computed_before(llama: LlamaServer, tmp_path: Path) -> None:
    assert llama.slot_dir is not None
    sc = write_scenario(
        tmp_path / "c.toml",
        f"""
name = "llama-loop-disk"
[endpoint]
api = "completions"
max_tokens = 2
[workload]
kind = "closed_loop"
requests = 16
concurrency = 2
pool = 5
prompt_tokens = 1500
[[arms]]
name = "recompute"
cache = "bust"
[[arms]]
name = "disk"
warm_from = "disk"
slot_dir = "{llama.slot_dir}"
""",
    )
    r = kvbench("run", str(sc), "--endpoint", llama.base_url, "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    got = arm_folders(tmp_path / "out", "llama-loop-disk")
    assert all((x.cached_tokens or 0) <= COLD_START_TOKENS for x in read_requests(got["recompute"]))
    recs = sorted(read_requests(got["disk"]), key=lambda x: x.start_s)
    assert len(recs) == 16 and all(x.ok for x in recs)
    computed: set[str] = set()
    for x in recs:
        if x.warm_from is None:  # a prompt's first request (or one racing it on the other connection)
            assert (x.cached_tokens or 0) <= COLD_START_TOKENS and x.worker in (0, 1)
            computed.add(x.prompt_id)
        else:  # restored into its connection's slot from the file of the prompt's first request
            assert x.warm_from == "disk" and x.prompt_id in computed and x.prompt_tokens
            assert (x.restore_tokens or 0) >= x.prompt_tokens and (x.cached_tokens or 0) >= x.prompt_tokens - 1
    assert sum(x.warm_from == "disk" for x in recs) >= 16 - 5 - 2
    tiers = json.loads((got["disk"] / "run.json").read_text())["tiers"]
    assert tiers["slots"] == [0, 1] and {s["prompt_id"] for s in tiers["saves"]} == computed
    assert not list(llama.slot_dir.iterdir())
    html = render(load_runs([tmp_path / "out" / "llama-loop-disk"]), tmp_path / "r.html").read_text()
    assert "each connection kept to a slot of its own (llama.cpp, slots 0, 1)" in html
    assert "Restores from disk, as the engine reported them" in html


def test_serve_py_stopped_with_sigterm_leaves_no_server_and_no_folder(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "engines" / "llamacpp" / "serve.py"), "--parallel", "1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.stdout is not None
    with proc.stdout:
        url = proc.stdout.readline().strip()  # printed once the server answers /health
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # nobody listens there any more
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # the model's folder is gone
