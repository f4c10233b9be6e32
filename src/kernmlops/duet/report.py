"""The duet report: markdown and a self-contained HTML page, with plots.

Each comparison is shown by both methods side by side: ours (the geometric-
mean ratio B/A with its CI, and B - A as that ratio times A's mean) and the
original asynchronous-duet analysis (the mean over runs of per-run mean
differences, BCa, 9,999 resamples), each interval next to its own verdict.
The HTML is the markdown rendered by markdown-it-py, plots embedded.

Plots (matplotlib, one set per benchmark): the A and B iteration timelines of
the first duet run with its overlap pairs, paired iteration times (A against
B), and one figure with the ratio CI of every benchmark and kind of run.
"""

from __future__ import annotations

import base64
import errno
import html
import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.duet.analysis import MDS_SKIPPED, Analysis, BenchmarkResult, Comparison

KERNEL_COLUMNS = {
    "cpu_time_ms": "CPU time (ms)",
    "runq_latency_mean_us": "run-queue latency, mean (µs)",
    "runq_latency_p99_us": "run-queue latency, p99 (µs)",
    "migrations": "migrations",
    "context_switches": "context switches",
    "page_faults": "page faults",
}
#: a side's page faults are rows × the hook's sample_every, not the kernel's count
#: (kernmlops.duet.collect): written "≈" as the graphs do
ESTIMATED = "page_faults_estimated"


def _kernel_value(row: dict[str, Any], column: str) -> str:
    value = row[column]
    if value is None:
        return "–"
    said = f"{value:,.1f}"
    return f"≈{said}" if column == "page_faults" and row.get(ESTIMATED) else said


def _pct(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{(x - 1) * 100:+.2f}%"


def _ms(ns: float | None) -> str:
    return "–" if ns is None or not math.isfinite(ns) else f"{ns / 1e6:.3f}"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def plot_timeline(bench: BenchmarkResult, results: pl.DataFrame, path: Path) -> Path | None:
    """A and B iterations of the first duet (or sync-duet) run, pairs joined."""
    kind = next((k for k in ("duet", "syncduet") if k in bench.comparisons), None)
    if kind is None:
        return None
    cmp = bench.comparisons[kind]
    run = results.filter(
        (pl.col("suite") == bench.suite)
        & (pl.col("benchmark") == bench.benchmark)
        & (pl.col("kind") == kind)
    )
    if run.height == 0 or run["iteration_start_ns"].null_count() == run.height:
        return None
    runid = run["runid"].min()
    run = run.filter(pl.col("runid") == runid)
    t0 = run["iteration_start_ns"].min()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for y, pair, color in ((1, "A", "tab:blue"), (0, "B", "tab:orange")):
        side = run.filter(pl.col("pair") == pair)
        spans = [((s - t0) / 1e9, (e - s) / 1e9)
                 for s, e in zip(side["iteration_start_ns"], side["iteration_end_ns"], strict=True)
                 if s is not None and e is not None]  # fmt: skip
        ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=color, edgecolors="white", lw=0.5)
    if cmp.pairs is not None and cmp.pairs.height:
        p = cmp.pairs.filter(pl.col("runid") == runid)
        for row in p.iter_rows(named=True):
            xa = ((row["a_start_ns"] + row["a_end_ns"]) / 2 - t0) / 1e9
            xb = ((row["b_start_ns"] + row["b_end_ns"]) / 2 - t0) / 1e9
            ax.plot([xa, xb], [0.65, 0.35], color="black", lw=0.5, alpha=0.6)
    ax.set_yticks([0, 1], ["B", "A"])
    ax.set_xlabel("seconds since the run's first iteration")
    ax.set_title(f"{bench.benchmark}: {kind} run {runid}, iterations and overlap pairs")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def plot_pairs(bench: BenchmarkResult, path: Path) -> Path | None:
    """Paired iteration times: B against A (points above the line: B slower)."""
    kind = next((k for k in ("duet", "syncduet") if k in bench.comparisons), None)
    if kind is None:
        return None
    pairs = bench.comparisons[kind].pairs
    if pairs is None or pairs.height == 0:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    a = pairs["a_time_ns"].to_numpy() / 1e6
    b = pairs["b_time_ns"].to_numpy() / 1e6
    sc = ax.scatter(a, b, c=pairs["overlap_ratio"].to_numpy(), s=8, cmap="viridis", vmin=0, vmax=1)
    lo, hi = float(min(a.min(), b.min())), float(max(a.max(), b.max()))
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
    ax.set_xlabel("A iteration (ms)")
    ax.set_ylabel("B iteration (ms)")
    ax.set_title(f"{bench.benchmark}: {pairs.height} {kind} pairs")
    fig.colorbar(sc, ax=ax, label="overlap ratio")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def plot_cis(analysis: Analysis, path: Path) -> Path | None:
    """The geometric-mean ratio B/A with its CI, per benchmark and kind of run."""
    rows = [
        (f"{b.benchmark} · {k}", c)
        for b in analysis.benchmarks
        for k, c in sorted(b.comparisons.items())
        if c.ratio_ci is not None and c.gm_ratio is not None
    ]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.2))
    for i, (_, c) in enumerate(rows):
        color = {"slower": "tab:red", "faster": "tab:green"}.get(c.detected, "tab:blue")
        ax.errorbar(
            (c.gm_ratio - 1) * 100,
            i,
            xerr=[[(c.gm_ratio - c.ratio_ci.low) * 100], [(c.ratio_ci.high - c.gm_ratio) * 100]],
            fmt="o",
            color=color,
            capsize=3,
        )
    ax.axvline(0, color="grey", lw=1)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("B vs A, geometric-mean ratio − 1 (%) with CI")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def kernel_summary(kernel: pl.DataFrame) -> pl.DataFrame:
    """Per benchmark, kind and side: the mean over runs of each kernel figure, and
    whether any run's page faults were estimated (rows × N, not counted)."""
    cols = [c for c in KERNEL_COLUMNS if c in kernel.columns]
    flags = [pl.col(ESTIMATED).any()] if ESTIMATED in kernel.columns else []
    return (
        kernel.group_by("suite", "benchmark", "kind", "pair")
        .agg(pl.len().alias("runs"), *[pl.col(c).mean() for c in cols], *flags)
        .sort("suite", "benchmark", "kind", "pair")
    )


