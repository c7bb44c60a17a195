"""The SSE decoder and the first-token rules, on golden transcripts split every possible way."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.wire.client import Exchange
from harness.wire.http1 import ResponseParser
from harness.wire.response import Response
from harness.wire.sse import MAX_LINE_BYTES, Run, SSEDecoder, SSEEvent, SSELimitError
from harness.wire.stream import CHUNKED_TEXT_MAX, FramePatterns, StreamState, chunk_tokens

GOLDEN = Path(__file__).parent / "golden"


def decode(pieces: list[bytes]) -> list[SSEEvent]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for p in pieces:
        out += d.feed(p)
    return out + d.close()


def replay(pieces: list[bytes], fast: bool = True, answer: list[str] | None = None) -> StreamState:
    """Feed pieces as reads, as the client does; read i arrives at time i (ns). `fast`: with the
    template fast path (runs of token chunks taken undecoded), else every chunk parsed."""
    state = StreamState(fast=fast, answer=answer)
    d = SSEDecoder(skip=state.run_end if fast else None)
    for t, p in enumerate(pieces):
        state.on_bytes(t)
        state.on_events(d.feed(p), t)
        if state.done:
            return state
    state.on_events(d.close(), len(pieces))
    return state


def events_of(name: str) -> list[bytes]:
    return [e.data for e in decode([(GOLDEN / name).read_bytes()])]


def test_lines_events_comments_and_fields() -> None:
    raw = b": comment\nevent: update\nid: 7\ndata: a\ndata:b\nretry: 10\nunknown: x\n\ndata: c\n\n"
    # The last event id persists across events, as the SSE spec says; the event type does not.
    assert decode([raw]) == [SSEEvent(b"a\nb", "update", "7"), SSEEvent(b"c", None, "7")]


def test_every_line_ending() -> None:
    for sep in (b"\n", b"\r\n", b"\r"):
        assert decode([b"data: x" + sep + sep + b"data: y" + sep + sep]) == [SSEEvent(b"x"), SSEEvent(b"y")]


def test_cr_at_end_of_read_is_not_two_lines() -> None:
    # "\r" then "\n" in the next read is one CRLF, not a line end followed by an empty line.
    assert decode([b"data: x\r", b"\ndata: y\r\n\r\n"]) == [SSEEvent(b"x\ny")]


def test_final_event_without_blank_line_is_kept() -> None:
    assert decode([b"data: tail"]) == [SSEEvent(b"tail")]


def test_very_long_line() -> None:
    big = b"x" * (5 << 20)
    assert decode([b"data: " + big[: 1 << 20], big[1 << 20 :] + b"\n\n"]) == [SSEEvent(big)]


def test_several_events_per_read() -> None:
    assert len(events_of("vllm_chat_reasoning.sse")) == 7


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.sse")))
def test_split_at_every_byte_boundary(name: str) -> None:
    raw = (GOLDEN / name).read_bytes()
    whole = decode([raw])
    for i in range(len(raw) + 1):
        assert decode([raw[:i], raw[i:]]) == whole, f"split at byte {i}"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_splitting_never_changes_events(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(p.name for p in GOLDEN.glob("*.sse"))))
    raw = (GOLDEN / name).read_bytes()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=40)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert decode(pieces) == decode([raw])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=50).filter(lambda b: b"\n" not in b and b"\r" not in b), max_size=8),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(0, 400), max_size=10),
)
def test_arbitrary_payloads_round_trip(payloads: list[bytes], sep: bytes, cuts: list[int]) -> None:
    raw = b"".join(b"data: " + p + sep + sep for p in payloads)
    cuts = sorted(c for c in cuts if c <= len(raw))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert [e.data for e in decode(pieces)] == payloads


@pytest.mark.parametrize("fast", [True, False])
def test_role_only_chunk_is_not_the_first_token_and_reasoning_is(fast: bool) -> None:
    raw = (GOLDEN / "vllm_chat_reasoning.sse").read_bytes()
    reads = [r + b"\n\n" for r in raw.split(b"\n\n") if r]  # one event per read: read i at t=i
    s = replay(reads, fast)
    assert s.first_byte_ns == 0
    assert s.first_token_ns == 1  # reasoning_content, not the role chunk at t=0
    assert s.first_content_ns == 3
    assert s.token_chunk_ns == [1, 2, 3]
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (10000, 4, 9984)
    assert s.done and s.error is None and s.finish_reason == "length"


@pytest.mark.parametrize("fast", [True, False])
def test_reasoning_field_crlf_comments_and_null_choices(fast: bool) -> None:
    raw = (GOLDEN / "crlf_reasoning_field.sse").read_bytes()
    s = replay([raw[:60], raw[60:]], fast)
    assert s.first_token_ns is not None and s.prompt_tokens == 12 and s.cached_tokens is None and s.done


def test_usage_chunk_never_moves_first_token() -> None:
    s = StreamState()
    s.on_event(SSEEvent(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}'), 5)
    assert s.first_token_ns is None
    s.on_event(SSEEvent(b'{"choices":[{"delta":{"content":"a"}}]}'), 9)
    s.on_event(SSEEvent(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'), 12)
    assert s.first_token_ns == 9 and s.completion_tokens == 1


@pytest.mark.parametrize("fast", [True, False])
def test_error_event_inside_200_stream(fast: bool) -> None:
    s = replay([(GOLDEN / "error_in_stream.sse").read_bytes()], fast)
    assert s.error == "500: CUDA out of memory"
    assert s.first_token_ns is None


@pytest.mark.parametrize("fast", [True, False])
def test_stops_at_done_even_with_more_bytes(fast: bool) -> None:
    s = replay([(GOLDEN / "completions_done_then_more.sse").read_bytes()], fast)
    assert s.done and s.token_chunk_ns == [0, 0] and s.prompt_tokens == 5


@pytest.mark.parametrize("fast", [True, False])
def test_tool_call_is_a_token(fast: bool) -> None:
    s = replay([(GOLDEN / "tool_call.sse").read_bytes()], fast)
    assert s.first_token_ns == 0 and s.first_content_ns is None


@pytest.mark.parametrize(
    ("chunk", "any_token", "content"),
    [
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, False, False),
        ({"choices": [{"delta": {"content": None}}]}, False, False),
        ({"choices": None}, False, False),
        ({"choices": []}, False, False),
        ({"choices": "junk"}, False, False),
        ({"choices": [{"delta": {"reasoning": "x"}}]}, True, False),
        ({"choices": [{"delta": {"reasoning_content": "x"}}]}, True, False),
        ({"choices": [{"delta": {"content": " "}}]}, True, True),
        ({"choices": [{"text": "x"}]}, True, True),
        ({"choices": [{"text": ""}]}, False, False),
    ],
)
def test_chunk_tokens(chunk: dict[str, object], any_token: bool, content: bool) -> None:
    got = chunk_tokens(chunk)
    assert (got.any_token, got.content) == (any_token, content)


def test_a_line_beyond_the_limit_is_refused_however_it_arrives() -> None:
    line = b"data: " + b"B" * 1000
    whole = SSEDecoder(max_line_bytes=999)
    with pytest.raises(SSELimitError, match="SSE line of more than 999 bytes"):
        whole.feed(line)
    pieces = SSEDecoder(max_line_bytes=999)
    with pytest.raises(SSELimitError):
        for i in range(0, len(line), 7):
            pieces.feed(line[i : i + 7])
    fits = SSEDecoder(max_line_bytes=len(line))
    assert [fits.feed(line[i : i + 7]) for i in range(0, len(line), 7)][-1] == []
    assert fits.feed(b"\n\n") == [SSEEvent(b"B" * 1000)]


def test_an_event_beyond_the_limit_is_refused() -> None:
    d = SSEDecoder(max_line_bytes=100)
    with pytest.raises(SSELimitError, match="SSE event"):
        d.feed(b"data: " + b"x" * 60 + b"\ndata: " + b"y" * 60 + b"\n")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=40))
def test_a_long_line_in_pieces_is_one_event(pieces: list[bytes]) -> None:
    body = b"".join(pieces).replace(b"\n", b"").replace(b"\r", b"")
    d = SSEDecoder()
    events = []
    for p in [b"data: ", *[body[i : i + 3] for i in range(0, len(body), 3)], b"\r", b"\n\n"]:
        events += d.feed(p)
    assert events == [SSEEvent(body)]


# --- the fast path (stream.Template): the same state as parsing every chunk ---

FIELDS = (
    "first_byte_ns",
    "first_token_ns",
    "first_content_ns",
    "token_chunk_ns",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "error",
    "done",
    "finish_reason",
)


def seen(pieces: list[bytes], fast: bool) -> dict[str, object]:
    """What a record is made of, with the answer's text, from one path."""
    answer: list[str] = []
    s = replay(pieces, fast, answer)
    return {**{f: getattr(s, f) for f in FIELDS}, "answer": "".join(answer)}


