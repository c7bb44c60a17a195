"""`kind = "sessions"`: users holding multi-turn conversations. Each turn resends the whole
history: a system prompt all users share, the user's own context (a document), and every earlier
message with the answer kvbench wrote for it (`answer_tokens` long: the server's own answers are
not used, so every prompt has an exact, known length), then the new message. Between turns the
user thinks (`think_s`); whether the session's KV is still on the GPU, in a lower tier or gone
when the next turn comes is what the records show (`idle_s` beside TTFT and cached tokens).

Sessions start all at once or at `start_rate` (Poisson), at most `max_active` at a time. A
session is the unit a process owns with `--workers`: its turns are sent in order, by one process."""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np

from harness.prompts import BlockPrompts, Prompt
from harness.scenario import Seconds, Workload
from harness.workloads import open_loop, schedule
from harness.workloads.base import Plan, Schedule, Sender, SessionPlan, draw_length

NAME = "sessions"
SHARES_SCHEDULE = True


def think(d: Seconds, rng: random.Random) -> float:
    if d.kind == "fixed":
        return d.value
    if d.kind == "uniform":
        return rng.uniform(d.min, d.max)
    return rng.expovariate(1.0 / d.mean)


def shape(w: Workload, seed: int) -> list[tuple[list[int], list[float]]]:
    """Per user: message tokens per turn, think times between turns (pure, seeded)."""
    assert w.turns is not None and w.message_tokens is not None and w.think_s is not None
    out = []
    for u in range(w.users):
        rng = random.Random(f"{seed}/session/{u}")
        n = max(1, draw_length(w.turns, rng))
        out.append(
            ([draw_length(w.message_tokens, rng) for _ in range(n)], [think(w.think_s, rng) for _ in range(n - 1)])
        )
    return out


def starts(w: Workload, seed: int) -> list[float]:
    if w.start_rate is None:
        return [0.0] * w.users
    g = schedule.gaps("poisson", w.start_rate, w.users, 1.0, np.random.default_rng([seed, 7]))
    return [0.0, *np.cumsum(g[:-1]).tolist()]


async def plan(sender: Sender, prior: Plan | None = None) -> Plan:
    sc = sender.spec.scenario
    w = sc.workload
    seed = sc.prompts.seed if w.seed is None else w.seed
    sender.progress.note(f"building {w.users} sessions")
    pieces = BlockPrompts(sender.builder, 1)  # its pieces of exact length; no trace blocks
    lead = sender.builder.reuse_lead("sessions")
    await pieces.calibrate(lead)
    system = pieces.piece("system", w.system_prompt_tokens) if w.system_prompt_tokens else None
    prompts: list[Prompt] = []
    sessions: list[SessionPlan] = []
    for u, ((messages, waits), start) in enumerate(zip(shape(w, seed), starts(w, seed), strict=True)):
        parts = [p for p in (system, pieces.piece(f"context/{u}", w.user_context_tokens)) if p]
        size = pieces.fixed + w.system_prompt_tokens + w.user_context_tokens
        own = []
        for k, m in enumerate(messages, 1):
            parts.append(pieces.piece(f"message/{u}/{k}", m))
            size += m
            own.append(len(prompts))
            prompts.append(Prompt(f"u{u}-t{k}", lead, "", size, None, w.answer_tokens, tuple(parts)))
            parts.append(pieces.piece(f"answer/{u}/{k}", w.answer_tokens))
            size += w.answer_tokens
        sessions.append(SessionPlan(tuple(own), tuple(waits), start))
    return Plan(len(prompts), tuple(prompts), tuple((u, 0) for u in range(w.users)), sessions=tuple(sessions))


async def drive(
    sender: Sender,
    plan: Plan,
    take: Schedule | None = None,
    connections: int | None = None,
    first: int = 0,
) -> None:
    spec = sender.spec
    clock = spec.clock
    share = spec.connections if connections is None else connections
    if share < 1:  # a process of several dealt no session slot: the others send them all
        return
    slots = asyncio.Semaphore(share)
    queue = take if take is not None else Schedule(iter(plan.schedule))
    tasks: set[asyncio.Task[None]] = set()

    async def session(u: int) -> None:
        s = plan.sessions[u]
        try:
            await open_loop.until(clock.t0_ns + round(clock.wall_s(s.start_s) * 1e9))
            last_end: float | None = None
            for k, p in enumerate(s.prompts):
                if sender.stop.is_set():
                    return
                prompt = plan.prompts[p]
                now = clock.since_start(time.perf_counter_ns())
                idle = None if last_end is None else round(now - last_end, 7)
                r = await sender.send(prompt, "run", sender.lead_for(prompt), session=u, turn=k + 1, idle_s=idle)
                sender.check_bust(r)
                last_end = r.end_s() or clock.since_start(time.perf_counter_ns())
                if k < len(s.think_s):
                    await asyncio.sleep(clock.wall_s(s.think_s[k]))
        finally:
            slots.release()

    while not sender.stop.is_set():
        await slots.acquire()
        try:
            u, _ = next(queue)
        except StopIteration:
            slots.release()
            break
        task = asyncio.create_task(session(u))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
