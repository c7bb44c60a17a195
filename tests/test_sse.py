"""The SSE decoder and the first-token rules, on golden transcripts split every possible way."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.wire.sse import SSEDecoder, SSEEvent, SSELimitError
from harness.wire.stream import StreamState, chunk_tokens

GOLDEN = Path(__file__).parent / "golden"


def decode(pieces: list[bytes]) -> list[SSEEvent]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for p in pieces:
        out += d.feed(p)
    return out + d.close()


def replay(pieces: list[bytes]) -> StreamState:
    """Feed pieces as reads; read i arrives at time i (ns), as the client stamps them."""
    d = SSEDecoder()
    state = StreamState()
    for t, p in enumerate(pieces):
        state.on_bytes(t)
        for ev in d.feed(p):
            state.on_event(ev, t)
            if state.done:
                return state
    for ev in d.close():
        state.on_event(ev, len(pieces))
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


def test_role_only_chunk_is_not_the_first_token_and_reasoning_is() -> None:
    raw = (GOLDEN / "vllm_chat_reasoning.sse").read_bytes()
    reads = [r + b"\n\n" for r in raw.split(b"\n\n") if r]  # one event per read: read i at t=i
    s = replay(reads)
    assert s.first_byte_ns == 0
    assert s.first_token_ns == 1  # reasoning_content, not the role chunk at t=0
    assert s.first_content_ns == 3
    assert s.token_chunk_ns == [1, 2, 3]
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (10000, 4, 9984)
    assert s.done and s.error is None and s.finish_reason == "length"


def test_reasoning_field_crlf_comments_and_null_choices() -> None:
    raw = (GOLDEN / "crlf_reasoning_field.sse").read_bytes()
    s = replay([raw[:60], raw[60:]])
    assert s.first_token_ns is not None and s.prompt_tokens == 12 and s.cached_tokens is None and s.done


def test_usage_chunk_never_moves_first_token() -> None:
    s = StreamState()
    s.on_event(SSEEvent(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}'), 5)
    assert s.first_token_ns is None
    s.on_event(SSEEvent(b'{"choices":[{"delta":{"content":"a"}}]}'), 9)
    s.on_event(SSEEvent(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'), 12)
    assert s.first_token_ns == 9 and s.completion_tokens == 1


def test_error_event_inside_200_stream() -> None:
    s = replay([(GOLDEN / "error_in_stream.sse").read_bytes()])
    assert s.error == "500: CUDA out of memory"
    assert s.first_token_ns is None


def test_stops_at_done_even_with_more_bytes() -> None:
    s = replay([(GOLDEN / "completions_done_then_more.sse").read_bytes()])
    assert s.done and s.token_chunk_ns == [0, 0] and s.prompt_tokens == 5


def test_tool_call_is_a_token() -> None:
    s = replay([(GOLDEN / "tool_call.sse").read_bytes()])
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
