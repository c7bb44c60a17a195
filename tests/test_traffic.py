"""Competing traffic: fio's JSON parsed (local and client mode), real fio runs next to the
emulator, fio's client/server mode on loopback, safety rules, and the emulated drop."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config.traffic import TrafficCfg
from harness.core import children
from harness.core.clock import ModelClock
from harness.core.errors import InputError
from harness.core.units import parse_bandwidth, parse_size
from harness.engines.process import free_port
from harness.traffic.base import TrafficResult, cleanup_directory, prepare_directory
from harness.traffic.fio import FioDriver, job_file, json_objects, snapshots, timeline
from tests.conftest import ROOT, cli, kvbench, write_scenario

GOLDEN = Path(__file__).parent / "golden"
FIO = shutil.which("fio")
needs_fio = pytest.mark.skipif(FIO is None, reason="fio is not installed (.ci/run installs it with apt-get)")


def test_units() -> None:
    assert parse_bandwidth("200GB/s") == 200e9
    assert parse_bandwidth("50 MiB/s") == 50 * 2**20
    assert parse_size("1M") == parse_size("1MiB") == 2**20
    assert parse_size("1MB") == 1e6
    for bad in ("fast", "200GB", "-1MB/s"):
        with pytest.raises(ValueError):
            parse_bandwidth(bad)


@pytest.mark.parametrize("name", ["fio-local-status-interval.json", "fio-client-mode.json"])
def test_parse_recorded_fio_output(name: str) -> None:
    # Two jobs at rate=10M for 3 s, status every second (local: one JSON object per interval;
    # client mode: every interval in one client_stats list, with an "All clients" summary).
    objects = json_objects((GOLDEN / name).read_text())
    assert len(objects) == (4 if "local" in name else 1)
    snaps = snapshots(objects, numjobs=1)
    assert len({job for _, job, *_ in snaps}) == 2 and len(snaps) == 8
    rows, totals = timeline(snaps, offset_s=-1.0)
    assert [r["t_s"] for r in rows] == [-1.0, 0.0, 1.0]
    for r in rows:
        assert r["write_bps"] == pytest.approx(2 * 10 * 2**20, rel=0.05) and r["read_bps"] == 0
    (client,) = totals
    assert client == ("local" if "local" in name else "127.0.0.1:8799")
    assert totals[client]["write_bytes"] == 2 * 30 * 2**20 and totals[client]["seconds"] == 3.0


def test_text_between_json_objects_is_skipped() -> None:
    text = 'fio: terminating on signal 2\n{"jobs": []}\nnoise {broken\n{"jobs": [{"jobname": "a"}]}'
    assert len(json_objects(text)) == 2


def test_numjobs_clones_are_told_apart() -> None:
    job = {"jobname": "kvbench-traffic", "job_runtime": 1000, "read": {"io_bytes": 100}, "write": {"io_bytes": 0}}
    snaps = snapshots([{"jobs": [job, job, job]}], numjobs=3)
    assert len({j for _, j, *_ in snaps}) == 3


def test_job_file_splits_the_target() -> None:
    cfg = TrafficCfg(
        tool="fio",
        target_bytes_per_s=200e9,
        clients=("a", "b", "c", "d"),
        jobs_per_client=8,
        directory="/gpfs",
        rw="randrw",
        rwmixread=70,
    )
    text = job_file(cfg, "/gpfs/x")
    assert "numjobs=8" in text and "directory=/gpfs/x" in text and "unlink=1" in text
    per_job = int(200e9 / 32)
    assert f"rate={per_job * 70 // 100},{per_job * 30 // 100}" in text


@pytest.mark.parametrize("path", ["/", "/dev", "/dev/null", "/proc/self", "/sys", "/usr/lib"])
def test_refuses_system_paths(path: str) -> None:
    with pytest.raises(InputError, match="refusing"):
        prepare_directory(path, allow_nonempty=True, run_name="x")


def test_refuses_a_nonempty_directory_it_did_not_create(tmp_path: Path) -> None:
    (tmp_path / "precious.dat").write_text("data")
    with pytest.raises(InputError, match="not empty and kvbench did not create it"):
        prepare_directory(str(tmp_path), allow_nonempty=False, run_name="x")
    work, created = prepare_directory(str(tmp_path), allow_nonempty=True, run_name="x")
    assert work.parent == tmp_path and created == []


def test_achieved_below_90_percent_is_flagged() -> None:
    res = TrafficResult("fio", {}, 100e6, [{"t_s": 0, "client": "a", "read_bps": 50e6, "write_bps": 0.0}])
    assert res.check() is not None and "did not apply the load" in str(res.check())
    res.timeline[0]["read_bps"] = 95e6
    assert res.check() is None


def fio_processes(under: Path) -> list[str]:
    """Command lines of running fio processes started by kvbench for a run under `under` (its job
    file is there: other tests' fio, run beside this one, are not this one's), from /proc."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"traffic-fio.job") and str(under).encode() in a for a in args):
            found.append(b" ".join(args).decode(errors="replace"))
    return found