def _orig_diff(c: Comparison) -> str:
    o = c.original
    if o is None or o.estimate_ns is None:
        return "–"
    text = f"{-o.estimate_ns / 1e6:+.3f}"
    if o.ci_ns:
        text += f" [{-o.ci_ns[1] / 1e6:+.3f}, {-o.ci_ns[0] / 1e6:+.3f}]"
    return text


def _orig_verdict(c: Comparison) -> str:
    """The original method's verdict, and below --min-runs that it is not reliable."""
    o = c.original
    if o is None:
        return "–"
    return f"{o.verdict} ({o.note})" if o.note else o.verdict


#: how the report names the intervals of kernmlops.duet.analysis.INTERVALS
INTERVAL_NAMES = {
    "signflip": "sign-flip randomization (exact, not widened)",
    "t": "Welch's t",
    "bca": "BCa bootstrap",
    "none": "none (fewer runs than --min-runs: no verdict)",
}


def _interval_text(interval: str, bca: str, resamples: int) -> str:
    if interval == "signflip":
        return (
            "the shifts a sign-flip test keeps (exact, not widened; every sign pattern, "
            f"or {resamples} random ones)"
        )
    if interval == "t":
        return "Welch's t"
    return bca


def _unit(c: Comparison) -> str:
    """The CI's unit as the report names it."""
    return "runs" if c.unit == "run" else "none: no interval"


def _iterations(c: Comparison) -> str:
    """Kept / kept, and how many there were before the warm-up dropped some."""
    text = f"{c.n_a} / {c.n_b}"
    before = (c.n_a if c.n_a_all is None else c.n_a_all, c.n_b if c.n_b_all is None else c.n_b_all)
    if before != (c.n_a, c.n_b):
        text += f" after the warm-up, of {before[0]} / {before[1]}"
    return text


