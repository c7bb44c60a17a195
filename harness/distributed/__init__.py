"""An arm sent from many client processes (--workers) or a Ray cluster's workers (--ray)."""