def sse_event(obj: object, ensure_ascii: bool = False, sep: bytes = b"\n") -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii).encode() + sep + sep


def vllm_chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-7",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def test_fast_path_takes_a_streams_token_chunks_in_runs() -> None:
    """A firehose-like stream (role chunk, 256 tokens written 32 at a time, usage, [DONE]): every
    token chunk but none of the others arrives in a Run, and the state is the full path's."""
    role = sse_event(vllm_chunk({"role": "assistant", "content": ""}))
    tokens = [sse_event(vllm_chunk({"content": f" w{i}"})) for i in range(256)]
    end = sse_event(vllm_chunk({}, "length")) + sse_event({"choices": [], "usage": {"prompt_tokens": 9}})
    reads = [role + tokens[0] + b"".join(tokens[1:33])]
    reads += [b"".join(tokens[i : i + 32]) for i in range(33, 256, 32)] + [end + b"data: [DONE]\n\n"]
    state = StreamState(answer=[])
    d = SSEDecoder(skip=state.run_end)
    in_runs = 0
    for t, p in enumerate(reads):
        events = d.feed(p)
        in_runs += sum(e.buf.count(b"\n\n", e.start, e.end) for e in events if isinstance(e, Run))
        state.on_events(events, t)
    assert in_runs == 256
    assert seen(reads, True) == seen(reads, False)
    assert seen(reads, True)["answer"] == "".join(f" w{i}" for i in range(256))


