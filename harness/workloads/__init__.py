"""Workload kinds: one module each (`sweep`, `closed_loop`, `open_loop`, `trace`, `sessions`),
whose `KIND` implements `kind.WorkloadKind` and whose config is its own `kinds.WorkloadConfig`
(its `[workload]` keys). harness/config/kinds.py finds them by name; nothing outside this package
asks which kind a workload is."""
