"""`kind = "sessions"`: users holding multi-turn conversations. Each turn resends the whole
history: a system prompt all users share, the user's own context (a document), and every earlier
message with its answer, then the new message. The answers are text kvbench wrote
(`history = "synthetic"`, `answer_tokens` long: every prompt has an exact, known length) or the
server's own (`"real"`: a turn's prompt is known once the previous answer is in; its length is
the server's count, recorded as prompt_tokens, with no target). Between turns the
user thinks (`think_s`); whether the session's KV is still on the GPU, in a lower tier or gone
when the next turn comes is what the records show (`idle_s` beside TTFT and cached tokens).

Sessions start all at once or at `start_rate` (Poisson), at most `max_active` at a time. A
session is the unit a process owns with `--workers`: its turns are sent in order, by one process."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

from harness.config.kinds.sessions import SessionsConfig
from harness.core import aio
from harness.inputs.prompts import BlockPrompts, Prompt
from harness.workloads import open_loop
from harness.workloads.base import Plan, Schedule, Sender
from harness.workloads.kind import Driver, Taken


@dataclass(frozen=True)
class SessionPlan:
    """One user's conversation: its prompts (indexes into Plan.prompts) in turn order, the think
    time after each turn but the last, and when it starts (model s after the arm's start)."""

    prompts: tuple[int, ...]
    think_s: tuple[float, ...]
    start_s: float = 0.0


# The kind's own part of its Plan (Plan.own): schedule index u is conversation u
Conversations = tuple[SessionPlan, ...]


def conversations(plan: Plan[Conversations]) -> Conversations:
    assert plan.own is not None, "a sessions plan has its conversations"
    return plan.own


class Sessions(Driver[SessionsConfig]):
    config = SessionsConfig

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan[Conversations]:
        return await plan(self.cfg(sender.spec.scenario), sender)

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        await drive(self.cfg(sender.spec.scenario), sender, plan, take, connections)

    def untaken(self, plan: Plan, index: int, prompt: int, seen: Taken) -> list[tuple[int, dict[str, Any]]]:
        """The session's turns not reported: the one in flight, and those it would have sent after."""
        prompts = conversations(plan)[index].prompts
        return [(prompts[t], {"session": index, "turn": t + 1}) for t in range(seen.turns.get(index, 0), len(prompts))]


DRIVER = Sessions()


async def plan(w: SessionsConfig, sender: Sender) -> Plan[Conversations]:
    sc = sender.spec.scenario
    seed = w.seed_of(sc)
    sender.progress.note(f"building {w.users} sessions")
    pieces = BlockPrompts(sender.builder, 1)  # its pieces of exact length; no trace blocks
    lead = sender.builder.reuse_lead("sessions")
    await pieces.calibrate(lead)
    system = pieces.piece("system", w.system_prompt_tokens) if w.system_prompt_tokens else None
    prompts: list[Prompt] = []
    sessions: list[SessionPlan] = []
    real = w.history == "real"
    for u, ((messages, waits), start) in enumerate(zip(w.shape(seed), w.starts(seed), strict=True)):
        parts = [p for p in (system, pieces.piece(f"context/{u}", w.user_context_tokens)) if p]
        size = pieces.fixed + w.system_prompt_tokens + w.user_context_tokens
        own = []
        for k, m in enumerate(messages, 1):
            parts.append(pieces.piece(f"message/{u}/{k}", m))
            size += m
            own.append(len(prompts))
            prompts.append(Prompt(f"u{u}-t{k}", lead, "", size, None, w.answer_tokens, tuple(parts)))
            if not real:  # real answers are put in at send time (with_answers)
                parts.append(pieces.piece(f"answer/{u}/{k}", w.answer_tokens))
                size += w.answer_tokens
        sessions.append(SessionPlan(tuple(own), tuple(waits), start))
    return Plan(len(prompts), tuple(prompts), tuple((u, 0) for u in range(w.users)), own=tuple(sessions))


def with_answers(prompt: Prompt, answers: list[str]) -> Prompt:
    """A real-history turn: its messages (the last `len(answers) + 1` parts) with the server's
    answers to the earlier ones put in between, each straight after its message, as the model
    wrote it (the KV the server made while answering can then serve the next turn). Its length
    is the server's to count: no target (the answer's tokens, reasoning left out, are not known)."""
    k = len(answers)
    base = len(prompt.parts) - k - 1
    parts = list(prompt.parts[:base])
    parts += [message + answer for message, answer in zip(prompt.parts[base:-1], answers, strict=True)]
    parts.append(prompt.parts[-1])
    return replace(prompt, target_tokens=None, parts=tuple(parts))


async def drive(
    w: SessionsConfig, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None
) -> None:
    spec = sender.spec
    clock = spec.clock
    share = spec.connections if connections is None else connections
    if share < 1:  # a process of several dealt no session slot: the others send them all
        return
    slots = asyncio.Semaphore(share)
    real = w.history == "real"
    queue = take if take is not None else Schedule(plan.schedule)
    tasks: set[asyncio.Task[None]] = set()

    async def session(u: int, held: float | None) -> None:
        s = conversations(plan)[u]
        try:
            # each turn's intended time (model seconds): the session's start, then the end of the
            # turn before plus the think time; its lag is recorded as an open loop's is
            intended = s.start_s
            last_end: float | None = None
            answers: list[str] = []  # real history: the server's answers so far
            for k, p in enumerate(s.prompts):
                await open_loop.until(clock.t0_ns + round(clock.wall_s(intended) * 1e9))
                if sender.stop.is_set():
                    return
                prompt = with_answers(plan.prompts[p], answers) if answers else plan.prompts[p]
                now = clock.since_start(time.perf_counter_ns())
                idle = None if last_end is None else round(now - last_end, 7)
                kept: list[str] | None = [] if real else None
                r = await sender.send(
                    prompt,
                    "run",
                    sender.lead_for(prompt),
                    answer=kept,
                    session=u,
                    turn=k + 1,
                    idle_s=idle,
                    intended_s=intended,
                    held_s=held if k == 0 else None,
                )
                sender.check_bust(r)
                if kept is not None:
                    answers.append("".join(kept))
                last_end = r.end_s() or clock.since_start(time.perf_counter_ns())
                if k < len(s.think_s):
                    intended = last_end + s.think_s[k]
        finally:
            slots.release()

    while not sender.stop.is_set():
        held_ns = await open_loop.hold(slots, sender.client.turns)  # a session held back by max_active starts late
        try:
            u, _ = await anext(queue)
        except StopAsyncIteration:
            slots.release()
            break
        task = asyncio.create_task(session(u, None if held_ns is None else clock.between(0, held_ns)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await aio.together(*tasks)
