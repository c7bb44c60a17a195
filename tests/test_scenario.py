"""Scenario files: the shipped ones load; every mistake names the file, the key and what was expected."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.commands.validate import is_sizing
from harness.config import scenario
from harness.config.context import MAX_CONTEXT_TOKENS, Context
from harness.config.engines import DynamoEngineCfg, FittedTiming, MockerTiming
from harness.config.tables import read_toml
from harness.core.errors import InputError
from tests.conftest import cli, write_scenario

ROOT = Path(__file__).resolve().parent.parent
SWEEP = """
name = "t"
[workload]
kind = "sweep"
lengths = [1000, 2000]
"""
DYN = '[engine]\nkind = "dynamo"\ng2_blocks = 1600\n'


SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))


@pytest.mark.parametrize(
    "path", [p for p in SHIPPED if not is_sizing(read_toml(p, "scenario file"))], ids=lambda p: p.name
)
def test_shipped_scenarios_load(path: Path) -> None:
    sc = scenario.load(path)
    assert sc.name == path.stem
    assert len(sc.digest()) == 16


def test_redbooks_concurrency_matches_the_paper() -> None:
    sc = scenario.load(ROOT / "scenarios/redbooks-concurrency.toml")
    w = sc.workload
    assert (w.requests, w.concurrency, w.pool) == (200, 28, 100)
    assert [a.name for a in sc.arms] == ["recompute", "cached"]
    assert sc.arm("recompute").cache == "bust"
    assert sc.arm("cached").before is not None


def parse(text: str) -> scenario.Scenario:
    import tomllib

    return scenario.parse(tomllib.loads("schema_version = 1\n" + text), "scenarios/x.toml")


def test_defaults() -> None:
    sc = parse(SWEEP)
    assert sc.endpoint.api == "chat" and sc.arms[0].name == "default" and sc.workload.warm_repeats == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            SWEEP.replace("[1000, 2000]", '[1000, "many"]'),
            'scenarios/x.toml: workload.lengths[1]: expected an integer number of tokens, got "many"',
        ),
        (SWEEP.replace("[1000, 2000]", "[1000, 0]"), "workload.lengths[1]: expected an integer number of tokens >= 1"),
        (SWEEP + "[endpoint]\nmax_token = 3\n", "scenarios/x.toml: endpoint.max_token: unknown key"),
        ("colour = 1\n" + SWEEP, "scenarios/x.toml: colour: unknown key"),
        (SWEEP + "colour = 1\n", "scenarios/x.toml: workload.colour: unknown key"),
        (SWEEP + '[endpoint]\napi = "rest"\n', 'endpoint.api: expected one of "chat", "completions", got "rest"'),
        (SWEEP + "[endpoint.timeouts]\ntotal_s = -1\n", "endpoint.timeouts.total_s: expected a number > 0, got -1"),
        (SWEEP.replace('kind = "sweep"', 'kind = "open"'), 'workload.kind: expected one of "sweep", "closed_loop"'),
        (SWEEP.replace('name = "t"', 'name = "a/b"'), "name: expected letters, digits"),
        (SWEEP.replace('name = "t"\n', ""), "scenarios/x.toml: name: missing; expected a string"),
        (SWEEP + '[[arms]]\nname = "a"\ncache = "maybe"\n', 'arms[0].cache: expected one of "reuse", "bust"'),
        (SWEEP + '[[arms]]\nname = "a"\n[[arms]]\nname = "a"\n', "arms[1].name: expected a name not used"),
        (SWEEP + '[[arms]]\nname = "a"\nbefore = { http = "RESET" }\n', 'arms[0].before.http: expected "METHOD /path"'),
        (
            SWEEP + '[[arms]]\nname = "a"\nbefore = { command = "rm -rf /" }\n',
            "arms[0].before.command: expected a non-empty list of strings",
        ),
        (SWEEP + '[[arms]]\nname = "a"\nbefore = {}\n', "arms[0].before: expected exactly one of"),
        (SWEEP + '[emulator]\nprofile = "fast"\n', 'emulator.profile: expected one of "recompute", "redbooks-g4"'),
        (SWEEP + "[emulator]\ntime_scale = 0\n", "emulator.time_scale: expected a number > 0"),
        (
            'name = "t"\n[workload]\nkind = "closed_loop"\nrequests = 10\nconcurrency = 2\npool = 5\n',
            "workload.prompt_tokens: missing",
        ),
        (
            'name = "t"\n[workload]\nkind = "closed_loop"\nrequests = 10\nconcurrency = 2\npool = 5\n'
            'prompt_tokens = { distribution = "uniform", min = 10 }\n',
            "workload.prompt_tokens.max: missing",
        ),
        (
            'name = "t"\n[workload]\nkind = "closed_loop"\nrequests = 10\nconcurrency = 2\npool = 5\n'
            "prompt_tokens = 100\nshared_prefix_tokens = 100\n",
            "workload.shared_prefix_tokens: expected fewer tokens than the shortest prompt (100), got 100",
        ),
        (
            'name = "t"\n[workload]\nkind = "closed_loop"\nrequests = 1.5\nconcurrency = 2\npool = 5\n'
            "prompt_tokens = 100\n",
            "workload.requests: expected an integer number of requests, got 1.5",
        ),
        (SWEEP + "[endpoint]\nextra_body = 3\n", "endpoint.extra_body: expected a table"),
        (SWEEP + '[prompts]\nsource = "file"\n', "prompts.path: missing"),
        (SWEEP + '[[arms]]\nname = "a"\nwarm_from = "gpu"\n', 'arms[0].warm_from: expected one of "active", "host"'),
        (
            SWEEP + '[[arms]]\nname = "a"\ncache = "bust"\nwarm_from = "disk"\n',
            'arms[0].warm_from: applies to cache = "reuse" arms',
        ),
        (SWEEP + '[[arms]]\nname = "a"\nslot_dir = "/x"\n', 'arms[0].slot_dir: applies to warm_from = "disk" only'),
        (
            'name = "t"\n[workload]\nkind = "closed_loop"\nrequests = 10\nconcurrency = 2\npool = 5\n'
            'prompt_tokens = 100\n[[arms]]\nname = "a"\nwarm_from = "host"\n',
            'arms[0].warm_from: "host" applies to kind = "sweep" workloads; a closed loop takes "disk"',
        ),
        (SWEEP + '[engine]\nkind = "vllm"\n', 'engine.kind: expected one of "llamacpp", "dynamo", got "vllm"'),
        (SWEEP + '[engine]\nkind = "dynamo"\nslots = 2\n', "engine.slots: unknown key"),
        (SWEEP + '[engine]\nslot_dir = "/x"\nworkers = 2\n', "engine.workers: unknown key"),
        (SWEEP + '[engine]\nkind = "dynamo"\nworkers = 0\n', "engine.workers: expected an integer number of mocker"),
        (
            SWEEP + '[engine]\nkind = "dynamo"\nrouter_mode = "random"\n',
            'engine.router_mode: expected one of "kv", "round-robin", got "random"',
        ),
        (
            SWEEP + '[engine]\nkind = "dynamo"\ng2_bandwidth = "fast"\n',
            "engine.g2_bandwidth: expected a bandwidth such",
        ),
        (
            SWEEP + '[engine]\nkind = "dynamo"\ng2_bandwidth = "1GB/s"\n',
            "engine.g2_bandwidth: applies with g2_blocks > 0",
        ),
        (
            SWEEP + '[[arms]]\nname = "a"\nengine = { g2_blocks = 8 }\n',
            "arms[0].engine: applies with an [engine] table",
        ),
        (
            SWEEP + DYN + "timing = { prefill_a = 1e-5, decode_s_per_token = 0.01 }\n",
            "engine.timing.prefill_b: missing; expected a number of seconds >= 0, or fit_from alone",
        ),
        (
            SWEEP + DYN + "timing = { prefill_a = 1e-5, prefil_b = 0, decode_s_per_token = 0.01 }\n",
            "engine.timing.prefil_b: unknown key (did you mean 'prefill_b'?)",
        ),
        (
            SWEEP + DYN + "timing = { prefill_a = -1e-5, prefill_b = 0, decode_s_per_token = 0.01 }\n",
            "engine.timing.prefill_a: expected a number >= 0.0, got -1e-05",
        ),
        (
            SWEEP + DYN + "timing = { prefill_a = 1e-5, prefill_b = 0, decode_s_per_token = 0.01, c = 1 }\n",
            "engine.timing.c: unknown key",
        ),
        (SWEEP + DYN + 'timing = "fast"\n', "engine.timing: expected a table"),
        (
            SWEEP + DYN + 'timing = { fit_from = "results/x", prefill_a = 1e-5 }\n',
            "engine.timing.prefill_a: applies without fit_from (the fit gives it)",
        ),
        (SWEEP + DYN + "timing = { fit_from = 3 }\n", "engine.timing.fit_from: expected a string"),
        (
            SWEEP + DYN + '[[arms]]\nname = "a"\nengine = { timing = { prefill_a = 1 } }\n',
            "arms[0].engine.timing: expected a key NVIDIA Dynamo's frontend",
        ),
        (
            SWEEP + '[engine]\nslots = 2\n[[arms]]\nname = "a"\nengine = { slots = 4 }\n',
            "arms[0].engine.slots: expected a key llama.cpp's llama-server can change between arms (none)",
        ),
        (
            SWEEP + DYN + '[[arms]]\nname = "a"\n[[arms]]\nname = "b"\nengine = { workers = 2 }\n',
            "arms[1].engine.workers: expected a key NVIDIA Dynamo's frontend and mocker workers can change "
            "between arms (g1_blocks, g2_blocks, g2_bandwidth, router_mode), got 2",
        ),
        (
            SWEEP + DYN + '[[arms]]\nname = "a"\nengine = { g2_bandwidth = "fast" }\n',
            "arms[0].engine.g2_bandwidth: expected a bandwidth such",
        ),
        (
            SWEEP + DYN + '[[arms]]\nname = "a"\nbefore = { http = "POST /reset" }\nengine = { g1_blocks = 8 }\n',
            "arms[0].engine: applies to an arm without a `before` of its own",
        ),
    ],
)
def test_errors_name_file_key_and_expectation(text: str, message: str) -> None:
    with pytest.raises(InputError) as e:
        parse(text)
    assert message in str(e.value)


SESSIONS = """
name = "t"
[workload]
kind = "sessions"
users = 2
turns = 3
think_s = 1.0
user_context_tokens = 1000
message_tokens = {message}
answer_tokens = 100
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'name = "t"\n[workload]\nkind = "sweep"\nlengths = [1000, 1000000000]\n',
            "workload.lengths[1]: prompts up to 1,000,000,016 tokens with their output, beyond the model's "
            "context of 1,048,576 tokens (model.max_context_tokens)",
        ),
        (SWEEP + "[model]\nmax_context_tokens = 1500\n", "workload.lengths[1]: prompts up to 2,016 tokens"),
        (
            'name = "t"\n[workload]\nkind = "closed_loop"\nrequests = 10\nconcurrency = 2\npool = 5\n'
            'prompt_tokens = { distribution = "uniform", min = 10, max = 2000000 }\n',
            "workload.prompt_tokens: prompts up to 2,000,016 tokens",
        ),
        (
            SESSIONS.format(message=400000),
            "workload.turns: prompts up to 1,201,300 tokens with their output (the last turn: "
            "system_prompt_tokens + user_context_tokens + turns x (message_tokens + answer_tokens))",
        ),
    ],
)
def test_every_prompt_length_is_bounded_by_the_models_context(text: str, message: str) -> None:
    """No length key can ask kvbench to build (and a server to refuse) a prompt beyond the model's
    context: the scenario's bound by default, model.max_context_tokens when set."""
    with pytest.raises(InputError) as e:
        parse(text)
    assert message in str(e.value) and "scenarios/x.toml" in str(e.value)
    assert parse(SESSIONS.format(message=400)).model.max_context_tokens == MAX_CONTEXT_TOKENS