def _cmp_rows(c: Comparison) -> list[tuple[str, str]]:
    ci = c.ratio_ci
    dci = c.diff_ci
    o = c.original
    orig = []
    if o is not None:
        orig = [
            ("original method: verdict", _orig_verdict(c)),
            ("original method: runs / pairs", f"{o.n_runs} / {o.n_pairs}"),
            ("original method: mean over runs of B − A (ms), 95% BCa", _orig_diff(c)),
            (
                "original method: A − B as the original prints it (ms)",
                f"{o.estimate_ns / 1e6:+.3f}"
                + (f" [{o.ci_ns[0] / 1e6:+.3f}, {o.ci_ns[1] / 1e6:+.3f}]" if o.ci_ns else "")
                if o.estimate_ns is not None
                else "–",
            ),
            ("original method: Mann-Whitney U p", f"{o.mwu_p:.3g}" if o.mwu_p is not None else "–"),
        ]
    return [
        ("verdict", c.verdict),
        ("unit of the CI", f"{_unit(c)} (runs: {c.n_runs}, pairs: {c.n_pairs})"),
        ("interval", INTERVAL_NAMES.get(c.interval, c.interval)),
        ("iterations A / B", _iterations(c)),
        ("mean A / B (ms)", f"{_ms(c.mean_a_ns)} / {_ms(c.mean_b_ns)}"),
        (
            "difference B − A (ms): the ratio and its CI × mean A",
            f"{_ms(c.mean_diff_ns)} [{_ms(dci.low)}, {_ms(dci.high)}]" if dci else _ms(None),
        ),
        (
            "geometric-mean ratio B/A",
            f"{c.gm_ratio:.4f} [{ci.low:.4f}, {ci.high:.4f}]"
            if ci and c.gm_ratio
            else f"{c.gm_ratio:.4f} (no interval)"
            if c.gm_ratio
            else "–",
        ),
        ("Mann-Whitney U p", f"{c.mwu_p:.3g}" if c.mwu_p is not None else "–"),
        (
            "minimum detectable slowdown",
            (f"{c.mds * 100:.2f}%" if c.mds is not None else "–")
            + (f" ({c.mds_note})" if c.mds_note else ""),
        ),
        *orig,
    ]


def _save(fig: Any, path: Path) -> None:
    """The figure as a PNG written new (fileio.write_atomic): never through a link
    planted under its name in a folder a user owns."""
    import io

    from kernmlops.fileio import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    write_atomic(path, buf.getvalue())


def write_report(
    analysis: Analysis,
    results: pl.DataFrame,
    out: Path,
    kernel: pl.DataFrame | None = None,
    title: str = "Duet benchmark report",
) -> dict[str, Path]:
    """report.md, report.html, analysis.json and plots/ in ``out`` (a folder held open,
    kernmlops.host.pinned, where root writes for a user): plots/ is opened without
    following a link and written through its descriptor, each file written new."""
    import os

    from kernmlops.host.pinned import fd_path, subfolder

    out.mkdir(parents=True, exist_ok=True)
    plots_fd = subfolder(out, "plots")
    try:
        return _write_report(analysis, results, out, fd_path(plots_fd), kernel, title)
    finally:
        os.close(plots_fd)