# Texts that a template must not swallow: quotes, escapes, control characters, non-ASCII, empty.
TEXTS = st.one_of(
    st.sampled_from([" the", " a", "x", "", '"', "\\", "\n", "é", "日本", "a\tb", "\u2028"]),
    st.text(max_size=6),
)


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """A stream of chunks as engines send them (one shape each), with chunks that a template must
    not take for its own: other fields beside the text, usage inside chunks, broken UTF-8."""
    shape = draw(st.sampled_from(["vllm", "bare", "completions", "changing-id", "usage-inside"]))
    ensure_ascii = draw(st.booleans())
    sep = draw(st.sampled_from([b"\n", b"\r\n"]))

    def chunk(i: int, delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        if shape == "vllm":
            return vllm_chunk(delta, finish)
        if shape == "changing-id":
            return {"id": f"c{i}", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if shape == "completions":
            return {"id": "cmpl", "choices": [{"index": 0, "text": delta.get("content", ""), "finish_reason": finish}]}
        if shape == "usage-inside":  # continuous usage stats, the same figures in every chunk
            return {"choices": [{"delta": delta}], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
        return {"choices": [{"delta": delta}]}

    def event(obj: object) -> bytes:
        return sse_event(obj, ensure_ascii, sep)

    kinds = ["content"] * 8 + ["reasoning"] * 3 + ["empty", "usage", "comment", "multiline", "continued", "junk"]
    kinds += ["beside", "bad-utf8"]
    out = [event(chunk(0, {"role": "assistant", "content": ""}))]
    for i in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(kinds))
        if kind in ("content", "reasoning", "empty"):
            field = "content" if kind != "reasoning" else draw(st.sampled_from(["reasoning_content", "reasoning"]))
            out.append(event(chunk(i, {field: draw(TEXTS) if kind != "empty" else ""})))
        elif kind == "beside":  # the text, then another field: the same bytes at both ends
            out.append(event(chunk(i, {"content": "b", draw(st.sampled_from(["role", "reasoning"])): "z"})))
        elif kind == "bad-utf8":
            out.append(event(chunk(i, {"content": "QQ"})).replace(b"QQ", b"Q\xff"))
        elif kind == "usage":
            out.append(sse_event({"choices": [], "usage": {"prompt_tokens": i, "completion_tokens": i}}, True, sep))
        elif kind == "comment":
            out.append(b": keep-alive" + sep + sep)
        elif kind in ("multiline", "continued"):  # a second data line; a line that is no field at all
            second = b"data: " if kind == "multiline" else b""
            text = json.dumps(draw(TEXTS)).encode()
            out.append(b'data: {"choices":[{"delta":' + sep + second + b'{"content":' + text + b"}}]}" + sep + sep)
        else:
            out.append(b"data: {not json" + sep + sep)
    tail = draw(st.sampled_from(["finish", "error", "none"]))
    if tail == "finish":
        out.append(event(chunk(99, {}, "stop")))
    elif tail == "error":
        out.append(sse_event({"error": {"message": "boom", "code": 500}}, True, sep))
    out.append(b"data: [DONE]" + sep + sep)
    return out


@settings(max_examples=400, deadline=None)
@given(streams(), st.data())
def test_fast_path_gives_what_parsing_every_chunk_gives(events: list[bytes], data: st.DataObject) -> None:
    raw = b"".join(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert seen(pieces, True) == seen(pieces, False)


def test_chunks_with_usage_inside_are_parsed_each_time() -> None:
    """Continuous usage stats: the figures of the last chunk stand, also after a usage-only chunk
    with others in between, so no template may take such chunks."""

    def chunk(text: str) -> bytes:
        return sse_event(
            {"choices": [{"delta": {"content": text}}], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
        )

    usage = sse_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
    reads = [chunk("a"), chunk("b"), usage + chunk("c") + chunk("d"), b"data: [DONE]\n\n"]
    assert seen(reads, True) == seen(reads, False)
    assert seen(reads, True)["prompt_tokens"] == 7


def test_a_template_is_never_learnt_from_an_event_of_several_lines() -> None:
    """An event whose data spans two `data:` lines holds a newline: a run taking the same bytes in
    one event, its second line no field at all, would count a chunk that does not parse."""
    two_lines = b'data: {"choices":[{"delta":\ndata: {"content":"a"}}]}\n\n'
    no_field = b'data: {"choices":[{"delta":\n{"content":"b"}}]}\n\n'
    reads = [two_lines, no_field + no_field, b"data: [DONE]\n\n"]
    assert seen(reads, True) == seen(reads, False)
    assert str(seen(reads, True)["error"]).startswith("malformed SSE data")


def fast_and_full(chunks: list[bytes], reads_at: list[int], upper: bool = False) -> tuple[dict[str, object], ...]:
    """The state response.Response gives for a body sent as these HTTP chunks and read in pieces
    cut at `reads_at` (runs of whole token chunks taken above llhttp), and the state the body's
    bytes each read completes give, every chunk parsed by llhttp, parsed event by event."""
    size = b"%X" if upper else b"%x"
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw += b"".join(size % len(c) + b"\r\n" + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    cuts = sorted(min(c, len(raw)) for c in reads_at)
    reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]

    ex = Exchange(start_ns=0)
    ex.state.answer = []
    response = Response(ex, MAX_LINE_BYTES, FramePatterns())
    for t, r in enumerate(reads):
        response.feed(t, r)
        if response.ended():  # as transport.Reader stops
            break

    ref = StreamState(fast=False, answer=[])
    decoder = SSEDecoder()
    got: list[bytes] = []
    parser = ResponseParser()
    for t, r in enumerate(reads):
        got.clear()
        parser.feed(r, got.append)
        piece = b"".join(got)
        over = ref.done or ref.error  # the client reads no further (client.py)
        if piece and not over:
            ref.on_bytes(t)
            ref.on_events(decoder.feed(piece), t)
        if parser.done:
            if not (ref.done or ref.error):
                ref.on_events(decoder.close(), t)
            break
    return tuple({**{f: getattr(s, f) for f in FIELDS}, "answer": "".join(s.answer or ())} for s in (ex.state, ref))


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_the_fast_path_gives_what_parsing_every_chunk_gives(events: list[bytes], data: st.DataObject) -> None:
    """A stream as HTTP chunks (one event each, as engines send them, or cut anywhere; sizes in
    either case), read by response.Response, which takes runs of whole token chunks from the raw
    bytes above llhttp: the same state, read for read, as the body each read completes parsed
    event by event."""
    body = b"".join(events)
    if data.draw(st.booleans()):
        chunks = events
    else:
        cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=12))))
        chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]
    reads_at = data.draw(st.lists(st.integers(0, len(body) * 2), max_size=16))
    fast, full = fast_and_full(chunks, reads_at, data.draw(st.booleans()))
    assert fast == full


