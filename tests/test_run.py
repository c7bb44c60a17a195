"""`kvbench run` end to end, as a user runs it: the CLI against a real emulator on an ephemeral port."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.emulator.serve import EmbeddedEmulator
from harness.results import read_requests
from tests.conftest import arm_folders, cli, interrupt, kvbench, other_warnings, write_scenario


def test_smoke_sweep_on_the_embedded_emulator(tmp_path: Path) -> None:
    r = kvbench("run", "scenarios/smoke.toml", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "embedded emulator" in r.stderr and "Traceback" not in r.stderr
    (folder,) = arm_folders(tmp_path, "smoke").values()
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "completed" and meta["emulated"] is True
    assert meta["time_scale"] == 10.0 and "model time" in meta["times"]
    assert meta["prompt_counting"] == "server /tokenize (vllm format)" and other_warnings(meta) == []
    recs = read_requests(folder)
    assert len(recs) == 2 * 2 * 3 == meta["summary"]["requests"]
    for rec in recs:
        assert rec.ok and rec.prompt_tokens == rec.target_tokens
        assert rec.first_byte_s <= rec.ttft_s <= rec.e2e_s
        assert rec.first_content_s is None  # gpt-oss reasons first: 4 tokens are all reasoning
        if rec.phase == "cold":
            assert rec.cached_tokens == 0
        else:
            assert rec.cached_tokens >= 0.99 * rec.prompt_tokens
    by_len = {row["length"]: row for row in meta["summary"]["by_length"]}
    assert by_len[8000]["speedup"] > 1.5  # loading 8K tokens from G4 beats recomputing them


CLOSED = """
name = "closed"
[endpoint]
max_tokens = 8
[workload]
kind = "closed_loop"
requests = 84
concurrency = 28
pool = 10
prompt_tokens = { distribution = "uniform", min = 1500, max = 2500 }
[[arms]]
name = "bust"
cache = "bust"
[[arms]]
name = "reuse"
before = { http = "POST /reset_prefix_cache" }
[emulator]
time_scale = 20.0
"""


def test_closed_loop_28_workers_bust_never_hits(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "closed.toml", CLOSED)
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    arms = arm_folders(tmp_path / "out", "closed")
    bust, reuse = read_requests(arms["bust"]), read_requests(arms["reuse"])
    assert len(bust) == len(reuse) == 84
    assert {rec.worker for rec in bust} == set(range(28))
    assert all(rec.ok and rec.cached_tokens == 0 for rec in bust)
    assert sum(rec.cached_tokens > 0 for rec in reuse) >= 84 - 10 - 28  # repeats of a pool of 10
    assert sorted(rec.schedule_index for rec in reuse) == list(range(84))
    lengths = {rec.prompt_id: rec.prompt_tokens for rec in reuse}
    assert len(lengths) <= 10 and all(1500 <= n <= 2500 for n in lengths.values())
    meta = json.loads((arms["reuse"] / "run.json").read_text())
    assert meta["summary"]["req_per_s"] > 0 and meta["before_hook"].startswith("POST http://127.0.0.1")


def test_client_first_token_matches_server_send_time(tmp_path: Path) -> None:
    """At 28 connections on loopback the client's first-token stamp never comes before the
    server's own send time, stamped as the emulator hands the bytes to its transport, on the same
    monotonic clock: the records' times are rounded to 0.1 us, two of them add up to 0.2 us. (How
    closely it follows is measured by bench/ttft_accuracy.py, not here: that is a duration.)"""
    log = tmp_path / "server.jsonl"
    sc = write_scenario(tmp_path / "closed.toml", CLOSED.replace("time_scale = 20.0", "time_scale = 1.0"))
    with EmbeddedEmulator("redbooks-g4", 20.0, timing_log=log) as emu:
        r = kvbench("run", str(sc), "--endpoint", emu.base_url, "--arm", "reuse", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "o", "closed").values()
    meta = json.loads((folder / "run.json").read_text())
    server = {}
    for line in log.read_text().splitlines():
        d = json.loads(line)
        server[d["request_id"]] = d
    diffs = []
    for rec in read_requests(folder):
        assert rec.request_id == f"{meta['run_id']}-reuse-{rec.id}"  # (one process: ids not renumbered)
        s = server[rec.request_id]
        client_ft = meta["t0_monotonic_ns"] + (rec.start_s + rec.ttft_s) * 1e9
        diffs.append((client_ft - s["first_token_ns"]) / 1e6)
        assert s["prompt_tokens"] == rec.prompt_tokens and s["cached_tokens"] == rec.cached_tokens
    diffs.sort()
    assert len(diffs) == 84
    assert diffs[0] >= -0.0002  # never before the server sent it, the records' rounding aside


def test_api_key_and_header_values_never_reach_results(tmp_path: Path) -> None:
    env = {"EMU_KEY": "sekret-123", "OPENAI_API_KEY": "sekret-123"}
    os.environ["EMU_KEY"] = "sekret-123"
    try:
        with EmbeddedEmulator("redbooks-g4", 50.0, api_key_env="EMU_KEY") as emu:
            r = kvbench(
                "run",
                "scenarios/smoke.toml",
                "--endpoint",
                emu.base_url + "?k=q",
                "--header",
                "X-Team: hidden-value",
                "--out",
                str(tmp_path),
                env=env,
            )
            no_key = kvbench("run", "scenarios/smoke.toml", "--endpoint", emu.base_url, "--out", str(tmp_path))
    finally:
        del os.environ["EMU_KEY"]
    assert r.returncode == 0, r.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "sekret" not in text and "hidden-value" not in text and "k=q" not in text
    assert "sekret" not in r.stdout + r.stderr
    assert no_key.returncode == 3 and "HTTP 401" in no_key.stderr and "OPENAI_API_KEY" in no_key.stderr


def test_exit_2_bad_scenario_names_file_and_key(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "x.toml", 'name = "x"\n[workload]\nkind = "sweep"\nlengths = [10, "many"]\n')
    for cmd in (("run", str(sc)), ("validate", str(sc))):
        r = kvbench(*cmd)
        assert r.returncode == 2
        assert f'{sc}: workload.lengths[1]: expected an integer number of tokens, got "many"' in r.stderr
        assert "Traceback" not in r.stderr


def test_exit_2_usage_errors(tmp_path: Path) -> None:
    for args in (
        ("run",),
        ("run", "scenarios/smoke.toml", "--time-scale", "fast"),
        ("run", "scenarios/smoke.toml", "--arm", "nope"),
        ("run", "scenarios/smoke.toml", "--header", "bad"),
        ("run", "scenarios/smoke.toml", "--endpoint", "localhost:8000"),
        ("run", "scenarios/smoke.toml", "--endpoint", "http://127.0.0.1:9/v1", "--time-scale", "2"),
        ("run", "scenarios/smoke.toml", "--api-key-env", "KVBENCH_UNSET_VAR"),
        ("frobnicate",),
    ):
        r = kvbench(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip()


def test_exit_3_unreachable_endpoint_names_the_url() -> None:
    r = kvbench("run", "scenarios/smoke.toml", "--endpoint", "http://127.0.0.1:9/v1")
    assert r.returncode == 3
    assert "cannot reach http://127.0.0.1:9/v1/models" in r.stderr and "Traceback" not in r.stderr


def test_exit_3_wrong_model_and_failed_hook(tmp_path: Path, emulator: EmbeddedEmulator) -> None:
    r = kvbench("run", "scenarios/smoke.toml", "--endpoint", emulator.base_url, "--model", "llama-9")
    assert r.returncode == 3 and "'llama-9' is not served" in r.stderr
    sc = write_scenario(
        tmp_path / "h.toml",
        'name = "h"\n[workload]\nkind = "sweep"\nlengths = [100]\n'
        '[[arms]]\nname = "a"\nbefore = { command = ["false"] }\n',
    )
    r = kvbench("run", str(sc), "--endpoint", emulator.base_url, "--out", str(tmp_path))
    assert r.returncode == 3 and 'before hook ["false"] exited with 1' in r.stderr


def test_exit_4_when_requests_fail(tmp_path: Path, emulator: EmbeddedEmulator) -> None:
    # 140,000 tokens do not fit the emulated model's 131,072-token context: the server says 400.
    # (Its context is not known to kvbench behind --endpoint; with the embedded emulator it is,
    # and the run is refused before anything is sent: test_a_known_context_refuses_longer_prompts.)
    sc = write_scenario(
        tmp_path / "big.toml",
        'name = "big"\n[workload]\nkind = "sweep"\nlengths = [1000, 140000]\n'
        "warm_repeats = 0\n[emulator]\ntime_scale = 50.0\n",
    )
    r = kvbench("run", str(sc), "--endpoint", emulator.base_url, "--out", str(tmp_path))
    assert r.returncode == 4, r.stderr
    assert "1 request(s) failed" in r.stderr
    (folder,) = arm_folders(tmp_path, "big").values()
    recs = read_requests(folder)
    assert [rec.ok for rec in recs] == [True, False]
    assert recs[1].http_status == 400 and "maximum context length" in (recs[1].error or "")


def test_a_known_context_refuses_longer_prompts(tmp_path: Path) -> None:
    """The embedded emulator's profile says its context (131,072 tokens): a longer prompt is
    refused before the emulator starts or anything is sent, naming the key and the bound's
    source; the scenario's own bound applies where it is shorter."""
    body = 'name = "big"\n[workload]\nkind = "sweep"\nlengths = [1000, 140000]\n[emulator]\ntime_scale = 50.0\n'
    r = kvbench("run", str(write_scenario(tmp_path / "big.toml", body)), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "workload.lengths[1]: prompts up to 140,016 tokens" in r.stderr
    assert "context of 131,072 tokens (emulator profile redbooks-g4)" in r.stderr
    assert not (tmp_path / "out").exists()
    own = body.replace("140000", "2000") + "[model]\nmax_context_tokens = 1500\n"
    r = cli("validate", str(write_scenario(tmp_path / "own.toml", own)))
    assert r.returncode == 2 and "(model.max_context_tokens)" in r.stderr


def test_ctrl_c_keeps_partial_results(tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "long.toml",
        'name = "long"\n[endpoint]\nmax_tokens = 1\n[workload]\n'
        'kind = "sweep"\nlengths = [1000, 2000, 100000, 120000]\nrepetitions = 3\n',
    )

    def four_done() -> bool:
        done = list(tmp_path.glob("long/*/requests.jsonl"))
        return bool(done) and len(done[0].read_text().splitlines()) >= 4

    code, err = interrupt(["run", str(sc), "--out", str(tmp_path)], four_done)
    assert code == 130, err
    (folder,) = arm_folders(tmp_path, "long").values()
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "interrupted"
    recs = read_requests(folder)
    assert 4 <= len(recs) < 24 and all(rec.ok for rec in recs)
    assert "Traceback" not in err


def test_first_token_timeout_is_recorded(tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "t.toml",
        'name = "t"\n[endpoint]\nmax_tokens = 1\n[endpoint.timeouts]\n'
        'first_token_s = 0.05\n[workload]\nkind = "sweep"\nlengths = [20000]\nwarm_repeats = 0\n',
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path))  # cold 20K tokens: ~1.5 s to the first token
    assert r.returncode == 4, r.stderr
    (folder,) = arm_folders(tmp_path, "t").values()
    (rec,) = read_requests(folder)
    assert rec.error_kind == "timeout" and "no first token within 0.05 s" in rec.error


