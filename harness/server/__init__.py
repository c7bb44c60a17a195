"""The server outside the streams: its models, token counts and hooks, its Prometheus counters,
and the warm/cold checks against them."""
