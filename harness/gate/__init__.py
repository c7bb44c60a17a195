"""`kvbench gate` and `kvbench baseline save`: regression gates for CI.

- rules.py: the rule grammar and its parser (docs/ci.md);
- figures.py: what rules are checked against, from result folders (via the statistics core);
- baselines.py: baseline files, and what makes two runs comparable;
- verdicts.py: each rule judged, noise-aware;
- output.py: the verdicts as a terminal table, JUnit, Markdown and JSON;
- command.py: the two commands.
"""