TRAFFIC_SWEEP = """
name = "io"
[endpoint]
max_tokens = 1
[workload]
kind = "sweep"
lengths = [4000, 8000, 16000]
repetitions = 3
warm_repeats = 2
[traffic]
tool = "{tool}"
target = "{target}"
rw = "write"
block_size = "256KiB"
jobs_per_client = 2
direct = false
file_size = "16MiB"
directory = "{directory}"
start_before_s = 1.0
[emulator]
time_scale = 1.0
"""


@needs_fio
@pytest.mark.parametrize("tool", ["fio", "builtin"])
def test_real_local_traffic_beside_an_emulator_run(tmp_path: Path, tool: str) -> None:
    storage = tmp_path / "storage"
    sc = write_scenario(tmp_path / "io.toml", TRAFFIC_SWEEP.format(tool=tool, target="40MB/s", directory=storage))
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (folder,) = (tmp_path / "out" / "io").iterdir()
    doc = json.loads((folder / "traffic.json").read_text())
    assert doc["tool"] == tool and doc["target_bytes_per_s"] == 40e6
    assert 0.8 < doc["achieved_share"] < 1.2, doc
    rows = [json.loads(line) for line in (folder / "traffic.jsonl").read_text().splitlines()]
    assert len(rows) >= 3 and rows[0]["t_s"] < 0.5  # it started before the measured run
    total = sum(v["write_bytes"] for v in doc["per_client"].values())
    assert total > 40e6
    meta = json.loads((folder / "run.json").read_text())
    assert meta["traffic"]["achieved_bytes_per_s"] == pytest.approx(doc["achieved_bytes_per_s"])
    assert not storage.exists()  # kvbench created it, so it removed it
    assert fio_processes(tmp_path) == []


@needs_fio
def test_unreachable_target_is_warned(tmp_path: Path) -> None:
    # fio writes as fast as it can for as long as the run lasts: one length, two repetitions
    body = TRAFFIC_SWEEP.format(tool="fio", target="400GB/s", directory=tmp_path / "s")
    body = body.replace("lengths = [4000, 8000, 16000]", "lengths = [4000]")
    body = body.replace("repetitions = 3", "repetitions = 2")
    sc = write_scenario(tmp_path / "io.toml", body)
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "did not apply the load it claims" in r.stderr
    (folder,) = (tmp_path / "out" / "io").iterdir()
    assert any("did not apply" in w for w in json.loads((folder / "run.json").read_text())["warnings"])