def test_an_arm_sets_the_dynamo_keys_it_may_change_and_keeps_the_rest() -> None:
    sc = parse(
        SWEEP + DYN + 'g1_blocks = 400\n[[arms]]\nname = "a"\n[[arms]]\nname = "b"\n'
        'engine = { g2_bandwidth = "2GB/s", g1_blocks = 300 }\n[[arms]]\nname = "c"\nengine = { g2_blocks = 0 }\n'
    )
    assert sc.engine is not None and sc.arms[0].engine is None  # as [engine] says
    assert sc.arms[1].engine == dataclasses.replace(sc.engine, g1_blocks=300, g2_bandwidth="2GB/s", g2_bytes_per_s=2e9)
    assert sc.arms[2].engine == dataclasses.replace(sc.engine, g2_blocks=0)


def test_a_dynamo_engine_reads_its_own_keys() -> None:
    sc = parse(
        SWEEP + '[engine]\nkind = "dynamo"\nworkers = 2\nrouter_mode = "round-robin"\ng1_blocks = 400\n'
        'g2_blocks = 1600\ng2_bandwidth = "1GB/s"\nkv_bytes_per_token = 1024\n'
    )
    assert sc.engine == DynamoEngineCfg(
        workers=2,
        router_mode="round-robin",
        g1_blocks=400,
        g2_blocks=1600,
        g2_bandwidth="1GB/s",
        g2_bytes_per_s=1e9,
        kv_bytes_per_token=1024,
    )
    assert sc.engine.context == Context(16384, "the model kvbench makes for Dynamo")
    timed = parse(SWEEP + DYN + "timing = { prefill_a = 2.4e-5, prefill_b = 1e-9, decode_s_per_token = 0.005 }\n")
    assert isinstance(timed.engine, DynamoEngineCfg) and timed.engine.timing == MockerTiming(2.4e-5, 1e-9, 0.005)
    fitted = parse(SWEEP + DYN + 'timing = { fit_from = "results/sweep" }\n')
    assert isinstance(fitted.engine, DynamoEngineCfg) and fitted.engine.timing == FittedTiming("results/sweep")


