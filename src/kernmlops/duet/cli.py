"""``kernmlops duet``: run, process and analyze duet benchmarks."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import click
from rich.console import Console

from kernmlops.clitools import CONTEXT_SETTINGS, fail, progress, reachable_path
from kernmlops.errors import KernmlopsError, why_not_written

console = Console(stderr=True, highlight=False, soft_wrap=True)


def _as_given(text: str, held: Path | None, given: Path) -> str:
    """``text`` with the held output folder's ``/proc/<pid>/fd/<n>`` (the name the run
    reaches it by) put back as the user gave it: a message names ``duetout/suite``."""
    if held is None:
        return text
    # not /proc/<pid>/fd/<n>7...: another descriptor
    return re.sub(re.escape(str(held)) + r"(?![0-9])", lambda _: str(given), text)


# under `kernmlops` its help is as wide as the main group's anyway
@click.group("duet", context_settings=CONTEXT_SETTINGS)
def duet_group() -> None:
    """Compare A and B by running them at the same time (duet benchmarking).

    \b
      kernmlops duet run duet.yml --outdir results/   run the trials
      kernmlops duet process results/                 one table of iterations
      kernmlops duet analyze results/                 verdict, CIs, MDS, report
    """


@duet_group.command("run")
@click.argument(
    "configs", nargs=-1, required=True, type=reachable_path(dir_okay=False, path_type=Path)
)
@click.option(
    "--outdir",
    "-o",
    required=True,
    type=reachable_path(file_okay=False, path_type=Path),
    help="each suite goes to OUTDIR/<suite>/",
)
@click.option("--force", is_flag=True, help="replace a suite folder left by an earlier run")
@click.option(
    "--collect",
    is_flag=True,
    help=(
        "run the kernel collector during each trial (root): kernel figures per side "
        "(CPU time, run-queue latency, migrations, switches, page faults counted per process)"
    ),
)
@click.option("--seed", type=int, help="override duetbench.seed (randomized schedule)")
@click.option(
    "--docker",
    "-d",
    "engine",
    metavar="ENGINE",
    help="container engine for sides with an image: docker or podman (overrides the config)",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="print each side's command, pid, CPUs and exit, and its output's last lines "
    "(also duetbench.verbose)",
)
@click.option(
    "--layout",
    type=click.Choice(["kernmlops", "original"]),
    default="kernmlops",
    show_default=True,
    help="original: result files in the suite folder itself, beside artifacts/, where the "
    "original tool's process.py looks for them",
)
def run_cmd(
    configs: tuple[Path, ...],
    outdir: Path,
    force: bool,
    collect: bool,
    seed: int | None,
    engine: str | None,
    verbose: bool,
    layout: str,
) -> None:
    """Run every trial of each CONFIG (asynchronous-duet duet.yml form).

    Result files are named as the original names them
    (<suite>.<duet>.<runid>.<duet|syncduet|seqn>.<AB|BA|None>.<A|B>.<file>).
    In sync-duet trials, $$ in syncduet_run_base becomes one barrier name that
    both sides share (the barrier of java-ubench-agent, created by the runner).

    Where the sides run (cpus: in the config): by default (auto) each side of a
    duet trial gets half of the CPUs, in a cpuset of its own, and the two trade
    halves every 10 ms (cpu_swap_ms), so a CPU that is busy for a while slows
    both alike (needs root and a cgroup v1 cpuset hierarchy; else the sides are
    not pinned, and the run says so). cpus: ["0", "1"] names the halves;
    cpu_swap_ms: 0 keeps each on its own; cpus: none lets the scheduler place them.

    A side that fails, times out, or exits 0 but leaves none of its result
    files is reported and the next trial runs; the exit status is 1 when any
    trial did not succeed. Ctrl+C, SIGTERM or a hangup stops the running sides
    and keeps the trials run so far (exit 130, 143, 129).

    \b
    Examples (cpu-loop.duet.yml ships in src/kernmlops/duet/configs/):
      kernmlops duet run cpu-loop.duet.yml --outdir results
      sudo kernmlops duet run duet.yml -o results --collect --force
    """
    from dataclasses import replace

    from kernmlops.duet.config import load_duet_config
    from kernmlops.duet.runner import resolve_auto_cpus, run_suite, suite_folder

    held = None
    held_out: Path | None = None

    def result_folder(suite) -> Path:
        return suite_folder(held_out if held is not None else outdir, suite)

    caught: list[int] = []

    def on_term(signum: int, _frame: object) -> None:
        caught.append(signum)
        raise KeyboardInterrupt  # stop the running sides, keep what was run

    # a hangup (the ssh session lost) too: by default it ended the runner at once,
    # its index left unfinished and the trial's work folder behind
    stops = (signal.SIGTERM, signal.SIGHUP)
    old = {sig: signal.signal(sig, on_term) for sig in stops}
    try:
        suites = [load_duet_config(c) for c in configs]  # every config checked before any run
        if seed is not None:
            suites = [replace(s, seed=seed) for s in suites]
        if engine is not None:
            suites = [replace(s, engine=engine) for s in suites]
        names = [s.suite for s in suites]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise KernmlopsError(f"two configs name the same suite {sorted(dup)}: rename one")
        from kernmlops.host.invoker import invoker
        from kernmlops.host.pinned import handed_over_held, pin

        who = invoker()
        # held open for the whole run (no link planted on the way followed) and named
        # through the held descriptor, so that a folder above it the user swaps changes
        # nothing; /proc/<pid>: the trials (root's processes) resolve it too
        held = pin(outdir, create=True, invoker_uid=who.uid if who else None)
        held_out = Path(f"/proc/{os.getpid()}/fd/{held.fd}")
        collector = None
        if collect:
            from kernmlops.duet.collect import Collector

            collector = Collector()
        failed = 0
        for suite in suites:
            console.print(f"suite [bold]{suite.suite}[/] ({suite.source})", markup=True)
            loud = verbose or suite.verbose
            folder = result_folder(suite)
            _, cpu_note = resolve_auto_cpus(suite)
            if cpu_note:
                console.print(f"  CPUs {cpu_note}", markup=False)

            def on_trial(
                n: int,
                total: int,
                trial,
                rec,
                loud: bool = loud,
                folder: Path = folder,
            ) -> None:
                what = f"{trial.duet} {trial.kind} run {trial.runid} " + (
                    trial.order or f"({trial.pair} alone)"
                )
                if rec is None:
                    console.print(f"  [{n + 1}/{total}] {what} ...")
                    return
                sides = ", ".join(
                    f"{p}: {s.status}"
                    + (f" ({_as_given(s.error, held_out, outdir)})" if s.error else "")
                    for p, s in rec.sides.items()
                )
                mark = "ok" if rec.ok else "[yellow]FAILED[/]"
                console.print(f"      {mark} in {rec.duration_s:.1f} s: {sides}", markup=True)
                for w in rec.warnings:
                    w = _as_given(w, held_out, outdir)
                    console.print(f"      [yellow]warning:[/] {w}", markup=True)
                if loud:
                    _details(rec, folder)

            with handed_over_held(held):  # under sudo the suite's results are the user's
                result = run_suite(
                    suite, held_out, force=force, collect=collector, on_trial=on_trial,
                    layout=layout,
                )  # fmt: skip
            failed += len(result.failed)
            console.print(f"-> {suite_folder(outdir, suite)}")
    except KernmlopsError as err:
        # e.g. "<outdir>/<suite> exists and is not empty", not /proc/<pid>/fd/<n>/<suite>
        err.args = (_as_given(str(err), held_out, outdir),)
        fail(err)
    except KeyboardInterrupt:
        console.print("interrupted: the trials run so far are kept")
        sys.exit(128 + caught[0] if caught else 130)  # 143 SIGTERM, 129 SIGHUP, as collect
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if held is not None:
            held.close()
    if failed:
        console.print(
            f"[yellow]{failed} trial(s) did not succeed[/] (see duet-run.json)", markup=True
        )
        sys.exit(1)


def _tail(path: Path, limit: int = 1 << 16) -> bytes:
    """The last ``limit`` bytes of a side's log. Named through the suite's folder, whose
    user may have moved it and planted a link under its name: read as root only as
    the held folders read (kernmlops.host.pinned.open_named), and only a plain file."""
    import errno

    from kernmlops.host.pinned import open_named

    try:
        fd = open_named(path, what="the logs")
    except OSError as err:
        if err.errno == errno.EINVAL:  # not a plain file: nothing to show
            return b""
        raise
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, os.fstat(fd).st_size - limit))
        return f.read(limit)


def _details(rec, folder: Path) -> None:
    """--verbose: what each side ran and said."""
    if rec.sync:
        console.print(f"      sync: {rec.sync}", markup=False)
    if rec.cpu_swap_s:
        console.print(
            f"      CPUs traded every {rec.cpu_swap_s * 1000:g} ms ({rec.cpu_swaps} trades)",
            markup=False,
        )
    for pair, side in rec.sides.items():
        cpus = f" on CPUs {side.cpus}" if side.cpus else ""
        console.print(
            f"      {pair}: pid {side.pid}{cpus}, exit {side.exit_code}: {side.command}",
            markup=False,
        )
        for stream in (side.stdout, side.stderr):
            if not stream:
                continue
            try:
                text = _tail(folder / stream).decode(errors="replace")
            except (OSError, KernmlopsError):
                continue
            lines = text.splitlines()[-5:]
            for line in lines:
                console.print(f"        {Path(stream).suffix[1:]}> {line}", markup=False)


@duet_group.command("process")
@click.argument(
    "folders", nargs=-1, required=True, type=reachable_path(file_okay=False, path_type=Path)
)
@click.option(
    "--out",
    "-o",
    type=reachable_path(file_okay=False, path_type=Path),
    help="where duet-results.parquet/.csv go (default: the one FOLDER)",
)
@click.option(
    "--json", "as_json", is_flag=True, help="also write duet-results.json (one object per row)"
)
@click.option(
    "--original",
    is_flag=True,
    help="also write duet-results.original.csv (and .json with --json) in the original "
    "tool's columns (type, order, date, hostname, ...) for its analysis",
)
@click.option(
    "--aa",
    "aa",
    multiple=True,
    metavar="BENCHMARK",
    help="this benchmark is an A/A duet (original-named folders do not say; repeatable)",
)
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=reachable_path(dir_okay=False, path_type=Path),
    help="the duet.yml the results came from: its duets without B are A/A (repeatable)",
)
@click.option(
    "--max-file-mb",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="the largest result file (or result folder) read, in MiB: a parser holds it in memory",
)
@click.option("--no-progress", is_flag=True, help="no progress bar on a terminal.")
def process_cmd(
    folders: tuple[Path, ...],
    out: Path | None,
    as_json: bool,
    original: bool,
    aa: tuple[str, ...],
    configs: tuple[Path, ...],
    max_file_mb: int,
    no_progress: bool,
) -> None:
    """Parse every result file under FOLDERS into one table (Parquet and CSV).

    A FOLDER is a `duet run` folder, or an original asynchronous-duet results
    folder (files named <suite>.<duet>.<runid>.<type>.<order>.<pair>.<file>,
    artifacts/ beside them). Parsers: the built-in harness, Renaissance JSON,
    DaCapo/ScalaBench CSV (start_unix, or total_ms anchored on artifacts/date),
    SPEC CPU logs, pyperf JSON, hyperfine JSON. A file none of them reads is
    named with the reason; the others are still processed.

    Only files inside a FOLDER are read: a path in its duet-run.json that is
    absolute, climbs out with .., or is a link out of the folder is refused
    and named, as is a file over --max-file-mb (an artifact: over 1 MiB).

    \b
    Examples:
      kernmlops duet process results
      kernmlops duet process old-results/ --aa loop-aa --original --json
    """
    from kernmlops.duet.config import load_duet_config
    from kernmlops.duet.process import process_dirs, write_processed

    try:
        if out is None:
            if len(folders) > 1:
                raise click.UsageError("several folders: say where the table goes with --out")
            out = folders[0]
        names = set(aa)
        for cfg in configs:
            names |= {d.name for d in load_duet_config(cfg).duets if d.aa}
        with progress("processing", "result files", enabled=not no_progress) as steps:
            processed = process_dirs(
                list(folders), frozenset(names), max_file_mb << 20, progress=steps
            )
        for err in processed.errors:
            console.print(f"[yellow]warning:[/] {err}", markup=True)
        if processed.results.height == 0:
            seen = " (see the warnings above)" if processed.errors else ""
            raise KernmlopsError(f"no iterations in {processed.files} result file(s){seen}")
        _check_aa(aa, processed.results["benchmark"].unique().to_list(), "the results")
        from kernmlops.host.invoker import invoker
        from kernmlops.host.pinned import handed_over_held, pin

        who = invoker()
        # held open: no link planted on the way is written through; under sudo the
        # tables are the user's, handed over through the held folder
        held = pin(out, create=True, invoker_uid=who.uid if who else None)
        try:
            with handed_over_held(held):
                made = write_processed(processed, held.io, json=as_json, original=original)
        except OSError as err:  # a full disk: one line, as analyze says it
            why = why_not_written(err)
            raise KernmlopsError(f"cannot write the tables in {out}: {why}") from None
        finally:
            held.close()
        written = [out / p.name for p in made]
    except KernmlopsError as err:
        fail(err)
    r = processed.results
    console.print(
        f"{r.height} iterations from {processed.files} file(s), "
        f"{r.select('suite', 'benchmark').n_unique()} benchmark(s) -> "
        + ", ".join(str(p) for p in written)
    )


def _check_aa(aa: tuple[str, ...], benchmarks: list[str], where: str) -> None:
    """A name given to --aa that no benchmark has is said (a typo would leave the
    benchmark meant as A/B in silence); a warning, as one --aa list may serve
    several folders."""
    unknown = sorted(set(aa) - set(benchmarks))
    if unknown:
        console.print(
            f"[yellow]warning:[/] --aa {', '.join(unknown)}: no such benchmark in {where} "
            f"(benchmarks: {', '.join(sorted(benchmarks)) or 'none'})",
            markup=True,
        )


def _mds_text(c) -> str:
    """The minimum detectable slowdown as the CLI line gives it, named as the report
    names it, with its note; nothing where there is no interval to find it with."""
    from kernmlops.duet.analysis import MDS_SKIPPED

    if c.ratio_ci is None or c.mds_note == MDS_SKIPPED:
        return ""
    if c.mds is None:
        return f"; minimum detectable slowdown: {c.mds_note or 'not found'}"
    note = f" ({c.mds_note})" if c.mds_note else ""
    return f"; minimum detectable slowdown {c.mds * 100:.2f}%{note}"


@duet_group.command("analyze")
@click.argument("results", type=reachable_path(exists=True, path_type=Path))
@click.option(
    "--out",
    "-o",
    type=reachable_path(file_okay=False, path_type=Path),
    help="report folder (default: RESULTS/report)",
)
@click.option(
    "--warmup",
    default="auto",
    show_default=True,
    help="iterations dropped per side and run: a count (5), a share (10%), or auto: half "
    "for the Java suites (renaissance, dacapo, scalabench), none for others, as the original",
)
@click.option(
    "--method",
    type=click.Choice(["kernmlops", "original"]),
    default="kernmlops",
    show_default=True,
    help="whose verdicts to print: ours (overlap-weighted log ratios, an interval over runs "
    "stratified by order, see --interval) or the original tool's (plain per-run means of "
    "A - B, BCa over runs, 9,999 resamples, its warm-up); the report shows both side by side",
)
@click.option(
    "--interval",
    # the names of kernmlops.duet.analysis.INTERVALS (not imported here: it loads scipy)
    type=click.Choice(["signflip", "t", "bca"]),
    default="signflip",
    show_default=True,
    help="our interval over runs. signflip: every shift that a sign-flip test keeps, exact "
    "when A and B are exchangeable (as in an A/A duet) however heavy-tailed the runs, needs "
    "6 runs or 5 of each order (fewer get t); t: Welch's t over the two orders' means; bca: "
    "the bootstrap widened for small samples, the previous default, which one disturbed run "
    "can skew: A/A duets fail it more often than 5% (8.25% of 400 simulated heavy-tailed "
    "ones, against 5.0% for signflip)",
)
@click.option(
    "--aa",
    "aa",
    multiple=True,
    metavar="BENCHMARK",
    help="treat this benchmark as an A/A duet (repeatable)",
)
@click.option(
    "--min-overlap",
    default=0.4,
    show_default=True,
    type=float,
    help="pair iterations overlapping by at least this share of the longer one",
)
@click.option("--confidence", default=0.95, show_default=True, type=float)
@click.option(
    "--resamples",
    default=2000,
    show_default=True,
    type=int,
    help="bootstrap resamples (bca), or random sign patterns (signflip: all of them when "
    "there are at most this many); 100 to 100000 (memory grows with it)",
)
@click.option(
    "--min-runs",
    default=5,
    show_default=True,
    type=int,
    help="fewest runs for a verdict: below it no interval and the verdict is inconclusive "
    "(the iterations of one run are not independent samples)",
)
@click.option("--no-mds", is_flag=True, help="skip the minimum detectable slowdown")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the resamples")
def analyze_cmd(
    results: Path,
    out: Path | None,
    warmup: str,
    min_overlap: float,
    confidence: float,
    resamples: int,
    min_runs: int,
    no_mds: bool,
    seed: int,
    method: str,
    interval: str,
    aa: tuple[str, ...],
) -> None:
    """Verdicts with confidence intervals and a report for RESULTS (the folder or
    file `duet process` wrote, or the CSV/JSON the original tool's process.py
    wrote).

    \b
    Examples:
      kernmlops duet analyze results                    -> results/report/
      kernmlops duet analyze results --method original  the original tool's verdicts
      kernmlops duet analyze results/duet-results.csv --warmup 10% --out rep/
    """
    import polars as pl

    from kernmlops.duet.analysis import OptionError, Options, analyze
    from kernmlops.duet.process import read_results, side_outcomes
    from kernmlops.duet.report import write_report

    try:
        try:
            opts = Options(
                warmup=warmup,
                min_overlap=min_overlap,
                confidence=confidence,
                resamples=resamples,
                min_runs=min_runs,
                mds=not no_mds,
                seed=seed,
                method=method,
                interval=interval,
            )
        except OptionError as err:
            hint = f"--{err.field.replace('_', '-')}"
            raise click.BadParameter(err.message, param_hint=hint) from None
        table, kernel = read_results(results)
        if table.height == 0:
            raise KernmlopsError(f"{results}: the results table is empty")
        _check_aa(aa, table["benchmark"].unique().to_list(), str(results))
        if aa:
            table = table.with_columns(
                pl.when(pl.col("benchmark").is_in(list(aa))).then(True).otherwise(pl.col("aa"))
                .alias("aa")
            )  # fmt: skip
        # a side with no iteration has no row: how it ended is in the suites' indexes
        sides = side_outcomes(results if results.is_dir() else results.parent)
        analysis = analyze(table, opts, sides)
        folder = out or (results if results.is_dir() else results.parent) / "report"
        from kernmlops.host.invoker import invoker
        from kernmlops.host.pinned import handed_over_held, pin

        who = invoker()
        # held open: no link planted on the way is written through; under sudo the
        # report is the user's, handed over through the held folder
        held = pin(folder, create=True, invoker_uid=who.uid if who else None)
        try:
            with handed_over_held(held):
                made = write_report(analysis, table, held.io, kernel)
        except OSError as err:
            raise KernmlopsError(f"cannot write the report in {folder}: {err.strerror}") from None
        finally:
            held.close()
        files = {key: folder / path.name for key, path in made.items()}
    except KernmlopsError as err:
        fail(err)
    for b in analysis.benchmarks:
        for kind, c in sorted(b.comparisons.items()):
            if method == "original":
                verdict = c.original.verdict if c.original is not None else "no verdict"
                click.echo(f"{b.suite} {b.benchmark} [{kind}] (original): {verdict}")
                if c.original is not None and c.original.note:
                    # the original's numbers, for comparison; below --min-runs, said once
                    click.echo(f"warning: {b.suite} {b.benchmark} [{kind}] (original): "
                               f"{c.original.note}")  # fmt: skip
                continue
            click.echo(f"{b.suite} {b.benchmark} [{kind}]: {c.verdict}{_mds_text(c)}")
    for w in analysis.warnings:
        console.print(f"[yellow]warning:[/] {w}", markup=True)
    console.print(f"report: {files['markdown']}, {files['html']}")