@needs_fio
def test_fio_client_server_mode_on_loopback(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [FIO or "fio", f"--server=ip:127.0.0.1,{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(0.5)
        storage = tmp_path / "remote"
        storage.mkdir()
        cfg = TrafficCfg(
            tool="fio",
            target_bytes_per_s=20e6,
            rw="write",
            block_size=1 << 18,
            jobs_per_client=2,
            direct=False,
            file_size=8 << 20,
            directory=str(storage),
            clients=(f"127.0.0.1:{port}",),
        )

        async def go() -> TrafficResult:
            d = FioDriver(cfg, tmp_path, "cs")
            await d.start()
            await asyncio.sleep(3.5)
            return await d.stop(ModelClock().start())

        res = asyncio.run(go())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    assert list(res.totals) == [f"127.0.0.1:{port}"]
    assert res.totals[f"127.0.0.1:{port}"]["write_bytes"] > 30e6
    achieved = res.achieved_bytes_per_s()
    assert achieved is not None and 0.8 * 20e6 < achieved < 1.2 * 20e6
    assert "client_stats" in (tmp_path / "traffic-fio.json").read_text()
    assert list(storage.iterdir()) == []  # unlink=1: the server removed its files


@needs_fio
def test_ctrl_c_stops_fio_and_cleans_up(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    body = TRAFFIC_SWEEP.format(tool="fio", target="20MB/s", directory=storage).replace(
        "lengths = [4000, 8000, 16000]", "lengths = [100000, 120000]"
    )
    sc = write_scenario(tmp_path / "io.toml", body)
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(sc), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not fio_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    if not fio_processes(tmp_path):
        proc.kill()
        pytest.fail(f"fio never started: {proc.communicate()[1][-2000:]}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert fio_processes(tmp_path) == [] and not storage.exists()
    (folder,) = (tmp_path / "out" / "io").iterdir()
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    assert (folder / "traffic.json").exists()


def test_emulated_traffic_shows_a_drop(tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "t.toml",
        """
name = "t"
[endpoint]
max_tokens = 8
[workload]
kind = "closed_loop"
requests = 60
concurrency = 12
pool = 30
prompt_tokens = 30000
shared_prefix_tokens = 29000
[[arms]]
name = "clean"
traffic = false
[[arms]]
name = "traffic"
[traffic]
tool = "emulated"
target = "205GB/s"
start_before_s = 1.0
[emulator]
time_scale = 10.0
""",
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "Competing traffic:" in r.stderr and "a drop of" in r.stderr
    folders = {p.name.split("-", 1)[1]: p for p in (tmp_path / "out" / "t").iterdir()}
    assert not (folders["clean"] / "traffic.json").exists()
    doc = json.loads((folders["traffic"] / "traffic.json").read_text())
    assert doc["emulated"] is True and doc["achieved_share"] == pytest.approx(1.0)
    clean = json.loads((folders["clean"] / "run.json").read_text())["summary"]["req_per_s"]
    loaded = json.loads((folders["traffic"] / "run.json").read_text())["summary"]["req_per_s"]
    assert loaded < 0.95 * clean


@pytest.mark.parametrize(
    ("directory", "extra", "message"),
    [
        ("/mnt/x\nexec_prerun=touch /tmp/owned", "", "expected letters, digits and / . _ + @ % = - only"),
        ("/mnt/x\ndirectory=/usr", "", "expected letters, digits"),
        ("/mnt/a:/etc", "", "expected letters, digits"),
        ("/mnt/${HOME}", "", "expected letters, digits"),
        # fio reads ";" and "#" as the start of a comment: it would write into the folder before them
        ("/etc;x", "", "; and # start a comment"),
        ("victim/;x", "", "; and # start a comment"),
        ("/etc#x", "", "; and # start a comment"),
        ("//etc", "", "a path starting with //"),
        ("/", "", "a system path"),
        ("/etc", 'clients = ["h1"]', "a system path"),
        ("/mnt/../usr/lib", "", "a system path"),
        ("relative/dir", 'clients = ["h1"]', "expected an absolute path"),
    ],
)
def test_validate_applies_the_directory_rules(tmp_path: Path, directory: str, extra: str, message: str) -> None:
    """What `run` refused, `validate` refuses too, and so does client mode: nothing unchecked
    reaches fio's job file."""
    sc = tmp_path / "s.toml"
    sc.write_text(
        'schema_version = 1\nname = "t"\n[workload]\nkind = "sweep"\nlengths = [100]\n'
        f'[traffic]\ntool = "fio"\ntarget = "1MB/s"\ndirectory = {json.dumps(directory)}\n{extra}\n'
    )
    r = cli("validate", str(sc))
    assert r.returncode == 2 and "traffic.directory" in r.stderr and message in r.stderr, r.stderr


def test_parent_folders_kvbench_made_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    work, created = prepare_directory(str(target), allow_nonempty=False, run_name="x")
    assert created == [target, tmp_path / "a" / "b", tmp_path / "a"]
    cleanup_directory(work, created)
    assert list(tmp_path.iterdir()) == []


def test_a_child_that_ignores_sigterm_is_killed_with_its_whole_group() -> None:
    """core/children.py, which engines and load generators share: the ladder's next signal
    follows when the child outlives the wait, and every member of its process group gets each
    signal (a grandchild too)."""
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "print(g.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=children.die_with_parent,
    )
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    children.stop_group(proc, ((signal.SIGTERM, 0.5), (signal.SIGKILL, 30.0)))
    assert proc.returncode == -signal.SIGKILL
    for _ in range(3000):  # killed, then reaped by init
        if _gone(grandchild):
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the grandchild outlived its group's SIGKILL")
    proc.stdout.close()


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie not yet reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