def test_schema_version(tmp_path: Path) -> None:
    p = tmp_path / "v.toml"
    p.write_text(SWEEP.replace('name = "t"', 'schema_version = 2\nname = "t"'))
    with pytest.raises(InputError, match="schema_version: expected 1"):
        scenario.load(p)
    p.write_text(SWEEP)
    with pytest.raises(InputError, match="schema_version: missing"):
        scenario.load(p)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such scenario file"):
        scenario.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = \n")
    with pytest.raises(InputError, match=r"bad\.toml: invalid TOML"):
        scenario.load(bad)


def test_hash_changes_with_content_not_path() -> None:
    a, b = parse(SWEEP), parse(SWEEP.replace("2000", "3000"))
    assert a.digest() != b.digest()
    assert a.digest() == scenario.parse(__import__("tomllib").loads("schema_version = 1\n" + SWEEP), "y").digest()


def test_urls_are_redacted_and_joined() -> None:
    from harness.server.endpoint import join, redact, root

    assert redact("https://user:pw@host:8000/v1?key=s3cret#x") == "https://host:8000/v1"
    assert join("http://h:1/v1?api-version=2", "/models") == "http://h:1/v1/models?api-version=2"
    assert root("http://h:1/v1/") == "http://h:1"


@pytest.mark.parametrize(
    ("engine", "bound"),
    [
        ('[engine]\nkind = "dynamo"\n', "context of 16,384 tokens (the model kvbench makes for Dynamo)"),
        ("[engine]\nctx_per_slot = 4096\n", "context of 4,096 tokens (engine.ctx_per_slot)"),
        ("", "context of 131,072 tokens (emulator profile redbooks-g4)"),
    ],
    ids=["dynamo", "llamacpp", "emulator"],
)
def test_validate_bounds_prompts_by_what_run_would_start(tmp_path: Path, engine: str, bound: str) -> None:
    """`kvbench validate` refuses what `kvbench run` of the same file would: a prompt longer than
    the context of the engine it starts, or of the embedded emulator's profile."""
    sc = write_scenario(tmp_path / "s.toml", SWEEP.replace("[1000, 2000]", "[1000, 200000]") + engine)
    r = cli("validate", str(sc))
    assert r.returncode == 2 and "workload.lengths[1]: prompts up to 200," in r.stderr, r.stderr
    assert bound in r.stderr and "Traceback" not in r.stderr