def _write_report(analysis: Analysis, results: pl.DataFrame, out: Path, plots: Path,
                  kernel: pl.DataFrame | None, title: str) -> dict[str, Path]:  # fmt: skip
    images: dict[str, list[Path]] = {}
    for b in analysis.benchmarks:
        stem = _safe(f"{b.suite}-{b.benchmark}")
        images[b.benchmark] = [
            p
            for p in (
                plot_timeline(b, results, plots / f"{stem}-timeline.png"),
                plot_pairs(b, plots / f"{stem}-pairs.png"),
            )
            if p is not None
        ]
    ci_plot = plot_cis(analysis, plots / "ci.png")
    ksum = kernel_summary(kernel) if kernel is not None and kernel.height else None

    md: list[str] = [f"# {title}", ""]
    opts = analysis.options
    warm = (
        "half of each side's iterations for Java suites, none for others (auto)"
        if str(opts.warmup).strip() == "auto"
        else f"{opts.warmup} of each side's iterations"
    )
    bca = f"BCa bootstrap ({opts.resamples} resamples" + (
        ", widened for small samples)" if opts.expand else ")"
    )
    md += [
        f"Warm-up dropped: {warm} per run · pairs overlap by "
        f"≥ {opts.min_overlap:.0%} of the longer iteration (weighted by overlap) · "
        f"{opts.confidence:.0%} CIs over runs (unit: runs when ≥ {opts.min_runs}, "
        f"stratified by order): {_interval_text(opts.interval, bca, opts.resamples)}; "
        "with fewer runs no interval and no verdict (inconclusive): the iterations of one "
        "run are not independent samples.",
        "",
        "Beside it, the original asynchronous-duet analysis of the same iterations: its "
        "warm-up (first half of Java-suite runs), its two-pointer pairs (overlap > "
        f"{opts.min_overlap:.0%} of each iteration) or pairs by iteration number (sync-duet, "
        "sequential), the plain mean of each run's pair differences, a 95% BCa bootstrap "
        "over runs with 9,999 resamples; shown as B − A (the original prints A − B)."
        + (" Verdicts printed by: the original method." if opts.method == "original" else ""),
        "",
    ]
    for w in analysis.warnings:
        md.append(f"> warning: {w}")
    md += ["## Verdicts", "",
           "| suite | benchmark | kind | B/A − 1 | CI | verdict | MDS "
           "| original: B − A (ms) [CI] | original: verdict |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for b in analysis.benchmarks:
        for k, c in sorted(b.comparisons.items()):
            ci = c.ratio_ci
            cis = f"[{_pct(ci.low)}, {_pct(ci.high)}]" if ci else "–"
            searched = c.ratio_ci is not None and c.mds_note != MDS_SKIPPED
            mds = f"{c.mds * 100:.2f}%" if c.mds is not None else "> max" if searched else "–"
            ov = _orig_verdict(c)
            md.append(
                f"| {b.suite} | {b.benchmark} | {k} | {_pct(c.gm_ratio)} | {cis} | "
                f"{c.verdict} | {mds} | {_orig_diff(c)} | {ov} |"
            )
    md.append("")
    if ci_plot:
        md += [f"![CI per benchmark](plots/{ci_plot.name})", ""]
    for b in analysis.benchmarks:
        md += [f"## {b.suite} · {b.benchmark}" + (" (A/A)" if b.aa else ""), ""]
        for k, c in sorted(b.comparisons.items()):
            md += [f"### {k}", "", "| | |", "|---|---|"]
            md += [f"| {name} | {value} |" for name, value in _cmp_rows(c)]
            md += [f"\n> {n}" for n in c.notes]
            md.append("")
        for img in images[b.benchmark]:
            md += [f"![{img.stem}](plots/{img.name})", ""]
        if ksum is not None:
            part = ksum.filter((pl.col("suite") == b.suite) & (pl.col("benchmark") == b.benchmark))
            if part.height:
                cols = [c for c in KERNEL_COLUMNS if c in part.columns]
                md += ["#### What the kernel did for each side (mean per run)", ""]
                md.append(
                    "| kind | side | runs | " + " | ".join(KERNEL_COLUMNS[c] for c in cols) + " |"
                )
                md.append("|---" * (3 + len(cols)) + "|")
                for row in part.iter_rows(named=True):
                    vals = " | ".join(_kernel_value(row, c) for c in cols)
                    md.append(f"| {row['kind']} | {row['pair']} | {row['runs']} | {vals} |")
                md.append("")
    md_text = "\n".join(md) + "\n"
    from kernmlops.fileio import write_atomic

    write_atomic(out / "report.md", md_text)
    write_atomic(out / "report.html", _html(md_text, title, plots))
    write_atomic(
        out / "analysis.json", json.dumps(analysis.summary(), indent=1, default=_json_default)
    )
    return {"markdown": out / "report.md", "html": out / "report.html",
            "json": out / "analysis.json"}  # fmt: skip


def _json_default(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return str(obj)


#: the largest plot embedded: ours are a few hundred KiB
PLOT_MAX_BYTES = 16 << 20


def _plot_bytes(path: Path) -> bytes:
    """A plot just written, read back for the page: plots/ may be the user's folder
    (``sudo ... -o ~/report``), where its user can put a link to a file of root's at
    the plot's name (embedded, root's file would be theirs to read) or a FIFO (waited
    on for ever): a plain file only, never through a link, bounded
    (kernmlops.host.pinned.read_plain)."""
    from kernmlops.duet.runner import DuetError
    from kernmlops.host.pinned import read_plain

    try:
        return read_plain(path, limit=PLOT_MAX_BYTES)
    except OSError as err:
        why = "a link" if err.errno == errno.ELOOP else err.strerror or str(err)
        raise DuetError(f"{path.name} in the report's plots/ changed as it was written "
                        f"({why}): not embedded; report.html not written") from None  # fmt: skip


def _html(md_text: str, title: str, plots: Path) -> str:
    """The markdown as HTML (markdown-it-py, with tables), plots embedded."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(md_text)
    for token in tokens:
        for child in token.children or []:
            src = child.attrGet("src") if child.type == "image" else None
            if src and not str(src).startswith(("data:", "http:", "https:", "/")):
                data = base64.b64encode(_plot_bytes(plots / Path(str(src)).name)).decode()
                child.attrSet("src", f"data:image/png;base64,{data}")
    body = md.renderer.render(tokens, md.options, {})
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:left}img{max-width:100%}"
        "blockquote{color:#8a5a00;border-left:3px solid #e0b000;margin:.5em 0;padding-left:.8em}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + body + "</body></html>\n"
    )
