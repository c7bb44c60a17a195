"""Self-contained HTML reports: every figure recomputed from the raw per-request data, beside the
published one. No JavaScript, no network: inline CSS and inline SVG only."""
