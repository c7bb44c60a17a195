"""Trace files (Mooncake, Qwen-Bailian): strict reading, the reuse they make possible, and
`kvbench trace inspect` and `kvbench trace curve`, against the shipped samples and files made
here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.errors import InputError
from harness.inputs import traces
from tests.conftest import ROOT, cli, kvbench

SAMPLES = ROOT / "scenarios" / "traces"


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def mc(ts: float, n: int, ids: list[int], out: int = 10) -> dict[str, object]:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


def test_reuse_counts_the_cached_prefix_of_full_blocks(tmp_path: Path) -> None:
    t = traces.read(
        write(
            tmp_path / "t.jsonl",
            [
                mc(0, 4 * 512, [1, 2, 3, 4]),  # nothing cached yet; stores 4 full blocks
                mc(10, 4 * 512, [1, 2, 3, 4]),  # all 4 cached, but the last token is computed: 3 blocks
                mc(20, 3 * 512 + 100, [1, 2, 9, 10]),  # 1, 2 cached; 9 stored, 10 is partial
                mc(30, 3 * 512 + 100, [5, 1, 2, 9]),  # a different first block: no prefix
            ],
        )
    )
    assert t.format == "mooncake" and t.block_tokens == 512 and t.requests[1].timestamp_s == 0.01
    inf = traces.reuse(t.requests, 512)
    assert inf.cached_tokens == (3 + 2) * 512 and inf.prompt_tokens == 8 * 512 + 2 * (3 * 512 + 100)
    # an LRU of 2 blocks keeps only the last two a request stored
    assert traces.reuse(t.requests, 512, 2).cached_tokens == 0
    assert traces.reuse(t.requests, 512, 4).cached_tokens == (3 + 2) * 512


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ({"timestamp": 0, "output_length": 1, "hash_ids": []}, ":2: input_length: missing"),
        (
            {"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []},
            ":2: input_length: expected an integer >= 1",
        ),
        (
            {"timestamp": 0, "input_length": 5, "output_length": True, "hash_ids": []},
            ":2: output_length: expected an integer",
        ),
        (
            {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]},
            ":2: hash_ids: expected a list of integers",
        ),
        (
            {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": 3},
            ":2: hash_ids: expected a list of integers",
        ),
        (
            {"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": []},
            ":2: timestamp: expected a number",
        ),
        (mc(-1, 5, []), ":2: timestamp: expected a number >= 0"),
        (mc(0, 5, [1, 1 << 64]), ":2: hash_ids: expected integers of 64 bits"),
        (mc(0, 5, [-(1 << 63) - 1]), ":2: hash_ids: expected integers of 64 bits"),
        ("{not json", ":2: not JSON"),
        ("[1, 2]", ":2: expected a JSON object"),
    ],
)
def test_a_bad_line_is_named_by_file_line_and_field(tmp_path: Path, line: object, said: str) -> None:
    path = write(tmp_path / "t.jsonl", [mc(0, 600, [1]), line, mc(5, 700, [1])])
    with pytest.raises(InputError) as e:
        traces.read(path)
    assert str(e.value).startswith(f"{path}{said}")
    skipped = traces.read(path, skip_bad=True)
    assert len(skipped.requests) == 2 and len(skipped.skipped) == 1 and said in skipped.skipped[0]


def test_order_context_and_bailian_fields_are_checked(tmp_path: Path) -> None:
    back = write(tmp_path / "b.jsonl", [mc(5000, 600, [1]), mc(4000, 600, [1])])
    with pytest.raises(InputError, match=r":2: timestamp: goes backwards"):
        traces.read(back)
    with pytest.raises(
        InputError, match=r":1: input_length: 600 \+ output_length 10 exceeds the model's context \(512 tokens\)"
    ):
        traces.read(write(tmp_path / "c.jsonl", [mc(0, 600, [1])]), max_model_len=512)
    bad = {
        "chat_id": 1,
        "parent_chat_id": -2,
        "timestamp": 1.0,
        "input_length": 40,
        "output_length": 2,
        "hash_ids": [1],
    }
    with pytest.raises(InputError, match=r":1: parent_chat_id: expected an integer >= -1"):
        traces.read(write(tmp_path / "q.jsonl", [bad]))
    with pytest.raises(InputError, match="no trace requests"):
        traces.read(write(tmp_path / "e.jsonl", [""]))
    with pytest.raises(InputError, match="trace format: expected auto, mooncake or bailian"):
        traces.read(back, "sharegpt")


ids = st.lists(st.integers(0, 30), min_size=0, max_size=12)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(ids, st.integers(1, 12 * 16)), min_size=1, max_size=40), st.integers(1, 20))
def test_lru_never_serves_more_than_a_bigger_cache(rows: list[tuple[list[int], int]], small: int) -> None:
    reqs = [traces.TraceRequest(i + 1, float(i), n, 1, tuple(h)) for i, (h, n) in enumerate(rows)]
    a, b = traces.reuse(reqs, 16, small), traces.reuse(reqs, 16, small + 7)
    inf = traces.reuse(reqs, 16)
    assert a.cached_tokens <= b.cached_tokens <= inf.cached_tokens <= inf.prompt_tokens


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.floats(0, 1e6), st.integers(1, 10**6), st.integers(0, 10**5), ids), min_size=1, max_size=20)
)
def test_valid_lines_read_back_as_written(tmp_path_factory: pytest.TempPathFactory, rows: list) -> None:
    rows = sorted(rows)
    path = write(tmp_path_factory.mktemp("p") / "t.jsonl", [mc(ts, n, h, out) for ts, n, out, h in rows])
    got = traces.read(path).requests
    assert [(r.timestamp_s, r.input_length, r.output_length, list(r.hash_ids)) for r in got] == [
        (ts * traces.TIMESTAMP_TO_S["mooncake"], n, out, h) for ts, n, out, h in rows
    ]


def test_inspect_the_shipped_samples(tmp_path: Path) -> None:
    r = cli(
        "trace",
        "inspect",
        str(SAMPLES / "mooncake-sample.jsonl"),
        "--lru-blocks",
        "60",
        "--json",
        str(tmp_path / "m.json"),
    )
    assert r.returncode == 0, r.stderr
    assert "300 requests (mooncake format, 512-token blocks)" in r.stdout.replace("\n", " ")
    doc = json.loads((tmp_path / "m.json").read_text())
    trace = traces.read(SAMPLES / "mooncake-sample.jsonl")
    assert doc["requests"] == 300 and len(doc["arrival_rate"]) == 10
    assert [u["capacity_blocks"] for u in doc["reuse"]] == [None, 60]
    assert doc["reuse"][1]["cached_tokens"] == traces.reuse(trace.requests, 512, 60).cached_tokens
    assert 0 < doc["reuse"][1]["share"] < doc["reuse"][0]["share"] < 1
    b = cli("trace", "inspect", str(SAMPLES / "bailian-sample.jsonl"))
    assert b.returncode == 0 and "bailian format, 16-token blocks" in b.stdout.replace("\n", " ")


def test_inspect_bad_input_exits_2_without_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [mc(0, 600, [1]), {"timestamp": 1}])
    r = cli("trace", "inspect", str(path))
    assert r.returncode == 2 and f"{path}:2: input_length: missing" in r.stderr.replace("\n", "")
    assert "Traceback" not in r.stderr
    r = cli("trace", "inspect", str(path), "--skip-bad")
    assert r.returncode == 0 and "1 lines left out" in r.stdout
    for args in (["--lru-blocks", "0"], ["--block-tokens", "0"]):
        r = cli("trace", "inspect", str(path), *args)
        assert r.returncode == 2 and "expected" in r.stderr
    r = cli("trace", "inspect", str(tmp_path / "none.jsonl"))
    assert r.returncode == 2 and "cannot read the trace" in r.stderr


@pytest.mark.parametrize("name", ["mooncake-sample.jsonl", "bailian-sample.jsonl"])
def test_trace_curve_gives_what_an_lru_of_each_capacity_serves(tmp_path: Path, name: str) -> None:
    """`kvbench trace curve`, every block kept: at every capacity up to 128 blocks, and at every
    step's end past it, the tokens a brute-force LRU of that capacity serves (traces.reuse); at
    a sample of a tenth, a curve that says it is one, with its estimated error."""
    r = cli("trace", "curve", str(SAMPLES / name), "--json", str(tmp_path / "c.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    trace = traces.read(SAMPLES / name)
    steps = doc["curve"]
    assert (
        doc["requests"] == len(trace.requests) and doc["sample"]["rate"] == 1 and doc["sample"]["error_estimate"] == 0
    )

    def served(capacity: int) -> float:
        return max([0, *(s["cached_tokens"] for s in steps if s["capacity_blocks"] <= capacity)])

    for capacity in [*range(1, 129), *(s["capacity_blocks"] for s in steps)]:
        assert served(capacity) == traces.reuse(trace.requests, trace.block_tokens, capacity).cached_tokens, capacity
    assert served(10**9) == traces.reuse(trace.requests, trace.block_tokens).cached_tokens
    points = doc["points"]  # each power of two of blocks, to past the last step; the knee among them
    assert [p["capacity_blocks"] for p in points] == [2**e for e in range(len(points))]
    assert points[-1]["capacity_blocks"] >= steps[-1]["capacity_blocks"] and doc["kv_bytes_per_token"] is None
    assert all(p["share"] == served(p["capacity_blocks"]) / doc["prompt_tokens"] for p in points)
    shares = {p["capacity_blocks"]: p["share"] for p in points}
    knee = doc["knee_blocks"]
    assert knee is not None and (knee == 1 or shares[knee] - shares[knee // 2] >= 0.01)
    assert all(shares[c * 2] - shares[c] < 0.01 for c in shares if knee <= c < points[-1]["capacity_blocks"])
    r = cli("trace", "curve", str(SAMPLES / name), "--kv-bytes-per-token", "2.5", "--json", str(tmp_path / "b.json"))
    sized = json.loads((tmp_path / "b.json").read_text())
    assert r.returncode == 0 and f"knee: {knee:,} blocks ({knee * trace.block_tokens * 2.5:,.0f} bytes)" in r.stdout
    assert (
        sized["knee_bytes"] == knee * trace.block_tokens * 2.5
        and sized["points"][0]["capacity_bytes"] == trace.block_tokens * 2.5
    )
    r = cli("trace", "curve", str(SAMPLES / name), "--sample", "0.1", "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0 and "sampled (SHARDS) at 0.1" in r.stdout and "estimated error" in r.stdout, r.stderr
    sample = json.loads((tmp_path / "s.json").read_text())["sample"]
    assert sample["rate"] == 0.1 and sample["kept_references"] < doc["references"] and sample["error_estimate"] > 0
    assert sample["skewed"] == (sample["heavy_references"] >= 0.6 * doc["references"])
    assert sample["skewed"] == ("warning: the heavy blocks are" in r.stdout)


def test_trace_curve_reads_lines_of_many_ids_in_bounded_chunks(tmp_path: Path) -> None:
    """Lines of 400,000 hash ids each: a chunk ends once its ids reach a million (the third line
    starts the next), and the curve across the cut is what a brute-force LRU serves."""
    n = 400_000
    rows = [mc(0, n + 1, list(range(n))), mc(1, n + 1, list(range(n, 2 * n))), mc(2, n + 1, list(range(n)))]
    path = write(tmp_path / "t.jsonl", rows)
    r = cli("trace", "curve", str(path), "--block-tokens", "1", "--json", str(tmp_path / "c.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    trace = traces.read(path, block_tokens=1)
    assert doc["requests"] == 3 and doc["references"] == 3 * n
    for step in doc["curve"]:
        assert step["cached_tokens"] == traces.reuse(trace.requests, 1, step["capacity_blocks"]).cached_tokens
    assert doc["curve"][-1]["cached_tokens"] == n == traces.reuse(trace.requests, 1).cached_tokens


def test_trace_curve_warns_of_lengths_that_do_not_fit_their_hash_ids(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [mc(0, 600, [1]), mc(1, 5000, [1, 2]), mc(2, 1100, [1, 2])])
    r = cli("trace", "curve", str(path), "--json", str(tmp_path / "c.json"))
    assert r.returncode == 0 and "warning: 1 lines' input_length is more than a block" in r.stdout.replace("\n", " ")
    assert json.loads((tmp_path / "c.json").read_text())["misfit_lines"] == 1


def test_an_unsigned_64_bit_hash_id_is_sized_by_its_bits(tmp_path: Path) -> None:
    """A hash id past 2^63 (an unsigned 64-bit hash) is read, by `kvbench trace curve` and
    `kvbench size`'s columns, as the signed id of the same bits: one block, however written."""
    top = (1 << 64) - 1
    path = write(tmp_path / "t.jsonl", [mc(0, 1200, [top, 1 << 63, 5]), mc(1, 1200, [-1, -(1 << 63), 5])])
    r = cli("trace", "curve", str(path), "--json", str(tmp_path / "c.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["curve"][-1]["cached_tokens"] == 1024  # the second request's first two blocks are the first's


def test_trace_curve_bad_input_exits_2_without_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [mc(0, 600, [1]), {"timestamp": 1}])
    for args in ([], ["--sample", "0.5"]):
        r = cli("trace", "curve", str(path), *args)
        assert r.returncode == 2 and f"{path}:2: input_length: missing" in r.stderr.replace("\n", ""), r.stderr
        assert "Traceback" not in r.stderr
    r = cli("trace", "curve", str(path), "--skip-bad", "--sample", "0.5")
    assert r.returncode == 0 and "1 lines left out" in r.stdout
    for args in (
        ["--sample", "0"],
        ["--sample", "1e-9"],
        ["--sample", "1.5"],
        ["--sample", "nan"],
        ["--block-tokens", "0"],
        ["--kv-bytes-per-token", "0"],
        ["--kv-bytes-per-token", "inf"],
    ):
        r = cli("trace", "curve", str(path), "--skip-bad", *args)
        assert r.returncode == 2 and "expected" in r.stderr and "Traceback" not in r.stderr, args
    (tmp_path / "empty.jsonl").write_text("\n")
    r = cli("trace", "curve", str(tmp_path / "empty.jsonl"))
    assert r.returncode == 2 and "no trace requests" in r.stderr


def test_a_deeply_nested_line_is_a_clear_error(tmp_path: Path) -> None:
    """A trace line, or a prompts-file line, nested 100,000 deep: exit 2 naming file and line,
    never a RecursionError traceback (trace inspect, validate of a trace scenario, run with a
    prompts file)."""
    deep = "[" * 100_000 + "]" * 100_000
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(mc(0, 600, [1])) + "\n" + deep + "\n")
    r = cli("trace", "inspect", str(trace))
    assert r.returncode == 2 and f"{trace}:2: not JSON: nested too deeply" in r.stderr.replace("\n", ""), r.stderr
    assert "Traceback" not in r.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(deep + "\n")
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'schema_version = 1\nname = "deep"\n[prompts]\nsource = "file"\npath = "{prompts}"\n'
        '[workload]\nkind = "closed_loop"\nrequests = 1\nconcurrency = 1\npool = 1\nprompt_tokens = 1\n'
    )
    r = kvbench("run", str(scenario), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "nested too deeply" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_possible_reuse_in_the_servers_blocks_bounds_what_it_can_serve() -> None:
    """Counted over the prompts as built (a shared 20-token head, then 64-token trace blocks, a
    partial last block the start of its id's text) in 16-token server blocks: a request shares
    its longest common prefix with the earlier ones, never its last token."""
    reqs = [
        traces.TraceRequest(1, 0.0, 20 + 64 + 30, 1, (1, 2)),  # 64 + a 30-token start of block 2
        traces.TraceRequest(2, 1.0, 20 + 128, 1, (1, 2)),  # block 1, then 30 of block 2 seen: 20 + 94
        traces.TraceRequest(3, 2.0, 20 + 64, 1, (9,)),  # only the head in common: 20 -> 16
        traces.TraceRequest(4, 3.0, 20 + 128, 1, (1, 2)),  # all of it seen: capped before the last token
    ]
    got = traces.reuse_served(reqs, 64, 16, 20)
    assert got.prompt_tokens == sum(r.input_length for r in reqs)
    assert got.cached_tokens == 0 + (114 // 16 * 16) + 16 + (147 // 16 * 16)
    # in the trace's own blocks the shared head and the partial block are not counted: less
    assert traces.reuse(reqs, 64).cached_tokens < got.cached_tokens
    # token-level servers (llama.cpp): every shared token
    assert traces.reuse_served(reqs, 64, 1, 20).cached_tokens == 0 + 114 + 20 + 147


def test_an_absurd_length_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    """A line asking for 10^9 tokens: `trace inspect` and `validate` refuse it (exit 2, file, line
    and field), as `run` does before building any prompt; the bound is the scenario's
    model.max_context_tokens (default 1,048,576) or --max-context-tokens."""
    path = write(tmp_path / "t.jsonl", [mc(0, 600, [1, 2]), mc(1, 10**9, [3, 4])])
    r = cli("trace", "inspect", str(path))
    said = f"{path}:2: input_length: 1,000,000,000 + output_length 10 exceeds the model's context (1,048,576 tokens"
    assert r.returncode == 2 and said in r.stderr.replace("\n", "") and "Traceback" not in r.stderr
    short = write(tmp_path / "s.jsonl", [mc(0, 600, [1, 2])])
    r = cli("trace", "inspect", str(short), "--max-context-tokens", "500")
    assert r.returncode == 2 and "(500 tokens, --max-context-tokens)" in r.stderr.replace("\n", "")
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'schema_version = 1\nname = "t"\n[workload]\nkind = "trace"\npath = "{path}"\n')
    for args in (["validate", str(scenario)], ["run", str(scenario), "--out", str(tmp_path / "out")]):
        r = kvbench(*args)
        assert r.returncode == 2 and f"{path}:2: input_length" in r.stderr.replace("\n", ""), r.stderr
    assert all(f.stat().st_size == 0 for f in (tmp_path / "out").rglob("requests.jsonl"))  # nothing sent


def test_lengths_that_do_not_fit_their_hash_ids_are_warned_of(tmp_path: Path) -> None:
    """input_length more than a block from what its hash_ids cover (600 tokens in ten 512-token
    blocks, 20,000 in one) is read, and said, by `trace inspect`, `validate` and `run`."""
    fits = [mc(0, 1000, [1, 2]), mc(1, 1024, [1, 3]), mc(2, 513, [1, 4])]
    assert traces.read(write(tmp_path / "ok.jsonl", fits)).misfit_lines == 0
    path = write(tmp_path / "t.jsonl", [*fits, mc(3, 600, list(range(10))), mc(4, 20_000, [7])])
    trace = traces.read(path)
    assert trace.misfit_lines == 2 and trace.misfits[0] == f"{path}:4: input_length 600 with 10 hash_ids"
    r = cli("trace", "inspect", str(path))
    assert r.returncode == 0 and "warning: 2 lines' input_length is more than a block" in r.stdout.replace("\n", "")
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'schema_version = 1\nname = "t"\n[workload]\nkind = "trace"\npath = "{path}"\n')
    r = cli("validate", str(scenario))
    assert r.returncode == 0 and "warning: 2 lines' input_length" in r.stderr.replace("\n", "")


def test_the_samples_are_what_their_generator_makes(tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in SAMPLES.glob("*.jsonl")}
    subprocess.run([sys.executable, str(SAMPLES / "make_samples.py")], check=True, capture_output=True)
    assert {p.name: p.read_bytes() for p in SAMPLES.glob("*.jsonl")} == before
