"""A scenario file read strictly into frozen dataclasses: its tables, the workload kinds'
registry and config base, and the published figures."""