def test_prompts_from_a_file(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"question {i}: " + "word " * (300 * i)}) + "\n" for i in range(1, 4)
        )
    )
    sc = write_scenario(
        tmp_path / "f.toml",
        f'name = "f"\n[endpoint]\nmax_tokens = 2\n[prompts]\nsource = "file"\n'
        f'path = "{prompts}"\n[workload]\nkind = "closed_loop"\nrequests = 9\nconcurrency = 3\n'
        "pool = 3\nprompt_tokens = 1\n[emulator]\ntime_scale = 20.0\n",
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "out", "f").values()
    recs = read_requests(folder)
    assert {x.prompt_id for x in recs} <= {"q1", "q2", "q3"} and len(recs) == 9
    assert all(x.target_tokens is None and x.prompt_tokens > 300 for x in recs)


def test_usage_calibrated_counting_is_close(emulator: EmbeddedEmulator) -> None:
    """Where a server has no /tokenize, lengths are estimated from usage.prompt_tokens of probes."""
    import asyncio

    import aiohttp

    from harness.emulator import tokenizer
    from harness.server import endpoint

    async def go() -> list[tuple[int, int]]:
        async with aiohttp.ClientSession() as s:
            count = await endpoint.usage_counter(s, emulator.base_url, "openai/gpt-oss-120b", "chat", {})
            out = []
            for n in (500, 5000, 50000):
                text = "[000000000001] " + " ".join(["alpha beta, gamma."] * (n // 5))
                true = tokenizer.count(tokenizer.render_chat([{"role": "user", "content": text}]))
                out.append((await count(text), true))
            return out

    for estimate, true in asyncio.run(go()):
        assert abs(estimate - true) <= 0.01 * true


def test_an_estimated_count_is_never_below_zero() -> None:
    """A server without /tokenize whose usage.prompt_tokens grow a little faster than the text
    (the line through the two probes crosses zero before the empty text): the empty text counts
    0, not -30, so the chat template's size (a cold request's cached-tokens allowance) is never
    negative and a cold request with 0 cached tokens is never flagged."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from harness.server import checks, endpoint
    from harness.server.endpoint import _UNITS_RE

    async def completions(request: web.Request) -> web.Response:
        text = (await request.json())["messages"][0]["content"]
        return web.json_response({"usage": {"prompt_tokens": round(1.2 * len(_UNITS_RE.findall(text))) - 30}})

    async def go() -> tuple[int, int]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as s:
                count = await endpoint.usage_counter(s, f"http://127.0.0.1:{port}/v1", "m", "chat", {})
                return await count(""), await count("one two")
        finally:
            await runner.cleanup()

    empty, two = asyncio.run(go())
    assert empty == 0 and two == 0  # (2.4 - 30 rounds below zero too)
    assert checks.cold_allowance(0, empty) == checks.COLD_START_TOKENS


def test_a_tiered_arm_on_an_engine_kvbench_cannot_move_kv_on_is_refused(tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "t.toml",
        'name = "tiers"\n[workload]\nkind = "sweep"\nlengths = [500]\n[[arms]]\nname = "host"\nwarm_from = "host"\n',
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))  # the embedded emulator
    assert r.returncode == 3 and "llama.cpp is the one it knows" in r.stderr and "Traceback" not in r.stderr


def test_warm_requests_are_judged_by_the_block_size_the_server_publishes(tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "s.toml",
        'name = "blocks"\n[endpoint]\nmax_tokens = 1\n[workload]\nkind = "sweep"\nlengths = [999, 2000]\n'
        "[emulator]\ntime_scale = 20.0\n",
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "meant to be warm" not in r.stderr
    (folder,) = (tmp_path / "out" / "blocks").iterdir()
    rule = json.loads((folder / "run.json").read_text())["warm_rule"]
    # the emulator publishes its 16-token blocks as vLLM does (vllm:cache_config_info)
    assert rule["block_tokens"] == 16 and rule["source"] == "vllm:cache_config_info"
    for x in read_requests(folder):
        if x.phase == "warm":
            assert x.prompt_tokens and x.cached_tokens == (x.prompt_tokens - 1) // 16 * 16
