"""Runnable benchmarks, each ``python -m benchmarks.<name>`` printing a table.

Every benchmark takes ``--json PATH`` (flat rows with an ``impl`` key and unit-suffixed
fields) and ``--quick``; ratios between implementations come from the same run.
"""
