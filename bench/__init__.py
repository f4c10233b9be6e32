"""kernmlops' performance benchmarks: one harness (bench.harness), one module per benchmark.

Run ``python -m bench list`` for what there is, ``python -m bench <name> --help`` for one.
"""
