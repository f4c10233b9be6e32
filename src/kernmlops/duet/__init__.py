"""Duet benchmarking: run A and B at the same time, pair the iterations that
overlap, and say with a confidence interval whether B differs.

Library API (the CLI, ``kernmlops duet``, is a thin layer over it)::

    from kernmlops.duet.config import load_duet_config
    from kernmlops.duet.runner import run_suite
    from kernmlops.duet.process import process_dirs
    from kernmlops.duet.analysis import analyze, Options
    from kernmlops.duet.report import write_report

    suite = load_duet_config("duet.yml")
    run = run_suite(suite, Path("results"))
    table = process_dirs([run.folder]).results
    analysis = analyze(table, Options(warmup="10%", min_overlap=0.4))
    write_report(analysis, table, Path("results/report"))

Modules are imported on use: the built-in harness (``python -m
kernmlops.duet.harness``) starts without polars or scipy.
"""
