"""An emulated KV-tiered OpenAI endpoint: a model of a serving stack, not a claim about hardware.

See `profiles.py` for the cost model and how it was calibrated to the published figures.
"""
