"""The command line: a thin layer that parses, calls the library, and reports."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click

from kernmlops.clitools import (
    CONTEXT_SETTINGS,
    check_tgid,
    error_line,
    fail,
    progress,
    reachable_path,
    require_bpf_privileges,
    shows_live,
    survive_closed_output,
    warnings_as_lines,
)
from kernmlops.errors import (
    CollectionError,
    ConfigError,
    KernmlopsError,
    OutputError,
    why_not_written,
)

#: the overrides file `kernmlops collect` reads from the current folder without -c
OVERRIDES = "overrides.yaml"

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from kernmlops.config import CollectorConfig
    from kernmlops.exporter.webconfig import WebConfig
    from kernmlops.hooks.base import HookStatus
    from kernmlops.host.invoker import Invoker


@functools.cache
def _console() -> Console:
    """The stderr console, made on first use: rich is imported after a collection's
    probes are attached, not before."""
    from rich.console import Console

    return Console(stderr=True)


def _say(text: str) -> None:
    """A plain line on stderr (no rich: it is printed before the probes attach)."""
    click.echo(text, err=True)


def _line(text: str) -> None:
    """One message line on stderr (rich markup, the values in it escaped). Never wrapped:
    a path or a command in it stays whole for a log's reader, grep and copy-paste (rich
    wraps at 80 columns when stderr is not a terminal)."""
    _console().print(text, highlight=False, soft_wrap=True)


def _session_message(text: str) -> None:
    """A collection's message: a progress note ("note: ...") as it is, anything else
    as a warning."""
    from rich.markup import escape

    if text.startswith("note: "):
        _line(escape(text.removeprefix("note: ")))
    else:
        _line(f"[yellow]warning:[/] {escape(text)}")


class _UsageLine(click.ClickException):
    """A usage error (a bad flag or value, click's or a command's own) said as every
    other error: one ``error:`` line naming the command's help, exit 2 (click's own
    form is three lines: the usage, a hint and the error)."""

    exit_code = 2

    def __init__(self, err: click.UsageError) -> None:
        message = err.format_message()
        # click's sentences end in a full stop; the hint follows in brackets
        super().__init__(message[:-1] if message.endswith(".") else message)
        self.command_path = err.ctx.command_path if err.ctx else "kernmlops"

    def show(self, file: Any = None) -> None:
        error_line(f"{self.message} (see {self.command_path} --help)")


class _Interrupted(click.ClickException):
    """Ctrl+C in a command without a stop of its own (graph, report, push, lb train, ...):
    one line and the status of a stop by SIGINT, 130, as collect's (click's own form is
    a blank line, "Aborted!" and exit 1). What the command wrote whole is kept: every
    file is written through a temporary name."""

    exit_code = 130

    def __init__(self) -> None:
        super().__init__("interrupted")

    def show(self, file: Any = None) -> None:
        _say("interrupted: stopped before it finished (what it had written whole is kept)")


@contextlib.contextmanager
def _usage_in_one_line() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # a group given no command: its help, as asked
    except click.UsageError as err:
        raise _UsageLine(err) from None
    except KeyboardInterrupt:
        raise _Interrupted() from None


class _LazyGroup(click.Group):
    """Commands of other packages are imported only when asked for: `collect`
    does not pay for the analysis side's imports before its probes attach. A usage
    error in any command is one line (:class:`_UsageLine`), and so is Ctrl+C
    (:class:`_Interrupted`)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _usage_in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_in_one_line():
            return super().invoke(ctx)

    #: command name -> "module:attribute"
    LAZY: ClassVar[dict[str, str]] = {
        "vm": "kernmlops.vm.cli:vm_command",
        "graph": "kernmlops.graphs.cli:graph_command",
        "report": "kernmlops.graphs.cli:report_command",
        "duet": "kernmlops.duet.cli:duet_group",
        "lb": "kernmlops.lb.cli:lb_group",
        "export": "kernmlops.exporter.cli:export_command",
        "push": "kernmlops.fleet.cli:push_command",
        "fleet": "kernmlops.fleet.cli:fleet_group",
        "spark-job": "kernmlops.fleet.cli:spark_job_command",
    }

    #: KernMLOps' `collect <sub>` commands -> ours: "module:attribute", or the name of
    #: one of this group's commands (after `collect --` a program of that name runs, as
    #: any command does)
    KERNMLOPS_COLLECT: ClassVar[dict[str, str]] = {
        # `collect` with KernMLOps' -d (its benchmarks' folder, not our duration)
        "data": "kernmlops.cli:collect_data",
        "dump": "kernmlops.graphs.cli:kernmlops_dump_command",
        "graph": "kernmlops.graphs.cli:kernmlops_graph_command",
        "perf-list": "perf-list",
        "defaults": "defaults",
    }

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if len(args) > 1 and args[0] == "collect" and args[1] in self.KERNMLOPS_COLLECT:
            target = self.KERNMLOPS_COLLECT[args[1]]
            if ":" not in target:  # ours under its own name, named as typed
                return f"collect {args[1]}", self.get_command(ctx, target), args[2:]
            import importlib

            module, attr = target.split(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return f"collect {args[1]}", command, args[2:]
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *self.LAZY]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            import importlib

            module, attr = self.LAZY[cmd_name].split(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(
    cls=_LazyGroup,
    context_settings=CONTEXT_SETTINGS,
)
@click.version_option(package_name="kernmlops", prog_name="kernmlops")
def cli() -> None:
    """Collect kernel data with CO-RE eBPF while a benchmark or any command runs.

    \b
    Quick start (as root):
      kernmlops doctor                       what this kernel allows
      kernmlops collect                      the default benchmark (stress-ng)
      kernmlops collect -- ./app arg1 arg2   trace one command and its children
      kernmlops collect -b faux              everything, until Ctrl+C
    Collections land in data/curated/benchmark=<b>/collection_id=<id>/ as
    Parquet plus manifest.json; read them with kernmlops.data.read_collection.
    """
    # every command says the library's warnings as its own: one `warning:` line each
    click.get_current_context().with_resource(warnings_as_lines())


# --- collect -------------------------------------------------------------------
def _progress_table(p, attached) -> Table:
    from rich.table import Table

    table = Table(title=f"collecting {p.elapsed_s:6.1f} s  ·  {p.benchmark}", title_justify="left")
    table.add_column("hook")
    table.add_column("state")
    table.add_column("events", justify="right")
    table.add_column("drops", justify="right")
    # records in the spool: rows are made when the machine has CPU to spare, or at stop
    waiting = any(p.spooled.values())
    if waiting:
        table.add_column("spooled", justify="right")
    for name, status in attached.items():
        state = status.variant or "attached" if status.attached else "[yellow]not attached[/]"
        drops = p.drops.get(name, 0)
        row = [name, state, f"{p.events.get(name, 0):,}", f"[red]{drops:,}[/]" if drops else "0"]
        if waiting:
            row.append(f"{p.spooled.get(name, 0) / 2**20:,.1f} MiB")
        table.add_row(*row)
    return table


def _cpus_that_lost(by_cpu: list[int]) -> str:
    """ ", on CPUs 3 (1,024), 7 (12)": the CPUs whose records were lost, most first."""
    lost = sorted(((n, cpu) for cpu, n in enumerate(by_cpu) if n), reverse=True)
    if not lost:
        return ""
    shown = ", ".join(f"{cpu} ({n:,})" for n, cpu in lost[:6])
    more = f" and {len(lost) - 6} more" if len(lost) > 6 else ""
    return f", on CPU{'s' if len(lost) > 1 else ''} {shown}{more}"


#: a copier thread busy this share of a second (or more) was its ring's limit
BUSY_COPIER = 0.75


def drop_advice(hooks: Mapping[str, HookStatus], options: Callable[[str], Any]) -> list[str]:
    """One line per hook that lost events, with the remedy for its kind: a BPF hook's
    ring was full; a poller (``poll_hz``) missed samples while the machine was busy.
    ``options(name)`` gives a hook's options."""
    lines = []
    for name, st in hooks.items():
        if not st.drops:
            continue
        opts = options(name)
        if hasattr(opts, "ring_kib"):
            copier = st.copier or {}
            if copier.get("native") is False:
                remedy = "build the native ring copier (kernmlops build-bpf), or raise "
            elif copier.get("error") and copier.get("nice") is None:
                # neither SCHED_FIFO nor a lower nice: no CAP_SYS_NICE
                remedy = (f"give the collector CAP_SYS_NICE (the copier's priority was "
                          f"refused: {copier['error']}), or raise ")  # fmt: skip
            elif (copier.get("busy_peak") or 0) >= BUSY_COPIER:  # None: no copier ran
                # one thread moving the ring was the limit: split the ring's CPUs
                remedy = (f"raise hooks.{name}.ring_groups (a copier thread was busy "
                          f"{copier['busy_peak']:.0%} of a second), or raise ")  # fmt: skip
            elif copier.get("queue_full"):
                # the disk writer waited so long that its queue filled (diskqueue.c)
                remedy = (f"collect to a faster disk or raise collector.spool_memory_mib "
                          f"(the spool's disk writes waited: its queue was full "
                          f"{copier['queue_full']:,} times), or raise ")  # fmt: skip
            elif (copier.get("runway") or {}).get("error"):
                # the spool's disk writes waited for the filesystem (native/runway.c)
                remedy = ("collect to a filesystem that can allocate ahead, such as ext4 or "
                          f"xfs (the spool's could not: {copier['runway']['error']}), or "
                          "raise ")  # fmt: skip
            else:
                remedy = "raise "
            where = _cpus_that_lost(st.drops_by_cpu)
            lines.append(f"{name}: {st.drops:,} events dropped (its ring was full{where}): "
                         f"{remedy}hooks.{name}.ring_kib")  # fmt: skip
        elif hasattr(opts, "poll_hz"):
            lines.append(f"{name}: {st.drops:,} samples missed (the machine was too busy to "
                         f"read at poll_hz {opts.poll_hz:g}): lower hooks.{name}.poll_hz, or "
                         "set collector.nice: -10")  # fmt: skip
        else:
            lines.append(f"{name}: {st.drops:,} events dropped")
    return lines


def unseen_lines(hooks: Mapping[str, HookStatus]) -> list[str]:
    """One line per hook whose reconciliation with the kernel's own count found what
    it never saw (block_io: a disk's completions by /proc/diskstats that no row and no
    count holds), each disk named."""
    lines = []
    for name, st in hooks.items():
        disks = (st.reconciliation or {}).get("disks") or {}
        short = {dev: d for dev, d in disks.items() if (d.get("completions_not_seen") or 0) > 0}
        if not short:
            continue
        total = sum(d["completions_not_seen"] for d in short.values())
        each = ", ".join(f"{d.get('name') or dev} {d['completions_not_seen']:,} of "
                         f"{d['kernel_completed']:,}" for dev, d in short.items())  # fmt: skip
        missed = st.counters.get("missed_completions", 0)
        counted = f"; {missed:,} more counted as missed_completions" if missed else ""
        lines.append(f"{name}: {total:,} completions never seen, no row and no count "
                     f"({each}, by /proc/diskstats{counted}): the kernel skipped its "
                     f"programs (manifest: hooks.{name}.reconciliation)")  # fmt: skip
    for name, st in hooks.items():
        lost = st.counters.get("rows_not_in_collection", 0)
        if lost > 0:
            lines.append(f"{name}: {lost:,} rows its programs wrote never reached the "
                         "collection, and no drop counts them (manifest: "
                         f"hooks.{name}.reconciliation.rows_written)")  # fmt: skip
    return lines


def _summary(result) -> Table:
    from rich.table import Table

    table = Table(title=f"collection {result.collection_id}", title_justify="left")
    for col, just in (("hook", "left"), ("status", "left"), ("events", "right"),
                      ("drops", "right"), ("rows", "right")):  # fmt: skip
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for name, st in result.hooks.items():
        status = (
            f"[red]failed[/] ({'detached' if st.attached else 'not attached'})"
            if st.failed
            else f"[green]{st.variant or 'attached'}[/]"
            if st.attached
            else f"[yellow]{st.reason}[/]"
        )
        rows = ", ".join(f"{t}={n:,}" for t, n in st.rows.items()) or "-"
        lost = st.drops + st.missed
        drops = f"[red]{st.drops:,} + {st.missed:,} missed[/]" if lost else "0"
        # records left in its spool are not counted yet (a line below says so)
        events = f"{st.events:,}" + (" [yellow]+ spool[/]" if name in result.waiting else "")
        table.add_row(name, status, events, drops, rows)
    return table


def _waiting_lines(result) -> list[str]:
    """A line per hook whose spool still holds records: the summary's events and rows
    do not count them yet."""
    from kernmlops.collect.disk import human_bytes

    return [
        f"{name}: {human_bytes(n)} of spooled records wait in the spool, not counted in its "
        f"events nor rows: `kernmlops recover {result.path}` makes their rows"
        for name, n in result.waiting.items()
    ]


def _cpus_value(value: str | None) -> int | str | None:
    """--cpus as benchmark.cpus takes it: digits are a count (KernMLOps' --cpus N), else
    a list such as "0-3,8" (checked, with the CPUs online, before the run)."""
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.isdigit() else text


@cli.command(context_settings={"ignore_unknown_options": False})
@click.option(
    "-c",
    "--config",
    "config_file",
    type=reachable_path(dir_okay=False, allow_dash=True, path_type=Path),
    help="YAML overrides merged on the defaults (see `kernmlops defaults`); kernmlops' form "
    "or KernMLOps' (benchmark_config/collector_config); `-c -` reads them from stdin. "
    "Without -c: ./overrides.yaml if there is one.",
)
@click.option(
    "-b",
    "--benchmark",
    help="benchmark to run: faux, command, stress-ng, gap, ml-training, ... "
    "(all are in `kernmlops defaults`).",
)
@click.option("-d", "--duration", type=float, help="stop after this many seconds.")
@click.option(
    "--hooks",
    help="comma-separated hooks, at least one (default: collector.hooks; `kernmlops doctor` "
    "lists them all).",
)
@click.option(
    "--no-hooks",
    is_flag=True,
    help="run the benchmark with no hooks, untraced: its time is the baseline of the hooks' "
    "overhead (KernMLOps' `collect data --no-hooks`). The collection holds the manifest "
    "(no hooks in it) and the benchmark's results.",
)
@click.option(
    "--cpus",
    metavar="N|LIST",
    callback=lambda _ctx, _param, value: _cpus_value(value),
    help="CPUs the benchmark may use: N (the first N online; benchmarks that size their "
    "work, such as linux-build's make -j, size it to them) or a list such as 0-3,8; 0: "
    "all (benchmark.cpus; KernMLOps' `collect data --cpus N`).",
)
@click.option(
    "--tgid",
    type=int,
    help="trace only this process (filter in the kernel); with -b faux the collection "
    "ends when it exits.",
)
@click.option("--system-wide", is_flag=True, help="trace every process, not only the benchmark's.")
@click.option(
    "-o",
    "--output-dir",
    type=reachable_path(file_okay=False, path_type=Path),
    help="root of the collections (default: data).",
)
@click.option("--strict", is_flag=True, default=None, help="fail if any hook cannot attach.")
@click.option("--no-progress", is_flag=True, help="no live table (logs, CI).")
@click.option(
    "--export",
    "export_addr",
    metavar="HOST:PORT",
    help="also serve live Prometheus metrics of the traced processes (kernmlops export's "
    "sets) at HOST:PORT, e.g. 127.0.0.1:9435; an address that cannot be bound (a busy port) "
    "is refused before collecting, exit 75.",
)
@click.option(
    "--export-grace",
    "export_grace",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="with --export: after the benchmark ends, serve the final values until a scrape "
    "took them or SECONDS passed (default: two scrape intervals as seen, plus 1 s; 30 s "
    "when no scrape came; 0: stop at once).",
)
@click.option(
    "--web.config.file",
    "web_config_file",
    metavar="FILE",
    help="with --export: TLS and basic auth, in the Prometheus exporter-toolkit's web "
    "configuration format (tls_server_config, basic_auth_users with bcrypt hashes), as "
    "kernmlops export takes it (collector.export_web_config).",
)
@click.option(
    "--publish",
    "publish_uri",
    metavar="URI",
    help="when the collection has finished, push it to the dataset at URI (as `kernmlops "
    "push` does: a folder, s3://bucket/prefix, ...); URI is checked before collecting.",
)
@click.option(
    "--as-user",
    is_flag=True,
    default=None,
    help="under sudo, run the benchmark as the user who ran sudo, not as root "
    "(benchmark.as_user). Off by default, as `perf record` and `bpftrace -c` run their "
    "command as root. The collection belongs to that user either way.",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    hidden=True,
    help="KernMLOps' `collect data -v`: say what is loaded and run (collector.progress on).",
)
@click.option(
    "-p",
    "--poll-rate",
    type=click.FloatRange(0, 1),
    hidden=True,
    help="KernMLOps' `collect data -p SECONDS`: drain the rings this often "
    "(collector.poll_interval_ms).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def collect(
    config_file: Path | None,
    benchmark: str | None,
    duration: float | None,
    hooks: str | None,
    tgid: int | None,
    system_wide: bool,
    output_dir: Path | None,
    strict: bool | None,
    no_progress: bool,
    export_addr: str | None,
    export_grace: float | None,
    web_config_file: str | None,
    publish_uri: str | None,
    as_user: bool | None,
    verbose: bool,
    poll_rate: float | None,
    no_hooks: bool,
    cpus: int | str | None,
    command: tuple[str, ...],
    benchmark_dir: Path | None = None,
) -> None:
    """Run a benchmark (or COMMAND) while the hooks collect; write one collection.

    \b
    Examples:
      kernmlops collect                        stress-ng, mixed scenario
      kernmlops collect -- make -j2            a command and its process tree
      kernmlops collect -b faux -d 30          the whole system for 30 s
      kernmlops collect --tgid 1234 -b faux    one running process
      kernmlops collect -c overrides.yaml --hooks quanta_runtime

    KernMLOps' `collect data` (this command with KernMLOps' options: its -d is the
    benchmarks' folder, not a duration; see `kernmlops collect data --help`), `collect
    dump`, `collect graph`, `collect perf-list` and `collect defaults` work too (see
    `kernmlops collect dump --help`; the last two are `kernmlops perf-list` and
    `kernmlops defaults`); `collect -- dump` runs a program named dump.

    The exit code is the benchmark's. Ctrl+C, SIGTERM or a hangup (SIGHUP) stops
    the collection and keeps what was collected (exit 130 for Ctrl+C, also before the
    collection's folder is made: then nothing was collected). Under sudo the
    collection's folders and files belong to the user who ran sudo; the benchmark runs
    as root unless --as-user.
    """
    from kernmlops.collect.session import Session
    from kernmlops.collect.tuning import UNUSED_LIBRARIES
    from kernmlops.config import Flags, load_config
    from kernmlops.lazy import keep_out

    if command and benchmark not in (None, "command"):
        raise click.UsageError(f"a command after -- runs as benchmark 'command', not {benchmark!r}")
    if system_wide and tgid is not None:
        raise click.UsageError("--tgid and --system-wide exclude each other")
    if command and tgid is not None:
        # a command is traced with its whole process tree: --tgid would trace another one
        raise click.UsageError(
            "--tgid and a COMMAND exclude each other (a command is traced with its process "
            "tree; --tgid N follows a running process, e.g. with -b faux)"
        )
    if no_hooks:
        # what only says whom the hooks trace has nothing to do without hooks
        given = [n for n, v in (("--hooks", hooks is not None), ("--tgid", tgid is not None),
                                ("--system-wide", system_wide)) if v]  # fmt: skip
        if given:
            raise click.UsageError(
                f"--no-hooks and {given[0]} exclude each other (--no-hooks runs the "
                "benchmark untraced)"
            )
    if benchmark_dir is not None and not benchmark_dir.is_dir():
        why = "not a folder" if benchmark_dir.exists() else "no such folder"
        raise click.UsageError(
            f"-d {benchmark_dir}: {why} (in `collect data`, -d is KernMLOps' benchmark "
            "folder; a duration in seconds is --duration)"
        )
    check_tgid(tgid)  # before anything is set up, as `export --tgid` does
    if benchmark and not command:
        from kernmlops.benchmarks import REGISTRY

        # KernMLOps spells them with underscores (-b linux_build)
        by_key = {name.replace("-", "_"): name for name in REGISTRY}
        benchmark = by_key.get(benchmark.replace("-", "_"), benchmark)
    flags = Flags(
        duration_s=duration,
        output_dir=output_dir,
        strict=strict,
        benchmark=benchmark or None,
        argv=list(command) if command else None,
        # --hooks "" is an empty list (refused by the config), not the default's
        hooks=[h.strip() for h in hooks.split(",") if h.strip()] if hooks is not None else None,
        tgid=tgid,
        filter="tgid" if tgid is not None else "system" if system_wide else None,
        progress=False if no_progress else True if verbose else None,
        export=export_addr or None,
        export_grace_s=export_grace,
        # absolute, as the manifest's config records it
        export_web_config=str(Path(web_config_file).absolute()) if web_config_file else None,
        as_user=as_user,
        # as KernMLOps' collector_config poll_rate translates (kernmlops.config_kernmlops)
        poll_interval_ms=max(1, round(poll_rate * 1000)) if poll_rate is not None else None,
        no_hooks=no_hooks,
        cpus=cpus,
        benchmark_dir=benchmark_dir.absolute() if benchmark_dir is not None else None,
    )
    # there, even as a dangling link or a folder: read (and refused in one line if it
    # cannot be), never passed over for the defaults in silence
    if config_file is None and os.path.lexists(OVERRIDES):
        config_file = Path(OVERRIDES)
        _say(f"using {OVERRIDES} (found in {Path.cwd()}; -c FILE picks another)")
    publish_to = None
    folder_made = False
    try:
        config = load_config(config_file, flags, on_empty=lambda name: _say(
            f"note: {name} holds no setting (empty, or comments only): the defaults are used"
        ))  # fmt: skip
        if no_hooks and config.collector.export:
            # the exporter traces the benchmark's processes: the run would not be untraced
            raise ConfigError(
                "--no-hooks: the benchmark runs untraced, and --export (collector.export) "
                "would trace it: leave one out"
            )
        if config.collector.filter == "tgid":
            # a file's collector.tgid (--tgid was checked above)
            check_tgid(config.collector.tgid, "collector.tgid", ConfigError)
        # before any BPF work; loaded once: the exporter serves what was checked,
        # whatever is put at the file's name meanwhile
        web = _check_export_web_config(config.collector)
        scheme = web.scheme if web is not None else "http"
        require_bpf_privileges("collect")
        if config.collector.export:
            from kernmlops.exporter.server import hold_listen

            # the exporter serves only once the probes are attached: a busy port found
            # then would leave a collection folder and its spool behind. Bound now and
            # kept for it, so that nobody takes the port meanwhile
            hold_listen(config.collector.export)
        _check_room(config.collector)
        if publish_uri:  # a bad URI or an unreachable store is said before the run
            from kernmlops.fleet.cli import publish_target

            publish_to = publish_target(publish_uri)
        from kernmlops.ebpf.build import build

        build()
        keep_out(*UNUSED_LIBRARIES)  # this process only collects
        attached: dict = {}
        live: Live | None = None
        show: bool | None = None if config.collector.progress else False

        def on_attached(statuses: dict) -> None:
            attached.update(statuses)
            if not statuses and not config.collector.hooks:
                _say("no hooks (--no-hooks): the benchmark runs untraced")
                return
            ok = sum(s.attached for s in statuses.values())
            _say(f"probes attached: {ok}/{len(statuses)} hooks")
            if config.collector.export:
                _say(f"metrics at {scheme}://{config.collector.export}/metrics")

        def on_progress(p) -> None:
            nonlocal live, show
            if show is None:
                show = shows_live(console=_console())
            if not show:
                return
            if live is None:
                from rich.live import Live

                live = Live(_progress_table(p, attached), console=_console(), transient=True)
                live.start()
            else:
                live.update(_progress_table(p, attached))

        def on_folder(path: Path) -> None:
            nonlocal folder_made
            folder_made = True
            _say(f"collecting into {path}")

        session = Session(
            config,
            on_progress=on_progress,
            on_attached=on_attached,
            on_message=_session_message,
            on_folder=on_folder,
            web_config=web,
        )
        try:
            result = session.run()
        finally:
            if live is not None:
                live.stop()
    except KernmlopsError as err:
        fail(err)
    except KeyboardInterrupt:
        if folder_made:  # the session's own stop handles Ctrl+C from then on
            raise
        # Ctrl+C while the config is read or the BPF objects are built: one line and
        # the status of a stop later in the run (128 + SIGINT), not click's "Aborted!"
        _say("interrupted: nothing was collected (stopped before the collection's folder was made)")
        sys.exit(130)
    from rich.markup import escape

    if result.hooks:
        _console().print(_summary(result))
    else:  # --no-hooks: a table without a row says less than this
        _line(f"collection {result.collection_id}: no hooks, the benchmark ran untraced")
    for line in _waiting_lines(result):
        _line(f"[yellow]{escape(line)}[/]")
    _line(result.end_line(escape(str(result.path))))
    for line in drop_advice(result.hooks, config.hook_options):
        _line(f"[red]{escape(line)}[/]")
    for line in unseen_lines(result.hooks):
        _line(f"[red]{escape(line)}[/]")
    total_missed = sum(s.missed for s in result.hooks.values())
    if total_missed:
        _line(
            f"[red]{total_missed:,} program runs skipped by the kernel[/] "
            "(another BPF program was running on the same CPU)"
        )
    if config.collector.output_graphs and result.ended_by != "error":
        _draw_graphs(result.path, show=None if config.collector.progress else False)
    if result.exit_code:
        failed = [n for n, st in result.hooks.items() if st.failed]
        why = f"; hook {', '.join(failed)} failed" if failed else ""
        _line(f"[yellow]exit code {result.exit_code}[/] ({result.ended_by}{escape(why)})")
        if result.benchmark_stderr:
            _line("the benchmark's stderr ended (benchmark_output/stderr.txt where kept):")
            for line in result.benchmark_stderr:
                _line(f"  [dim]|[/] {escape(line)}")
    if publish_to is not None:
        from kernmlops.fleet.cli import publish_collection

        published = publish_collection(
            result.path, publish_to, show=None if config.collector.progress else False
        )
        sys.exit(result.exit_code or published)
    sys.exit(result.exit_code)


def _kernmlops_form(option: click.Parameter, **changes: Any) -> click.Parameter:
    """A copy of one of `collect`'s options as `collect data` shows it (its help in
    KernMLOps' terms, shown where `collect` hides it)."""
    import copy

    shown = copy.copy(option)
    for name, value in changes.items():
        setattr(shown, name, value)
    return shown


def _collect_data_params() -> list[click.Parameter]:
    """`collect`'s options with KernMLOps' `collect data` meaning: -d is its benchmark
    folder (ours, the duration, is --duration alone there); -v and -p are shown."""
    params: list[click.Parameter] = []
    for param in collect.params:
        if param.name == "duration":
            params.append(
                click.Option(
                    ["-d", "--benchmark-dir", "benchmark_dir"],
                    type=reachable_path(file_okay=False, path_type=Path),
                    help="KernMLOps' -d/--benchmark-dir: the folder its benchmarks are "
                    "installed in, DIR/gap and DIR/linux_kernel (benchmark.gap.source_dir, "
                    "benchmark.linux_build.source_dir). Not a duration: that is --duration.",
                )
            )
            params.append(
                click.Option(
                    ["--duration", "duration"],
                    type=float,
                    metavar="SECONDS",
                    help="stop after this many seconds (`kernmlops collect -d SECONDS`; "
                    "KernMLOps' collect data has no such option).",
                )
            )
        elif param.name == "no_hooks":
            params.append(
                _kernmlops_form(
                    param,
                    help="KernMLOps' --no-hooks: run the benchmark with no hooks, to time it "
                    "untraced (the baseline of the hooks' overhead); its collection holds "
                    "the manifest, which names no hook, and the benchmark's results.",
                )
            )
        elif param.name == "cpus":
            params.append(
                _kernmlops_form(
                    param,
                    help="KernMLOps' --cpus N: the CPUs the benchmark uses, its work sized "
                    "to them (linux-build's make -j); here it runs on the first N CPUs "
                    "online, or on a list such as 0-3,8 (benchmark.cpus; 0: all).",
                )
            )
        elif param.name == "output_dir":
            params.append(
                _kernmlops_form(
                    param,
                    help="KernMLOps' -o/--output-dir: the root of the collections, which "
                    "go to DIR/curated/benchmark=<b>/collection_id=<id>/ (default: data).",
                )
            )
        elif param.name == "verbose":
            params.append(
                _kernmlops_form(
                    param,
                    hidden=False,
                    help="KernMLOps' -v/--verbose: say what is loaded and run, with the "
                    "live progress (collector.progress on).",
                )
            )
        elif param.name == "poll_rate":
            params.append(
                _kernmlops_form(
                    param,
                    hidden=False,
                    help="KernMLOps' -p/--poll-rate SECONDS (0 to 1): drain the rings this "
                    "often (collector.poll_interval_ms).",
                )
            )
        else:
            params.append(param)
    return params


collect_data = click.Command(
    "collect data",
    callback=collect.callback,
    params=_collect_data_params(),
    context_settings=collect.context_settings,
    help="""KernMLOps' `collect data`: `kernmlops collect` with KernMLOps' options.

    \b
    Examples:
      kernmlops collect data -b linux_build -d ~/kernmlops-benchmark --cpus 2 -v
      kernmlops collect data -b faux --no-hooks --duration 10 -o data

    As in KernMLOps, -d is the folder the benchmarks are installed in and -o the
    collections' root; -v shows what is loaded and run, -p SECONDS drains the rings
    that often, --cpus N gives the benchmark N CPUs, and --no-hooks runs it untraced
    (the baseline of the hooks' overhead: its collection holds no hook). kernmlops'
    own `collect -d SECONDS` is --duration SECONDS here. The other options are
    `kernmlops collect`'s (see its --help).
    """,
)


def _check_export_web_config(collector: CollectorConfig) -> WebConfig | None:
    """``--web.config.file`` (collector.export_web_config) read and checked as ``kernmlops
    export`` checks it, before anything loads: what the exporter serves with (None:
    no file, plain HTTP).

    Raises:
        ConfigError: the file without ``--export``, or a problem in the file (one line).
    """
    path = collector.export_web_config
    if not path:
        return None
    if not collector.export:
        raise ConfigError(
            f"--web.config.file {path}: serves --export's metrics, and there is no --export "
            "(collector.export): give --export HOST:PORT"
        )
    from kernmlops.exporter.webconfig import load_web_config

    return load_web_config(path)


def _check_room(collector: CollectorConfig) -> None:
    """collector.min_free_mb, checked on the output's file system before any folder is
    made: refused later, in the collection's own folder (the session checks again),
    the run left empty curated/benchmark=<b>/collection_id=<id> folders behind.

    Raises:
        OutputError: less free than the minimum, in the session's words; or the folder
            is on a pseudo filesystem (/proc, /sys), whose 0 B free is not the reason.
    """
    from kernmlops.collect.disk import free_bytes, human_bytes
    from kernmlops.collect.output import pseudo_filesystem

    out = Path(collector.output_dir).absolute()
    existing = next((p for p in (out, *out.parents) if p.is_dir()), None)
    pseudo = pseudo_filesystem(existing) if existing is not None else None
    if pseudo is not None:  # its free space (0 B) would be the wrong reason
        raise OutputError(
            f"cannot create the output folder {out}: {pseudo} is a pseudo filesystem of "
            "the kernel, not a place for collections: choose another folder with -o"
        )
    free = free_bytes(existing) if existing is not None else None
    if free is not None and free < collector.min_free_mb * 2**20:
        raise OutputError(
            f"only {human_bytes(free)} free on {out} (the minimum is "
            f"{collector.min_free_mb:g} MiB, collector.min_free_mb): free some space or "
            "choose another folder with -o"
        )


def _draw_graphs(path: Path, show: bool | None = None) -> None:
    """collector.output_graphs: the collection's graphs, as `kernmlops graph` draws them;
    a graph that fails is named and the collection is kept. ``show`` False: no
    progress (--no-progress)."""
    from rich.markup import escape

    from kernmlops.graphs import render
    from kernmlops.host.invoker import hand_over, invoker
    from kernmlops.host.pinned import pin

    failures: list = []
    who = invoker()
    try:
        # under sudo the collection is the user's by now: its graphs folder is made
        # new and held open (no link of theirs written through), then handed over
        graphs = pin(path / "graphs", create=True, fresh=True, invoker_uid=who and who.uid)
        try:
            with progress("drawing", "graphs", enabled=show) as steps:
                written = render(path, graphs.io, errors=failures, progress=steps)
        finally:
            hand_over(graphs.fd, who)
            graphs.close()
    except KernmlopsError as err:
        _line(f"[yellow]warning:[/] no graphs: {escape(str(err))}")
        return
    _say(f"{len(written)} graphs in {path / 'graphs'}")
    for failure in failures:
        _line(f"[yellow]warning:[/] graph {failure.graph}: {escape(str(failure.error))}")


# --- defaults, build ---------------------------------------------------------------
@cli.command()
@click.argument(
    "path", default="defaults.yaml", type=reachable_path(dir_okay=False, allow_dash=True)
)
def defaults(path: str) -> None:
    """Write the full default configuration (PATH, default defaults.yaml; - for stdout).

    Copy the keys you want to change into an overrides file and pass it with
    `kernmlops collect -c FILE`.

    \b
    Examples:
      kernmlops defaults                      write ./defaults.yaml
      kernmlops defaults - | grep -A3 stress_ng
    """
    from kernmlops.config import defaults_yaml
    from kernmlops.fileio import write_atomic

    text = defaults_yaml()
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        write_atomic(path, text)  # whole or not at all: no half file on a full disk
    except OSError as err:
        fail(OutputError(f"cannot write {path}: {why_not_written(err, Path(path))}"))
    _say(f"wrote {path}")


def _owner_of(fd: int) -> Invoker | None:
    """The user a folder of a user belongs to, as one to hand files to (root's: None)."""
    from kernmlops.host.invoker import Invoker

    st = os.fstat(fd)
    if st.st_uid == 0 or os.geteuid() != 0:
        return None
    return Invoker(st.st_uid, st.st_gid, str(st.st_uid), "/", (st.st_gid,))


@cli.command()
@click.argument("collection", type=reachable_path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--bpf-dir",
    type=reachable_path(exists=True, file_okay=False, path_type=Path),
    help="the BPF objects the collecting version built (default: the folder collect uses; "
    "never a path the spool names)",
)
@click.option("--no-progress", is_flag=True, help="no progress bar on a terminal.")
def recover(collection: Path, bpf_dir: Path | None, no_progress: bool) -> None:
    """Turn the spool a killed collector left in COLLECTION into Parquet parts.

    \b
    Example:
      kernmlops recover data/curated/benchmark=faux/collection_id=<id>

    While a machine has no CPU to spare, the collector copies its rings to
    COLLECTION/.spool/ and makes rows later (collector.spool). If it was killed
    (kill -9, the OOM killer) those records are still there: this decodes them,
    adds the rows not yet in finished parts as new parts, updates the manifest
    (rows per table and hook; state: recovered, with the state and error it had
    before kept under recovery), compacts each table's parts as collect's stop
    does (collector.compact) and deletes the spool. Nothing is repeated, and a
    collection without a spool is left as it is.

    A damaged spool (a file cut short, a frame failing its checksum, a lost
    description) gives every intact frame; each piece that could not be read
    is named with its bytes, the spool is kept, and the exit status is 2. Only
    one recover works on a collection at a time.
    """
    from kernmlops.collect.manifest import MANIFEST_NAME, read_manifest
    from kernmlops.collect.recovery import recover
    from kernmlops.host.invoker import hand_over, invoker
    from kernmlops.host.pinned import pin
    from kernmlops.spool.collection import SPOOL_DIR, collector_running, spool_done
    from kernmlops.spool.memory import (
        foreign_memory,
        free_empty_memory,
        memory_folder,
        memory_lost,
        memory_owned_elsewhere,
    )
    from kernmlops.spool.recovery import pending_spools

    try:
        who = invoker()
        # the collection may be a user's (its folders theirs to change): held open,
        # everything read and written through it (kernmlops.host.pinned)
        pinned = pin(collection, invoker_uid=who.uid if who else None, what="the collection")
    except KernmlopsError as err:
        fail(err)
    io = pinned.io
    try:
        # a folder that is no collection (or whose manifest is damaged) is said, even
        # with nothing to recover: a typo must not look like a clean collection. Read
        # once: every check below sees the same manifest, whatever a collector writes
        try:
            manifest = read_manifest(io)
        except CollectionError as err:  # its message names the pinned path: not shown
            if not os.path.lexists(io / MANIFEST_NAME):
                raise CollectionError(
                    f"{collection} is not a collection: it has no {MANIFEST_NAME}"
                ) from None
            raise CollectionError(
                f"{collection} is not a readable collection: {str(err).split(': ', 1)[-1]}"
            ) from None
        own_id = manifest.collection_id
        if not own_id and pending_spools(io):
            # the spool's rows carry it, and its memory folder is named after it
            raise CollectionError(
                f"{collection}: its manifest names no collection_id, which every "
                "recovered row carries: put it back in manifest.json (the folder's name "
                "says it, collection_id=<id>) and recover again; the spool is kept"
            )
        # any state: a collector that is stopping may not have said so yet
        pid = collector_running(manifest.collector_pid, manifest.started_at)
        elsewhere = memory_owned_elsewhere(io / SPOOL_DIR, own_id)
        if elsewhere is not None:
            raise CollectionError(
                f"{collection} is a copy: its spool's rows in memory belong to "
                f"{elsewhere.parent}, which is still there; recover that collection "
                "(and copy it again once it is recovered)"
            )
        lost = memory_lost(io)
        if lost is not None:
            _say(
                f"warning: the spool's first part was in memory ({lost}) and is gone "
                "(a reboot?): its rows are lost; recovering what is on disk"
            )
        foreign = foreign_memory(io, own_id)
        if foreign is not None:
            own = memory_folder(own_id or "")
            _say(
                f"warning: the spool's memory link names {foreign}, not this collection's "
                f"own folder ({own}, yours, mode 0700): it is not read; if its segments are "
                f"this collection's, move them into {collection / '.spool'} and recover again"
            )
        if spool_done(io / SPOOL_DIR):
            # its rows are all in parts: a kill cut the spool's removal (a live
            # collector is removing it now: its manifest is its own to finish)
            if pid is not None:
                raise CollectionError(
                    f"{collection}: still being collected (collector pid {pid}): nothing "
                    "to recover while it runs (it is removing its spool as it stops)"
                )
            recover(io, bpf_dir, shown=collection)
            _say(f"nothing to recover in {collection}: every row of its spool was in "
                 "parts; what a cut stop left of the spool is removed, and its manifest "
                 "says so (state recovered)")  # fmt: skip
            return
        if not pending_spools(io):
            with contextlib.suppress(OSError):  # an empty one: a removal cut at its end
                os.rmdir(io / SPOOL_DIR)
            # a collector killed while it set up its spool: its tmpfs folder, empty
            freed = free_empty_memory(own_id) if pid is None else None
            also = f" (its empty memory folder {freed} is removed)" if freed else ""
            _say(f"nothing to recover in {collection}: no spool{also}")
            if foreign is not None:
                fail(CollectionError(f"the spool's memory folder {foreign} was not read"))
            return
        if pid is not None:
            raise CollectionError(
                f"{collection}: still being collected (collector pid {pid}): nothing to "
                "recover while it runs (it makes its spool's rows into parts as it stops)"
            )
        try:
            with progress("recovering the spool", "bytes", enabled=not no_progress) as steps:
                done = recover(io, bpf_dir, shown=collection, progress=steps)
        finally:
            # the new parts are the collection's owner's, as collect's were (under sudo
            # a killed collection's folder is still root's: then the invoker's)
            hand_over(pinned.fd, _owner_of(pinned.fd) or who)
    except KernmlopsError as err:
        fail(err)
    except OSError as err:
        fail(OutputError(f"cannot recover {collection}: {err.strerror or err}"))
    finally:
        pinned.close()
    rows = ", ".join(f"{t} {n:,}" for t, n in sorted(done.added.items())) or "no rows"
    _say(f"recovered {rows} into {collection}")
    if foreign is not None and not done.lost:
        fail(CollectionError(f"the spool's memory folder {foreign} was not read"))
    if done.lost:
        for lost in done.lost:
            _say(f"lost: {lost.describe()}")
        size = sum(lost.bytes for lost in done.lost)
        fail(CollectionError(
            f"{len(done.lost)} piece(s) of the spool ({size:,} bytes) could not be recovered; "
            f"the spool stays in {collection / '.spool'}"
        ))  # fmt: skip


@cli.command("build-bpf")
@click.option("--out", type=reachable_path(file_okay=False, path_type=Path), help="build folder")
@click.option("--force", is_flag=True, help="rebuild every object")
def build_bpf(out: Path | None, force: bool) -> None:
    """Compile the BPF objects (clang, vmlinux.h from this kernel's BTF).

    Objects older than their sources are rebuilt by any command that loads them;
    this builds them now (--out, else $KERNMLOPS_BPF_DIR, else build/bpf of a source
    checkout; an installed wheel ships its objects prebuilt).

    \b
    Examples:
      kernmlops build-bpf
      kernmlops build-bpf --out build/bpf --force
    """
    from kernmlops.ebpf.build import build

    try:
        objs = build(out, force=force)
    except KernmlopsError as err:
        fail(err)
    _say(f"{len(objs)} BPF objects in {objs[0].parent}")


@cli.command()
def doctor() -> None:
    """What this machine allows (capabilities, BTF, program types, counters) and
    which hooks can run, with reasons.

    Its last table says what a collection here gets by default (rings, memory
    spool, row workers, free space). Any user may run it; as root it probes more
    and loads each hook's BPF object into the kernel (nothing attached), so a hook
    whose object the kernel refuses is "runs: no" with the verifier's reason.
    Exit status 1 when no BPF hook can run here (a user without the BPF
    capabilities, a kernel without BPF), else 0, kprobes or counters missing or not.

    \b
    Example:
      sudo kernmlops doctor
    """
    from kernmlops.doctor import run_doctor

    try:
        sys.exit(run_doctor(_console()))
    except KernmlopsError as err:
        fail(err)


@cli.command("perf-list")
@click.option("--all", "show_all", is_flag=True, help="also list events this machine cannot count")
@click.option("--tracepoints", is_flag=True, help="also list tracepoints (subsystem:event)")
@click.option("--json", "as_json", is_flag=True, help="JSON rows on stdout instead of a table")
def perf_list(show_all: bool, tracepoints: bool, as_json: bool) -> None:
    """The perf events this machine can count, each opened on CPU 0 to be sure.

    Put a NAME in hooks.perf.events of a config to count it, e.g.
    `events: [dTLB-load-misses, tlb:tlb_flush, msr/tsc/]`.

    Where a PMU counts on some CPUs only, the cpus column says which: `package
    0,24` for a package's count (RAPL's power/, the uncore PMUs), which the perf
    hook reads on those CPUs alone (null on the others, as perf stat -a counts
    it), or a hybrid core type's CPUs.

    \b
    Examples:
      sudo kernmlops perf-list
      sudo kernmlops perf-list --tracepoints | grep tlb
      sudo kernmlops perf-list --all --json | jq -r '.[] | select(.supported) | .name'
    """
    import polars as pl

    from kernmlops.perf_list import list_events, none_opened

    frame = list_events(tracepoints=tracepoints)
    # nothing could be opened (perf_event_paranoid, no privileges): said, and not 0
    refused = none_opened(frame)
    if refused is not None and not show_all:
        fail(KernmlopsError(refused))
    if not show_all:
        frame = frame.filter(pl.col("supported").is_null() | pl.col("supported"))
    if as_json:
        click.echo(frame.write_json())
        if refused is not None:
            fail(KernmlopsError(refused))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{frame.height} perf events", title_justify="left")
    # where a PMU counts on some CPUs only (a package's reader, a core type)
    scoped = frame["cpus"].is_not_null().any()
    for col in ("name", "kind", "type", "encoding", "description", *(["cpus"] * scoped)):
        table.add_column(col)
    if show_all:
        table.add_column("supported")
    for row in frame.iter_rows(named=True):
        name = " OR ".join([row["name"], *row["aliases"]])
        cells = [name, row["kind"], str(row["type"]), row["encoding"], row["description"]]
        if scoped:
            cells.append(row["cpus"] or "all")
        if show_all:
            ok = row["supported"]
            cells.append("yes" if ok else "?" if ok is None else f"[red]no[/]: {row['reason']}")
        table.add_row(*cells)
    Console().print(table)
    if refused is not None:  # --all showed each event's reason: the verdict last
        fail(KernmlopsError(refused))


def main() -> None:
    # Arrow's default allocator (mimalloc) kept about 50 MiB more resident than its
    # jemalloc at the collector's peak, for the same CPU (`python -m bench memory`). Read
    # once, when pyarrow loads; a user's own choice wins.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    survive_closed_output()
    cli(prog_name="kernmlops")


if __name__ == "__main__":
    main()
