"""Workload programs that benchmarks launch (each runnable with ``python -m``).

They live outside ``kernmlops.benchmarks`` so that running one imports neither
the benchmark registry nor its dependencies into the traced process.
"""