def test_every_sections_first_mistake_is_told_at_once(tmp_path: Path) -> None:
    """A scenario with mistakes in four sections and a mistyped one: one run of `validate` names
    all five (each section's first), with the file and key of each, exit 2; one mistake alone is
    told as before."""
    f = tmp_path / "bad.toml"
    f.write_text(
        'schema_version = 1\nname = "bad"\n[endpoint]\nmax_tokns = 8\n[workload]\nkind = "sweep"\n'
        'lengths = [1000, "x"]\n[emulator]\ntime_scale = -1\n[metrics]\nenabled = "yes"\n[trafic]\nx = 1\n'
    )
    r = cli("validate", str(f))
    assert r.returncode == 2 and f"{f}: 5 errors:" in r.stderr, r.stderr
    for key in ("endpoint.max_tokns", "workload.lengths[1]", "emulator.time_scale", "metrics.enabled"):
        assert f"{f}: {key}:" in r.stderr, key
    assert "trafic: unknown key (did you mean 'traffic'?" in r.stderr
    f.write_text(
        'schema_version = 1\nname = "bad"\n[workload]\nkind = "sweep"\nlengths = [1000]\n[emulator]\ntime_scale = -1\n'
    )
    r = cli("validate", str(f))
    assert r.returncode == 2 and "errors:" not in r.stderr and f"{f}: emulator.time_scale:" in r.stderr


def test_the_known_sections_are_the_scenarios_fields() -> None:
    fields = {f.name for f in dataclasses.fields(scenario.Scenario)} - {"path", "raw"}
    assert set(scenario.SECTIONS) == fields