def test_a_whole_response_in_one_read_is_taken_in_runs_after_its_first_token() -> None:
    """A response whose head, role chunk and 256 token chunks come in one read (a firehose, or a
    server that buffers): the head, the role chunk and the first token chunk (which teaches the
    template) are parsed; the other token chunks are taken as a run, never decoded; the same in
    reads cut after a chunk's end."""

    role = sse_event(vllm_chunk({"role": "assistant", "content": ""}))
    tokens = [sse_event(vllm_chunk({"content": f" w{i}"})) for i in range(256)]
    chunks = [role, *tokens, sse_event(vllm_chunk({}, "length")), b"data: [DONE]\n\n"]
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw += b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"

    class Counted:
        def __init__(self, decoder: SSEDecoder) -> None:
            self.decoder, self.fed = decoder, 0

        def feed(self, data: bytes) -> list[SSEEvent | Run]:
            self.fed += len(data)
            return self.decoder.feed(data)

        def __getattr__(self, name: str) -> object:
            return getattr(self.decoder, name)

    def slices(data: bytes, size: int = 8192) -> list[bytes]:  # reads that end where a chunk does
        out = []
        while len(data) > size:
            cut = data.rfind(b"\n\r\n", 0, size) + 3
            out.append(data[:cut])
            data = data[cut:]
        return [*out, data]

    for reads in ([raw], slices(raw)):
        ex = Exchange(start_ns=0)
        response = Response(ex, MAX_LINE_BYTES, FramePatterns())
        counted = response.decoder = Counted(response.decoder)  # type: ignore[assignment]
        for t, r in enumerate(reads):
            response.feed(t, r)
        assert len(ex.state.token_chunk_ns) == 256 and ex.state.done
        assert counted.fed < len(role) + 3 * len(tokens[0]) + len(chunks[-2]) + len(chunks[-1])


