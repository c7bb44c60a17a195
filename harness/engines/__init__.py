"""Engines kvbench can start itself for a scenario (`[engine]`): llama.cpp's llama-server, with
models made locally (no model hub)."""
