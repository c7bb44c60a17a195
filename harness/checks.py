"""Is a warm request warm, a cold one cold, and did the server's own counters see cache hits?
The thresholds every such check applies (terminal warnings, run.json, metrics.json, report),
each defined once here."""

from __future__ import annotations

# A warm request is flagged when the server reports less than this share of it as cached
# (hits are block-aligned, so a fully warm prompt still reports slightly less than its length).
WARM_CACHED_SHARE = 0.9
# A phase's server-side hit ratio (from its Prometheus counters): below this, warm requests
# mostly missed the cache; above the cold limit, cold requests mostly hit it.
LOW_WARM_HIT_RATIO = 0.5
HIGH_COLD_HIT_RATIO = 0.5
# The tokens a chat template adds around every prompt, for result folders recorded before
# run.json kept the measured count (`cold_cached_allowance`): a cold request may find the
# template's fixed opening in cache, since it is the same for every prompt.
DEFAULT_TEMPLATE_TOKENS = 64


def warm_hit(cached_tokens: int, prompt_tokens: int) -> bool:
    return cached_tokens >= WARM_CACHED_SHARE * prompt_tokens


# Tokens any two of kvbench's prompts may share at their start beyond the template: a BOS token
# and the lead's opening ("[" and a digit or two); an engine finds them in whatever its slot held.
COLD_START_TOKENS = 4


def cold_allowance(shared_prefix_tokens: int, template_tokens: int) -> int:
    """Cached tokens a cold request may report: the shared prefix, the template's opening, and
    the few tokens every prompt starts with."""
    return shared_prefix_tokens + template_tokens + COLD_START_TOKENS


def allowance_of(meta: dict[str, object]) -> int:
    """The cold allowance a run applied (run.json), or the one it would have applied."""
    kept = meta.get("cold_cached_allowance")
    if isinstance(kept, int):
        return kept
    scenario = meta.get("scenario")
    workload = scenario.get("workload", {}) if isinstance(scenario, dict) else {}
    return cold_allowance(int(workload.get("shared_prefix_tokens") or 0), DEFAULT_TEMPLATE_TOKENS)
