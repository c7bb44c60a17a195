"""Sizing KV tiers for a fleet by trace-driven simulation (docs/sizing.md)."""
