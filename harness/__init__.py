"""kvbench: measure how much a shared KV-cache storage tier speeds up LLM inference."""

__version__ = "0.1.0"
