"""Every figure from request records: the statistics core, open-loop capacity, the report's
findings, and results as DataFrames."""
