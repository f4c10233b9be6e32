"""Workloads that benchmarks launch: programs (each runnable with ``python -m``)
and the definitions of standard mixes (MLLB's stress-ng scenarios, ``mllb``).

They live outside ``kernmlops.benchmarks`` so that running one imports neither
the benchmark registry nor its dependencies into the traced process, and so
that the packages above the benchmarks (``lb``) share them from below.
"""
