"""The model's context as kvbench knows it before a run, for `run` and `validate` (which must
not import what sends requests to find it)."""

from __future__ import annotations

from harness.config import scenario
from harness.config.context import Context
from harness.config.engines import EngineCfg


def known_context(sc: scenario.Scenario, emulated: bool, engine: EngineCfg | None) -> Context:
    """The model's context where kvbench knows it before the run (the embedded emulator's profile,
    the llama.cpp it starts), when it is shorter than the scenario's bound; else the scenario's.
    Another server's is not asked for: it refuses longer prompts itself (an `http` error)."""
    own = Context.of(sc)
    if emulated:
        from harness.emulator.profiles import get_profile

        try:
            profile = get_profile(sc.emulator.profile)
            known = Context(profile.max_model_len, f"emulator profile {sc.emulator.profile}")
        except (KeyError, ValueError):  # an unknown profile is said where the emulator starts
            return own
    elif engine is not None:
        known = engine.context
    else:
        return own
    return known if known.tokens < own.tokens else own
