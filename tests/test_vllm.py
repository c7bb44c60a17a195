"""kvbench against vLLM itself: its CPU build (engines/vllm/install.sh, which .ci/run runs) serving
a tiny random llama made here (engines/vllm/make_model.py). The paper's engine: exact prompt
lengths through its /tokenize, cold requests with cache_salt, warm ones on its 128-token blocks
with no false alarm, and its own counters agreeing with the per-request cached tokens. Timing on
shared 2-core machines is noisy: these tests check counts and ratios, never absolute latencies."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engines.vllm import VllmServer, python
from harness.results import read_requests
from harness.server import metrics
from tests.conftest import ROOT, arm_folders, kvbench, other_warnings, write_scenario

PYTHON = python()
pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        PYTHON is None, reason="vLLM's CPU build is not installed here: run engines/vllm/install.sh (.ci/run does)"
    ),
]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    assert PYTHON is not None
    model = tmp_path_factory.mktemp("vllm") / "tiny"
    subprocess.run([str(PYTHON), str(ROOT / "engines" / "vllm" / "make_model.py"), str(model)], check=True)
    with VllmServer(PYTHON, model) as srv:
        yield srv
    assert srv.proc is None  # stopped by PID


def test_sweep_exact_lengths_cold_by_salt_and_block_aligned_warm_hits(vllm: VllmServer, tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "s.toml",
        'name = "vllm-sweep"\n[endpoint]\nmax_tokens = 2\n[workload]\nkind = "sweep"\nlengths = [999, 4000]\n'
        'repetitions = 2\nwarm_repeats = 2\n[[arms]]\nname = "cold"\ncache = "bust"\n[[arms]]\nname = "cached"\n',
    )
    r = kvbench("run", str(sc), "--endpoint", vllm.base_url, "--out", str(tmp_path / "out"), timeout=900)
    assert r.returncode == 0, r.stderr
    for arm, folder in arm_folders(tmp_path / "out", "vllm-sweep").items():
        meta = json.loads((folder / "run.json").read_text())
        assert other_warnings(meta) == [], meta["warnings"]  # no false warm or cold alarm
        assert meta["prompt_counting"] == "server /tokenize (vllm format)"
        assert meta["warm_rule"]["block_tokens"] == 128 and meta["warm_rule"]["source"] == "vllm:cache_config_info"
        for x in read_requests(folder):
            assert x.ok and x.prompt_tokens == x.target_tokens  # exact, as vLLM counts them
            if x.phase == "cold":
                assert x.cached_tokens == 0, (arm, x)
            else:  # whole 128-token blocks before the last token: 896 of 999
                assert x.cached_tokens == (x.prompt_tokens - 1) // 128 * 128
        if arm == "cached":
            assert meta["server_metrics"]["verdict"].startswith("warm requests hit the cache")


def test_closed_loop_server_counters_agree_with_the_requests(vllm: VllmServer, tmp_path: Path) -> None:
    # 16 tokens: the tiny random model's tokens can all be bytes of unfinished UTF-8, and vLLM
    # sends no chunk for a token without visible text (a response of 4 such was "no token")
    sc = write_scenario(
        tmp_path / "c.toml",
        'name = "vllm-loop"\n[endpoint]\nmax_tokens = 16\n[workload]\nkind = "closed_loop"\nrequests = 24\n'
        'concurrency = 4\npool = 4\nprompt_tokens = 1500\n[[arms]]\nname = "recompute"\ncache = "bust"\n'
        '[[arms]]\nname = "cached"\n',
    )
    r = kvbench("run", str(sc), "--endpoint", vllm.base_url, "--out", str(tmp_path / "out"), timeout=900)
    assert r.returncode == 0, r.stderr
    for arm, folder in arm_folders(tmp_path / "out", "vllm-loop").items():
        assert other_warnings(json.loads((folder / "run.json").read_text())) == [], r.stderr
        recs = read_requests(folder)
        cached = sum(x.cached_tokens or 0 for x in recs)
        prompt = sum(x.prompt_tokens or 0 for x in recs)
        ratio = json.loads((folder / "metrics.json").read_text())["phases"]["run"]["server_hit_ratio"]
        assert ratio == pytest.approx(cached / prompt, abs=1e-9), arm  # the server's count is the clients'
        assert (cached == 0) == (arm == "recompute")


def test_the_metric_map_on_live_metrics(vllm: VllmServer) -> None:
    import urllib.request

    def scrape() -> tuple[metrics.Snapshot, set[str]]:
        with urllib.request.urlopen(vllm.base_url.removesuffix("/v1") + "/metrics", timeout=10) as resp:
            return metrics.parse(resp.read().decode())

    before, gauges = scrape()
    body = json.dumps({"model": "tiny", "prompt": "kvbench storage tier " * 100, "max_tokens": 1}).encode()
    for _ in range(2):  # the second finds the first's blocks on the device
        req = urllib.request.Request(vllm.base_url + "/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
    after, _ = scrape()
    assert metrics.block_size(after) == (128, "vllm:cache_config_info")
    m = metrics.mapped(metrics.delta(before, after, gauges))
    assert "vllm" in m["families"] and set(m["cached_tokens_by_source"]) >= {"device", "host", "disk"}
    assert m["cached_tokens_by_source"]["device"] >= 128 and m["cached_tokens_by_source"]["disk"] == 0
