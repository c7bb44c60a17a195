"""Workload kinds' drivers: one module each (`sweep`, `closed_loop`, `open_loop`, `trace`,
`sessions`), whose `DRIVER` implements `kind.Driver`; each kind's spec (its config) is in
config/kinds/ and its figures in analysis/kinds/. Nothing outside a kind's parts asks which kind a
workload is."""
