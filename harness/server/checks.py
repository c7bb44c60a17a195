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


# A block size read off cached counts (a power of two dividing one) is believed from this size up:
# smaller powers of two divide many counts by chance.
MIN_INFERRED_BLOCK = 16
MAX_INFERRED_BLOCK = 256  # vLLM (16; 128 on CPU), SGLang, Dynamo use blocks up to this size


def full_blocks(prompt_tokens: int, block: int) -> int:
    """The tokens of a prompt an engine caching whole blocks can serve: every full block before
    the last token (which is always computed)."""
    return (prompt_tokens - 1) // block * block


def warm_hit(cached_tokens: int, prompt_tokens: int, block: int | None = None) -> bool:
    """Was a warm request served from cache? With the server's block size: all of its full
    blocks; without: WARM_CACHED_SHARE of the prompt, or all full blocks of the largest block
    size the cached count is a multiple of (inferred_block)."""
    if block is not None:
        return cached_tokens >= full_blocks(prompt_tokens, block)
    if cached_tokens >= WARM_CACHED_SHARE * prompt_tokens:
        return True
    b = inferred_block(cached_tokens)
    return b is not None and cached_tokens >= full_blocks(prompt_tokens, b)


def inferred_block(cached_tokens: int) -> int | None:
    """The largest power of two (MIN_INFERRED_BLOCK to MAX_INFERRED_BLOCK) that a cached count is
    a multiple of: the block size of a server that caches whole blocks, as far as one count says."""
    if cached_tokens <= 0:
        return None
    b = min(cached_tokens & -cached_tokens, MAX_INFERRED_BLOCK)
    return b if b >= MIN_INFERRED_BLOCK else None


def warm_rule(block: int | None, source: str) -> dict[str, object]:
    """run.json's `warm_rule`: what a warm request had to get from cache, and why."""
    if block is not None:
        return {
            "block_tokens": block,
            "source": source,
            "rule": f"cached tokens >= every full {block}-token block before the prompt's last token",
        }
    return {
        "block_tokens": None,
        "source": "unknown block size",
        "rule": (
            f"cached tokens >= {WARM_CACHED_SHARE:.0%} of the prompt, or every full block before the last token "
            f"for the largest power-of-two block ({MIN_INFERRED_BLOCK} to {MAX_INFERRED_BLOCK}) the count is a "
            "multiple of"
        ),
    }


def block_of(meta: dict[str, object]) -> int | None:
    """The block size a run's warm check applied (run.json), if it knew one."""
    rule = meta.get("warm_rule")
    b = rule.get("block_tokens") if isinstance(rule, dict) else None
    return b if isinstance(b, int) and b > 0 else None


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
