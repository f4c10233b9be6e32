"""``kernmlops lb``: learning load balancing, from decisions to the kernel."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kernmlops.clitools import fail, reachable_path, require_bpf_privileges
from kernmlops.errors import KernmlopsError

console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


@click.group("lb", context_settings={"help_option_names": ["-h", "--help"]})
def lb_group() -> None:
    """Learn CFS's load-balancing decision (MLLB, APSys'20) and run the model in
    the kernel beside the real scheduler, without a kernel patch.

    \b
      kernmlops lb collect -b stress-ng            decisions (kprobe/fexit; root)
      kernmlops lb collect --variant tracepoint    approximate, kernels without kprobes
      kernmlops lb import-mllb raw_ng.csv          a dump in MLLB's own format
      kernmlops lb train data -o lb-model.json     15 -> 10 -> 1 MLP, split by run
      kernmlops lb export lb-model.json -o out/    Q20.11 C header + JSON
      kernmlops lb dump-weights lb-model.json      W1, b1, W2, b2 as MLLB prints them
      kernmlops lb import-weights jc_mlp.c         MLLB's own model, as ours
      kernmlops lb deploy out/m.q11.json           the model decides (kernel module)
      kernmlops lb shadow lb-model.json -b ...     the model in the kernel, beside CFS
      kernmlops lb report data --model m.json      what the data and the model say
    Where the kernel has neither kprobes nor fentry (kernmlops doctor says), run
    the kprobe variant in the kernel lab:
      kernmlops vm -o lab -- kernmlops lb collect -o lab -b stress-ng
    """


# --- collect / shadow ---------------------------------------------------------------


def _collect_options(fn):
    for opt in reversed(
        [
            click.option(
                "--variant",
                type=click.Choice(["kprobe", "tracepoint", "both"]),
                default="kprobe",
                show_default=True,
                help="kprobe: exact (fexit or kprobe on can_migrate_task); tracepoint: "
                "approximate, from sched_migrate_task and the scheduler tables; both: "
                "measure the approximation (needs kprobes)",
            ),
            click.option(
                "-c",
                "--config",
                "config_files",
                multiple=True,
                type=reachable_path(dir_okay=False, path_type=Path),
                help="YAML overrides (benchmark, scenario, ...); repeat it for one "
                "collection per file in one process (the lab pays the start-up once)",
            ),
            click.option(
                "--repeat",
                type=int,
                default=1,
                show_default=True,
                help="collections per config (runs to split train and test by)",
            ),
            click.option(
                "--attach",
                type=click.Choice(["auto", "fexit", "kprobe"]),
                default="auto",
                show_default=True,
                help="kprobe variant: fexit where the kernel allows, else kprobe + kretprobe",
            ),
            click.option("-b", "--benchmark", help="benchmark to run (default: the config's)"),
            click.option("-d", "--duration", type=float, help="stop after this many seconds"),
            click.option(
                "-o",
                "--output-dir",
                type=reachable_path(file_okay=False, path_type=Path),
                help="root of the collections (default: data)",
            ),
            click.option(
                "--migration-cost-ns",
                type=click.IntRange(min=1),  # as lb deploy and lb train
                default=None,
                help="sched migration cost the features use (default: the running "
                "kernel's, from debugfs or sysctl, else 500000)",
            ),
            click.option("--no-progress", is_flag=True, help="no live progress (logs, CI)"),
            click.argument("command", nargs=-1, type=click.UNPROCESSED),
        ]
    ):
        fn = opt(fn)
    return fn


def _load_any_model(path: Path) -> tuple[Any, dict[str, Any]]:
    """A float model (quantized here) or an exported fixed-point JSON."""
    from kernmlops.lb.fixed import FORMAT as FIXED_FORMAT
    from kernmlops.lb.fixed import FixedModel, load_fixed_json
    from kernmlops.lb.model import Model, ModelError
    from kernmlops.lb.weights import read_model_doc

    # each loader checks the weights (kernmlops.lb.weights): finite, shapes, Q20.11
    kind = read_model_doc(path, ModelError).get("format")
    if kind == FIXED_FORMAT:
        fixed, meta = load_fixed_json(path)
    else:
        model = Model.load(path)
        fixed, meta = FixedModel.from_model(model), dict(model.meta)
    if fixed.w1.shape[1] != 10:  # a valid file, not one the kernel's arrays can hold
        raise ModelError(
            f"{path}: {fixed.w1.shape[1]} hidden units; the model in the kernel has MLLB's 10"
        )
    meta = {k: v for k, v in meta.items() if k != "report"}
    return fixed, {"path": str(path), **meta}


def _run_collect(
    variant: str,
    config_files: tuple[Path, ...],
    repeat: int,
    attach: str,
    benchmark: str | None,
    duration: float | None,
    output_dir: Path | None,
    migration_cost_ns: int | None,
    no_progress: bool,
    command: tuple[str, ...],
    model_path: Path | None,
) -> None:
    from kernmlops.config import Flags, load_config
    from kernmlops.lb.collect import collect, session_flags
    from kernmlops.lb.features import MIGRATION_COST_NS, kernel_migration_cost_ns

    if repeat < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeat")
    if command and benchmark not in (None, "command"):
        raise click.UsageError(f"a command after -- runs as benchmark 'command', not {benchmark!r}")
    given = Flags(
        duration_s=duration,
        output_dir=output_dir,
        progress=False if no_progress else None,
        benchmark=benchmark or None,
        argv=list(command) if command else None,
    )
    try:
        flags = session_flags(variant, given)
        # every config is checked before the first run starts
        configs = [load_config(f, flags) for f in config_files] or [load_config(None, flags)]
        # a bad model is bad input: said before root is asked for or anything is built
        model, meta = _load_any_model(model_path) if model_path else (None, None)
        require_bpf_privileges("lb shadow" if model_path else "lb collect")
        from kernmlops.ebpf.build import build

        build()
    except KernmlopsError as err:
        fail(err)
    kernel_cost = kernel_migration_cost_ns()
    cost = migration_cost_ns or kernel_cost or MIGRATION_COST_NS
    if kernel_cost is not None and kernel_cost != cost:
        console.print(
            f"warning: the kernel's migration cost is {kernel_cost:,} ns, the features use "
            f"{cost:,} ns (--migration-cost-ns): the kernel's answers follow its own"
        )
    shadow = f", shadow model {model_path}" if model else ""
    exit_code = 0
    runs = [(i, c) for i, c in enumerate(configs) for _ in range(repeat)]
    for n, (i, config) in enumerate(runs, 1):
        name = config_files[i] if config_files else "defaults"
        console.print(f"lb collect {n}/{len(runs)} ({name}): variant {variant}{shadow}")
        try:
            out = collect(
                config, variant, model=model, model_meta=meta, migration_cost_ns=cost,
                attach=attach, on_attached=_attached,
            )  # fmt: skip
        except KernmlopsError as err:
            if len(runs) == 1:
                fail(err)
            console.print(f"error: {err}")
            exit_code = exit_code or err.exit_code
            continue
        _print_run(out)
        exit_code = exit_code or out.result.exit_code
    sys.exit(exit_code)


def _attached(statuses: dict) -> None:
    ok = sum(s.attached for s in statuses.values())
    console.print(f"probes attached: {ok}/{len(statuses)} hooks (lb's system-wide)")


def _print_run(out: Any) -> None:
    table = Table(title=f"collection {out.result.collection_id}", title_justify="left")
    for col in ("table", "rows"):
        table.add_column(col, justify="left" if col == "table" else "right")
    for name, n in sorted({**out.result.rows, **out.rows}.items()):
        table.add_row(name, f"{n:,}")
    console.print(table)
    for name, st in out.hooks.items():
        lost = f", {st.drops:,} DROPPED" if st.drops else ""
        console.print(f"{name}: {st.variant}, {st.events:,} decisions{lost}")
    if out.tracepoint:
        console.print(f"tracepoint variant: {json.dumps(out.tracepoint)}")
    if out.shadow:
        for kind, s in out.shadow.items():
            _print_shadow(kind, s)
    console.print(out.result.end_line(str(out.path)))


def _ns_line(ns: dict[str, Any] | None) -> str:
    """The inference times of one population, named: p50, p99, mean and max all of it."""
    if not ns:
        return "  inference: no rows"
    return (
        f"  inference (features + MLP) over the {ns['decisions']:,} {ns['population']}: "
        f"p50 {ns['p50']:.0f} ns, p99 {ns['p99']:.0f} ns, mean {ns['mean']:.0f} ns, "
        f"max {ns['max']:.0f} ns"
    )


def _print_shadow(kind: str, s: dict[str, Any]) -> None:
    k = s.get("kernel") or {}
    rows = s.get("rows") or {}
    if kind == "tracepoint":
        # the program sees every pull while attached; the data set only those its
        # scheduler tables saw: each figure says which it covers
        line = (
            f"shadow (tracepoint): {k.get('decisions', 0):,} pulls seen in the kernel while "
            f"attached, the model agreeing (migrate) on {_pct(k.get('agreement'))}"
        )
        if rows.get("data_set_pulls") is not None:
            line += (
                f"; on the {rows['data_set_pulls']:,} pulls of the data set: "
                f"{rows['pulls']:,} evaluated, {rows['model_migrates']:,} migrate, agreement "
                f"{_pct(rows['agreement'])} ({rows['outside_data_set']:,} pulls outside it)"
            )
        console.print(line)
    else:
        console.print(
            f"shadow ({kind}): {k.get('decisions', 0):,} decisions seen in the kernel, "
            f"{k.get('filtered', 0):,} after MLLB's filter; agreement with the kernel on those: "
            f"{_pct(k.get('agreement'))}; confusion [[tn, fp], [fn, tp]] = {k.get('confusion')}"
        )
        if rows:
            shown = {x: rows[x] for x in rows if x != "confusion"}
            console.print(f"  from the rows: {json.dumps(shown)}")
    console.print(_ns_line(s.get("inference_ns")))


@lb_group.command("collect", context_settings={"ignore_unknown_options": False})
@_collect_options
@click.option(
    "--model", "model_path", type=reachable_path(dir_okay=False, path_type=Path),
    help="also evaluate this model in the kernel on every decision (shadow mode)",
)  # fmt: skip
def collect_cmd(variant, config_files, repeat, attach, benchmark, duration, output_dir,
                migration_cost_ns, no_progress, command, model_path) -> None:  # fmt: skip
    """Run a benchmark (or COMMAND) and record CFS's load-balancing decisions.

    \b
    The collection gets table lb_decisions: one row per can_migrate_task()
    call, system-wide, with what MLLB recorded (runqueue lengths and loads,
    idle type, NUMA data, balance failures, buddies, delta since the task
    last ran) and the kernel's answer. Examples:
      kernmlops lb collect -b stress-ng -c numa.yaml
      kernmlops vm -o lab -- kernmlops lb collect -o lab -b stress-ng -d 20
      kernmlops lb collect --variant tracepoint -- ./app
    """
    _run_collect(variant, config_files, repeat, attach, benchmark, duration, output_dir,
                 migration_cost_ns, no_progress, command, model_path)  # fmt: skip


@lb_group.command("shadow", context_settings={"ignore_unknown_options": False})
@click.argument("model_path", type=reachable_path(dir_okay=False, path_type=Path))
@_collect_options
def shadow_cmd(model_path, variant, config_files, repeat, attach, benchmark, duration,
               output_dir, migration_cost_ns, no_progress, command) -> None:  # fmt: skip
    """Run MODEL in the kernel beside the real scheduler while a benchmark runs.

    \b
    MODEL is lb train's JSON (quantized here) or lb export's Q20.11 JSON.
    The weights are set in a BPF program before it loads; on every decision
    it computes the 15 features and the MLP in fixed point, and counts
    agreement with the kernel's answer and its own time (MLLB's TEST mode,
    without a patch). kprobe variant: every can_migrate_task (the lab);
    tracepoint variant: the balancer's pulls, on any kernel. The summary is
    printed and kept in the collection's manifest (lb.shadow): the in-kernel
    counters over every decision seen while attached, and agreement and
    inference times (p50, p99, mean) over the data set's own decisions (kprobe:
    after MLLB's filter; tracepoint: the pulls of its data set). Per-decision
    answers are in lb_decisions (model_pred, model_out, infer_ns; tracepoint:
    on its pulls, each the very inputs the model was given) and, for every pull
    the program saw, in lb_tp_shadow.

    \b
    Examples:
      kernmlops lb shadow lb-model.json --variant tracepoint -b stress-ng
      kernmlops vm -o lab -- kernmlops lb shadow out/kmo_lb_model.q11.json -o lab -b stress-ng
    """
    _run_collect(variant, config_files, repeat, attach, benchmark, duration, output_dir,
                 migration_cost_ns, no_progress, command, model_path)  # fmt: skip


# --- import ---------------------------------------------------------------------------


@lb_group.command("import-mllb")
@click.argument(
    "files", nargs=-1, required=True, type=reachable_path(dir_okay=False, path_type=Path)
)
@click.option(
    "-o", "--output-dir", type=reachable_path(file_okay=False, path_type=Path),
    default=Path("data"), show_default=True, help="root of the collections",
)  # fmt: skip
@click.option("--collection-id", help="collection id (one file only; default: mllb-<file stem>)")
def import_cmd(files: tuple[Path, ...], output_dir: Path, collection_id: str | None) -> None:
    """Import decisions dumped in MLLB's CSV format (raw_<tag>.csv of its
    dump_lb.py), one collection per file, as table lb_decisions.

    \b
    Examples:
      kernmlops lb import-mllb raw_ng.csv raw_fft.csv       -> data/curated/...
      kernmlops lb import-mllb raw_ng.csv --collection-id ng-run1 -o mllb-data
    """
    from kernmlops.lb.dataset import check_id, write_decisions
    from kernmlops.lb.mllb_import import read_mllb_csv

    if collection_id and len(files) > 1:
        raise click.UsageError("--collection-id names one collection: give one file")
    try:
        for path in files:
            frame = read_mllb_csv(path, collection_id)
            cid = frame["collection_id"][0]
            check_id(cid)  # before any folder is made for it
            with _users_folder(output_dir) as root:
                out = write_decisions(
                    frame, root, cid, "mllb-import",
                    {"lb": {"variant": "mllb", "source": str(path)}},
                )  # fmt: skip
            out = output_dir / out.relative_to(root)
            console.print(f"{path}: {frame.height:,} decisions -> {out}")
    except KernmlopsError as err:
        fail(err)


@contextlib.contextmanager
def _users_folder(folder: Path) -> Iterator[Path]:
    """``folder`` (made if missing) held open; the path to write in it through. Under
    sudo, what the block writes there is the invoking user's, as ``lb export``'s
    files are: a model, a report or a collection of theirs that only root may change
    would stop their next run without sudo."""
    from kernmlops.host.invoker import invoker
    from kernmlops.host.pinned import handed_over_held, pin

    who = invoker()
    held = pin(folder, create=True, invoker_uid=who.uid if who else None)
    try:
        with handed_over_held(held):
            yield held.io
    finally:
        held.close()


# --- train / export -------------------------------------------------------------------


def _score_line(name: str, m: dict[str, Any]) -> str:
    r = m.get("recall_per_class") or {}
    return (
        f"  {name:<24} balanced {_pct(m.get('balanced_accuracy')):>7}  recall stay "
        f"{_pct(r.get('stay')):>7}  migrate {_pct(r.get('migrate')):>7}  accuracy "
        f"{_pct(m.get('accuracy')):>7}  [[tn, fp], [fn, tp]] {m['confusion']}"
    )


def _print_metrics(title: str, section: dict[str, Any]) -> None:
    if not section.get("float"):
        console.print(f"{title}: no rows")
        return
    f, q, a = section["float"], section["fixed"], section["float_vs_fixed"]
    console.print(
        f"{title}: {section['rows']:,} decisions ({f['negatives']:,} stay, {f['positives']:,} "
        f"migrate) from {len(section['collections'])} collection(s)"
    )
    console.print(_score_line("model (float)", f))
    console.print(_score_line("model (fixed Q20.11)", q))
    console.print(_score_line("hand rule (15 features)", section["rule"]))
    if section.get("majority"):
        console.print(_score_line("always the commoner", section["majority"]))
    console.print(
        f"  float vs fixed decisions agree {_pct(a['agreement'])} (max |logit diff| "
        f"{a['max_abs_logit_diff']:.4f} <= bound {a['max_bound']:.4f}: {a['within_bound']})"
    )


@lb_group.command("train")
@click.argument("data", nargs=-1, required=True, type=reachable_path(path_type=Path))
@click.option(
    "-o", "--output", type=reachable_path(dir_okay=False, path_type=Path),
    default=Path("lb-model.json"), show_default=True,
    help="model file (JSON, float weights and metadata)",
)  # fmt: skip
@click.option(
    "--split", type=click.Choice(["collection", "rows"]), default="collection", show_default=True,
    help="collection: test on runs never trained on; rows: a random share of rows",
)  # fmt: skip
@click.option("--test-collection", "tests", multiple=True, help="a test collection id (repeatable)")
@click.option(
    "--test-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.25,
    show_default=True, help="share of the runs (or rows) tested on, 0 and 1 excluded",
)  # fmt: skip
@click.option("--epochs", type=click.IntRange(min=1), default=60, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--migration-cost-ns", type=click.IntRange(min=1), default=None,
              help="default: the collections' own (recorded), else 500000")  # fmt: skip
@click.option("--balanced", is_flag=True,
              help="weigh both answers alike in the loss ('stay' is rare)")  # fmt: skip
def train_cmd(data, output, split, tests, test_fraction, epochs, seed, migration_cost_ns,
              balanced) -> None:  # fmt: skip
    """Train MLLB's MLP (15 -> 10 ReLU -> 1, numpy) on the lb_decisions of DATA
    (collection folders or roots) after MLLB's filter; print, on the training and
    the test runs, the model (float and Q20.11), the hand rule and always the
    commoner answer: balanced accuracy, the recall of each answer, accuracy and
    the confusion matrix (precision and F1 too in the model's meta.report).

    \b
    Examples:
      kernmlops lb train lab -o lb-model.json
      kernmlops lb train data --balanced --test-fraction 0.3 --seed 1
    """
    from kernmlops.lb.dataset import load_decisions, recorded_cost
    from kernmlops.lb.features import MIGRATION_COST_NS
    from kernmlops.lb.model import TrainConfig, check_writable
    from kernmlops.lb.pipeline import train_model

    try:
        check_writable(output)  # before the training, not after it
        decisions = load_decisions(list(data))
        result = train_model(
            decisions, split=split, test_collections=list(tests) or None,
            test_fraction=test_fraction, seed=seed,
            config=TrainConfig(epochs=epochs, seed=seed, balanced=balanced),
            migration_cost_ns=migration_cost_ns or recorded_cost(list(data)) or MIGRATION_COST_NS,
            sources=[str(p) for p in data],
        )  # fmt: skip
        with _users_folder(output.parent) as folder:
            result.model.save(folder / output.name, shown=output)
    except KernmlopsError as err:
        fail(err)
    rep = result.report
    console.print(f"{rep['decisions']:,} decisions, {rep['filtered']:,} after MLLB's filter")
    _print_metrics("train", rep["train"])
    _print_metrics("test", rep["test"])
    console.print(f"model -> {output}")


@lb_group.command("export")
@click.argument("model_path", type=reachable_path(dir_okay=False, path_type=Path))
@click.option(
    "-o", "--output-dir", type=reachable_path(file_okay=False, path_type=Path), default=Path("."),
    show_default=True,
)  # fmt: skip
@click.option("--name", default="kmo_lb_model", show_default=True, help="file stem of the outputs")
@click.option(
    "--data",
    "data",
    multiple=True,
    type=reachable_path(path_type=Path),
    help="decisions to measure float vs fixed on (default: the model's test runs)",
)
def export_cmd(model_path: Path, output_dir: Path, name: str, data: tuple[Path, ...]) -> None:
    """Export MODEL in Q20.11 fixed point: NAME.h (C, also a drop-in for the
    weight arrays of MLLB's kernel patch) and NAME.q11.json (lb shadow's input),
    with float vs fixed agreement.

    \b
    Example:
      kernmlops lb export lb-model.json -o out/   -> out/kmo_lb_model.h, .q11.json
    """
    from kernmlops.lb.dataset import load_decisions
    from kernmlops.lb.fixed import FixedModel, c_header, fixed_json
    from kernmlops.lb.model import Model
    from kernmlops.lb.pipeline import evaluate, prepare

    if not name or "/" in name or name.startswith("."):  # a file name in -o, nothing else
        fail(KernmlopsError(f"--name {name!r}: a file name (no '/', not starting with '.')"))
    for p in data:  # named by the user: a typo is an error, not a check skipped
        if not Path(p).exists():
            fail(KernmlopsError(f"--data {p}: no such file or folder"))
    try:
        model = Model.load(model_path)
        fixed = FixedModel.from_model(model)
        report = model.meta.get("report") or {}
        sources = [Path(p) for p in data] or [Path(p) for p in report.get("sources", [])]
        meta = {k: v for k, v in model.meta.items() if k != "report"}
        check = None
        if sources and all(p.exists() for p in sources):
            frame = prepare(load_decisions(sources))
            tests = report.get("test", {}).get("collections") if not data else None
            if tests:
                import polars as pl

                frame = frame.filter(pl.col("collection_id").is_in(tests))
            if frame.height:
                check = evaluate(model, fixed, frame, int(meta.get("migration_cost_ns", 500000)))
                meta["float_vs_fixed"] = check["float_vs_fixed"]
        from kernmlops.fileio import write_atomic
        from kernmlops.host.invoker import invoker
        from kernmlops.host.pinned import handed_over_held, pin

        who = invoker()
        # held open: no link planted on the way is written through; under sudo the
        # files are the user's, handed over through the held folder
        held = pin(output_dir, create=True, invoker_uid=who.uid if who else None)
        try:
            with handed_over_held(held):
                header, js = output_dir / f"{name}.h", output_dir / f"{name}.q11.json"
                write_atomic(
                    held.io / header.name, c_header(fixed, meta, guard=f"{name.upper()}_H")
                )
                text = json.dumps(fixed_json(fixed, meta), indent=1) + "\n"
                write_atomic(held.io / js.name, text)
        finally:
            held.close()
    except KernmlopsError as err:
        fail(err)
    except OSError as err:
        fail(KernmlopsError(f"cannot write to {output_dir}: {err.strerror}"))
    console.print(f"wrote {header} and {js}")
    if check:
        a = check["float_vs_fixed"]
        fits = a["max_abs_sum"] < 1 << 31
        console.print(
            f"float vs fixed on {a['rows']:,} decisions: {_pct(a['agreement'])} agree; max |logit "
            f"diff| {a['max_abs_logit_diff']:.4f} (bound {a['max_bound']:.4f}, within: "
            f"{a['within_bound']}); largest int32 sum {a['max_abs_sum']:,} "
            + ("(< 2^31)" if fits else ">= 2^31")
        )
        if not fits:  # the header's own sums are 64-bit, as lb shadow's and kmo_lb's
            console.print(
                "warning: a sum on these decisions does not fit an int32: in MLLB's patch "
                "(int32 sums) the model would wrap; its 64-bit sums here, in lb shadow "
                "and in kmo_lb do not"
            )
    elif sources and not data:
        console.print(
            f"no decisions to compare float and fixed on: the model's training data "
            f"({', '.join(map(str, sources))}) is not all here (pass --data)"
        )
    else:
        console.print("no decisions to compare float and fixed on (pass --data)")


@lb_group.command("dump-weights")
@click.argument("model_path", metavar="MODEL", type=reachable_path(path_type=Path))
@click.option("--layout", type=click.Choice(["0", "1", "2"]), default="2", show_default=True,
              help="MLLB's layouts: 2 W1 row by row, each other array on one line; 1 every "
              "array on one line; 0 W1 and W2 row by row, biases one value a line")  # fmt: skip
def dump_weights_cmd(model_path: Path, layout: str) -> None:
    """Print MODEL's W1, b1, W2, b2 as MLLB's dump_weights.py prints them (for
    the weight arrays of its kernel patch; b2 + 0.5, since the patch migrates
    when its output is above 0.5 and the model when its logit is above 0).

    \b
    MODEL is lb train's float model or lb export's *.q11.json (printed as the
    floats its Q20.11 integers stand for). It must hold MLLB's network:
    15 x 10 + 10 + 10 x 1 + 1 = 171 finite numbers.
      kernmlops lb dump-weights lb-model.json
      kernmlops lb dump-weights out/kmo_lb_model.q11.json --layout 1"""
    from kernmlops.lb.weights import NR_PARAMS, dump, read_weights

    try:
        weights = read_weights(model_path)
    except KernmlopsError as err:
        fail(err)
    click.echo(dump(weights, int(layout)), nl=False)
    console.print(f"{model_path}: {weights.kind} model, {NR_PARAMS} parameters "
                  "(W1 15x10, b1 10, W2 10x1, b2 1)")  # fmt: skip


@lb_group.command("import-weights")
@click.argument("weights_path", metavar="FILE", type=reachable_path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=reachable_path(dir_okay=False, path_type=Path),
              default=Path("mllb-model.json"), show_default=True,
              help="the model, as lb train writes one")  # fmt: skip
def import_weights_cmd(weights_path: Path, output: Path) -> None:
    """Read MLLB's own trained model: the w1, b1, w2, b2 arrays of its patch
    (kernel/sched/jc_mlp.c) or module (kmod/c_mlp.h), or the text of its
    dump_weights.py; write it as lb train's model (for lb export, shadow,
    report, deploy).

    \b
    b2 is MLLB's minus 0.5: its patch migrates when the output is above 0.5,
    our models when it is above 0 (the same decisions).
      kernmlops lb import-weights jc_mlp.c -o mllb-model.json"""
    from kernmlops.lb.mllb_weights import read

    try:
        model = read(weights_path)
        with _users_folder(output.parent) as folder:  # the user's file under sudo
            model.save(folder / output.name, shown=output)
    except KernmlopsError as err:
        fail(err)
    console.print(f"{weights_path}: MLLB's 15 -> 10 -> 1 model -> {output}")


# --- report ---------------------------------------------------------------------------


@lb_group.command("report")
@click.argument("data", nargs=-1, required=True, type=reachable_path(path_type=Path))
@click.option("--model", "model_path", type=reachable_path(dir_okay=False, path_type=Path))
@click.option("--json", "json_out", type=reachable_path(dir_okay=False, path_type=Path),
              help="also write the report as JSON")  # fmt: skip
def report_cmd(data: tuple[Path, ...], model_path: Path | None, json_out: Path | None) -> None:
    """What DATA holds per collection (decisions, share migrated, agreement of
    the kernel's rule with the kernel) and, with --model, the model's metrics
    per collection and its shadow results from the manifests.

    --model takes lb train's float model or lb export's *.q11.json; the latter
    is evaluated in Q20.11 fixed point, as the kernel evaluates it.

    \b
    Examples:
      kernmlops lb report lab
      kernmlops lb report lab --model out/kmo_lb_model.q11.json --json report.json
    """
    from kernmlops.lb.report import build_report

    try:
        rep = build_report([Path(p) for p in data], model_path)
    except KernmlopsError as err:
        fail(err)
    table = Table(title="lb decisions", title_justify="left")
    for col in ("collection", "scenario", "variant", "decisions", "filtered", "stay", "migrate",
                "rule", "model", "shadow"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("collection", "scenario", "variant")
                         else "right")  # fmt: skip
    for c in rep["collections"]:
        table.add_row(
            c["collection_id"], c.get("scenario") or "-", c["variant"], f"{c['decisions']:,}",
            f"{c['filtered']:,}", f"{c['stay']:,}", _pct(c["migrate_share"]),
            _pct(c["rule_accuracy"]), _pct(c.get("model_accuracy")),
            _pct(c.get("shadow_agreement")),
        )  # fmt: skip
    # the table and the scores under it are one text on one stream: never interleaved
    out = Console(width=max(120, Console().width), highlight=False, markup=False)
    out.print(table)
    if rep.get("hand_rule"):
        out.print("all filtered decisions (accuracy columns above; balanced here):")
        if rep.get("model_kind"):
            out.print(f"  model: {model_path}, evaluated in {rep['model_kind']}", soft_wrap=True)
        for name, key in (("model", "model"), ("hand rule (15 features)", "hand_rule"),
                          ("always the commoner", "majority")):  # fmt: skip
            if rep.get(key):
                out.print(_score_line(name, rep[key]), soft_wrap=True)
    if json_out:
        from kernmlops.errors import OutputError, why_not_written
        from kernmlops.fileio import write_atomic

        try:  # whole or not at all (a full disk), never through a link planted there
            with _users_folder(json_out.parent) as folder:
                write_atomic(folder / json_out.name, json.dumps(rep, indent=1, default=str) + "\n")
        except KernmlopsError as err:
            fail(err)
        except OSError as err:
            fail(OutputError(f"cannot write the report to {json_out}: "
                             f"{why_not_written(err, json_out)}"))  # fmt: skip
        console.print(f"report -> {json_out}")


# --- the model decides: the kmo_lb kernel module ----------------------------------------


def _lab_release() -> str | None:
    from kernmlops.errors import KernmlopsError as _E
    from kernmlops.vm.qemu import default_kernel

    try:
        return default_kernel().name.removeprefix("vmlinuz-")
    except _E:
        return None


@lb_group.command("build-kmod")
@click.option("--release", help="kernel release to build for (default: the lab's kernel, "
              "the newest non-running /boot/vmlinuz-*)")  # fmt: skip
@click.option("-o", "--out", "build_dir", type=reachable_path(file_okay=False, path_type=Path),
              help="build folder (default: $KERNMLOPS_KMOD_DIR, else build/kmod of a source "
              "checkout, else ~/.cache/kernmlops/kmod)")  # fmt: skip
@click.option("--force", is_flag=True, help="rebuild even when current")
def build_kmod_cmd(release: str | None, build_dir: Path | None, force: bool) -> None:
    """Build the kmo_lb kernel module (kbuild, against linux-headers-RELEASE).

    Built on the host for the lab's kernel, `lb deploy` in the lab finds it
    (building there works too, 20-30x slower under QEMU without KVM).

    \b
    Examples:
      kernmlops lb build-kmod                       the lab's kernel, into --out's default
      kernmlops lb build-kmod --release "$(uname -r)"   the running kernel (its headers)
    """
    from kernmlops.lb import deploy

    release = release or _lab_release()
    if not release:
        fail(deploy.KmodError(
            "no lab kernel in /boot: pass --release, or apt-get install linux-image-amd64"
        ))  # fmt: skip
    try:
        ko = deploy.build(release, build_dir, force=force)
    except KernmlopsError as err:
        fail(err)
    console.print(f"{ko} (for {release})")


@lb_group.command("deploy")
@click.argument("model_path", metavar="MODEL", type=reachable_path(dir_okay=False, path_type=Path))
@click.option("--mode", type=click.Choice(["off", "shadow", "replace"]), default="shadow",
              show_default=True, help="off: the kernel decides alone; shadow: count agreement, "
              "decide nothing; replace: the model decides")  # fmt: skip
@click.option(
    "--ko",
    type=reachable_path(dir_okay=False, exists=True, path_type=Path),
    help="a built kmo_lb.ko (default: RELEASE/ in --build-dir, built if missing)",
)
@click.option("--build-dir", type=reachable_path(file_okay=False, path_type=Path),
              help="where modules are built and looked for (default: $KERNMLOPS_KMOD_DIR, "
              "else build/kmod of a source checkout, else ~/.cache/kernmlops/kmod)")  # fmt: skip
@click.option("--migration-cost-ns", type=click.IntRange(min=1),
              help="sysctl_sched_migration_cost for the features (default: model)")  # fmt: skip
def deploy_cmd(model_path: Path, mode: str, ko: Path | None, build_dir: Path | None,
               migration_cost_ns: int | None) -> None:  # fmt: skip
    """Let MODEL (lb export's *.q11.json) take can_migrate_task's decision.

    \b
    Loads the kmo_lb module (root; a kernel with kprobes: the lab's 6.1):
      kernmlops lb build-kmod                              on the host, for the lab
      kernmlops vm -- kernmlops lb deploy out/kmo_lb_model.q11.json --mode replace
    Only the cache-hotness part of the decision is the model's: tasks that are
    throttled, per-CPU kthreads, pinned away from the destination, migration-
    disabled, running, or in an active balance get the kernel's answer.
    Then: `lb mode off|shadow|replace`, `lb status`, `lb undeploy`."""
    from kernmlops.lb import deploy

    try:
        model = deploy.load_q11(model_path)
        used = deploy.deploy(model, mode, ko=ko, build_dir=build_dir,
                             migration_cost_ns=migration_cost_ns)  # fmt: skip
    except KernmlopsError as err:
        fail(err)
    console.print(f"{deploy.MODULE} loaded from {used}, mode {mode}")


@lb_group.command("mode")
@click.argument("mode", type=click.Choice(["off", "shadow", "replace"]))
def mode_cmd(mode: str) -> None:
    """Switch the deployed model's MODE at run time (counters keep counting).

    \b
    Example (in the lab, after lb deploy):
      kernmlops lb mode replace
    """
    from kernmlops.lb import deploy

    try:
        deploy.set_mode(mode)
    except KernmlopsError as err:
        fail(err)
    console.print(f"{deploy.MODULE}: mode {mode}")


@lb_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="print the counters as JSON")
def status_cmd(as_json: bool) -> None:
    """The deployed model's counters: calls seen, decisions the model took,
    agreement with the kernel, answers overridden, ns per decision.

    \b
    Example (in the lab, after lb deploy):
      kernmlops lb status --json
    """
    from kernmlops.lb import deploy

    try:
        s = deploy.stats()
    except KernmlopsError as err:
        fail(err)
    if as_json:
        click.echo(json.dumps(s))
        return
    ns = "-" if s["ns_mean"] is None else f"{s['ns_mean']:.0f}"
    click.echo(
        f"mode {s['mode']}: {s['calls']:,} calls, {s['hard_constraint']:,} left to the kernel's "
        f"hard constraints, {s['decisions']:,} decisions by the model ({_pct(s['agreement'])} "
        f"agree; model yes/kernel no {s['model_yes_kernel_no']:,}, model no/kernel yes "
        f"{s['model_no_kernel_yes']:,}), {s['overridden']:,} overridden, {ns} ns per decision "
        f"(max {s['ns_max']:,}), {s['missed']:,} missed"
    )


@lb_group.command("undeploy")
def undeploy_cmd() -> None:
    """Unload the kmo_lb module: can_migrate_task is the kernel's alone again.

    \b
    Example (in the lab):
      kernmlops lb undeploy
    """
    from kernmlops.lb import deploy

    try:
        deploy.undeploy()
    except KernmlopsError as err:
        fail(err)
    console.print(f"{deploy.MODULE} unloaded")
