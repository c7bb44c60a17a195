"""Engines kvbench can start itself for a scenario (`[engine]`): llama.cpp's llama-server
(llamacpp.py) and NVIDIA Dynamo's frontend over its mocker workers (dynamo.py), with models made
locally (no model hub). Each kind's module owns how it starts; `start` picks it by the config."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.config.engines import EngineCfg


@dataclass
class Started:
    """An engine kvbench started for a run: its URL, what run.json says of it, and what the run
    must do to use it."""

    base_url: str
    # run.json's `engine`, as the arm now running has it (`reset` may change it for an arm)
    info: dict[str, Any] = field(default_factory=dict)
    slot_dir: Path | None = None  # where its slot files are (llama.cpp's warm_from = "disk")
    tokenizer: str | None = None  # the model's tokenizer, for exact prompt lengths (no /tokenize)
    # fields every request body carries, by the request's max_tokens (a picklable function:
    # client processes build bodies too)
    body_fields: Callable[[int], dict[str, Any]] | None = None
    # empties the engine's KV cache where an arm's `before` runs, for arms with no `before` of
    # their own, and sets it up as that arm's config says (Arm.engine; None: the run's)
    # (blocking); returns what it did, for run.json's `before_hook`
    reset: Callable[[EngineCfg | None], str] | None = None
    # its own processes' /metrics, scraped beside the endpoint's, by URL -> a name for each
    # (workers serving the same metric names); as the arm now running has them
    metrics_urls: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def start(cfg: EngineCfg, where: str, answer_lengths: Collection[int]) -> Iterator[Started]:
    """The engine `cfg` describes, stopped on the way out whatever happens; `answer_lengths`:
    every max_tokens the run's requests ask for (an engine that must be told them beforehand)."""
    if cfg.kind == "dynamo":
        from harness.engines import dynamo

        with dynamo.start(cfg, where, answer_lengths) as started:
            yield started
    else:
        from harness.engines import llamacpp

        with llamacpp.start(cfg, where) as started:
            yield started