@pytest.mark.parametrize("upper", [False, True])
def test_the_fast_path_on_a_firehose(upper: bool) -> None:
    """An engine's stream, an event per chunk, written 32 chunks at a time and read as written
    or cut anywhere: the same state as parsing every chunk."""
    role = sse_event(vllm_chunk({"role": "assistant", "content": ""}))
    tokens = [sse_event(vllm_chunk({"content": f" w{i}"})) for i in range(256)]
    end = [sse_event(vllm_chunk({}, "length")), sse_event({"choices": [], "usage": {"prompt_tokens": 9}})]
    chunks = [role, *tokens, *end, b"data: [DONE]\n\n"]
    head = len(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    lengths = [len(b"%x\r\n%s\r\n" % (len(c), c)) for c in chunks]
    as_written = [head + sum(lengths[: 2 + 32 * k]) for k in range(9)]
    rng = random.Random(7)
    for reads_at in (as_written, [rng.randrange(50_000) for _ in range(40)]):
        fast, full = fast_and_full(chunks, reads_at, upper)
        assert fast == full and len(full["token_chunk_ns"]) == 256  # type: ignore[arg-type]


def test_a_chunked_run_checks_every_chunk_size() -> None:
    """StreamState.chunked_run_end: whole chunks of token events are taken from their raw bytes only where
    each chunk's size (in either case) is its event's length, and each text is short and plain."""
    events = [sse_event(vllm_chunk({"content": t})) for t in (" a", " bb", " ccc")]
    state = StreamState()
    state.on_events(SSEDecoder(skip=state.run_end).feed(events[0]), 0)  # learns the template
    assert state.template is not None
    frames = FramePatterns()

    def framed(evs: list[bytes], size: bytes = b"%x") -> bytes:
        return b"".join(size % len(e) + b"\r\n" + e + b"\r\n" for e in evs)

    run = framed(events * 10)
    assert state.chunked_run_end(run + b"0\r\n\r\n", 0, frames) == len(run)
    assert state.chunked_run_end(framed(events * 10, b"%X"), 0, frames) == len(run)
    one = len(framed(events[:1]))
    for lie in (-1, 1, 16):  # sizes that are not the event's length: not taken
        lying = framed(events[:1]) + b"%x\r\n%s\r\n" % (len(events[1]) + lie, events[1])
        assert state.chunked_run_end(lying, 0, frames) == one
    long_text = sse_event(vllm_chunk({"content": "x" * (CHUNKED_TEXT_MAX + 1)}))
    escaped = sse_event(vllm_chunk({"content": 'a"b'}))
    assert state.chunked_run_end(framed([events[0], long_text, events[0]]), 0, frames) == one
    assert state.chunked_run_end(framed([events[0], escaped]), 0, frames) == one
    # the same lengths, other bytes (another request's id; another field's value): not taken
    for other in (events[1].replace(b"chatcmpl-7", b"chatcmpl-8"), events[1].replace(b"null}]}", b"nul1}]}")):
        assert state.chunked_run_end(framed([events[0], other, events[0]]), 0, frames) == 0


def test_a_client_compiles_each_frame_pattern_once_and_keeps_at_most_its_bound() -> None:
    """Patterns belong to the FramePatterns a client hands its responses: compiled at the first
    ask, the same object after, and no more than KEEP of them kept whatever templates a server
    makes a stream learn."""
    frames = FramePatterns()
    first = frames.get(40, 30, False)
    assert frames.get(40, 30, False) is first and frames.get(40, 30, True) is not first
    for n in range(FramePatterns.KEEP + 5):
        frames.get(n, 1, False)
    assert len(frames) == FramePatterns.KEEP
