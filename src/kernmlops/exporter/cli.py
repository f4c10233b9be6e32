"""`kernmlops export`: serve kernel metrics to Prometheus, or --check them.

Registered on the main command group with ``cli.add_command(export_command)``;
``python -m kernmlops.exporter`` runs it alone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import click

from kernmlops.clitools import CONTEXT_SETTINGS, check_tgid, fail, require_bpf_privileges
from kernmlops.errors import ConfigError, KernmlopsError

EXIT_CHECK_FAILED = 1


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


@click.command("export", context_settings=CONTEXT_SETTINGS)
@click.option(
    "-c",
    "--config",
    "configs",
    multiple=True,
    metavar="FILE|SET",
    help="a metric set file (YAML beside its .bpf.c or .bpf.o), or a built-in set's name; "
    "repeat for several (default: every default built-in set, see --list).",
)
@click.option(
    "--config.dir",
    "config_dir",
    metavar="DIR",
    help="ebpf_exporter's form: the folder of --config.names (DIR/NAME.yaml beside NAME.bpf.c "
    "or NAME.bpf.o).",
)
@click.option(
    "--config.names",
    "config_names",
    metavar="A,B",
    help="ebpf_exporter's form: comma-separated config names in --config.dir.",
)
@click.option(
    "--listen",
    default="127.0.0.1:9435",
    show_default=True,
    metavar="HOST:PORT",
    help="where to serve /metrics; [::]:PORT serves every interface (IPv4 and IPv6), "
    "0.0.0.0:PORT every IPv4 one.",
)
@click.option(
    "--web.listen-address",
    "web_listen",
    metavar="[HOST]:PORT",
    help="ebpf_exporter's name for --listen; as there, :PORT serves every interface "
    "(IPv4 and IPv6, or IPv4 alone on a machine without IPv6).",
)
@click.option(
    "--web.telemetry-path",
    "metrics_path",
    default="/metrics",
    show_default=True,
    metavar="PATH",
    help="the path the metrics are served at (ebpf_exporter's flag); / links to it.",
)
@click.option(
    "--log.no-timestamps",
    "no_log_timestamps",
    is_flag=True,
    help="ebpf_exporter's flag, accepted as it is: kernmlops' log lines carry no timestamps "
    "(the journal adds its own).",
)
@click.option("--debug", "unsupported_debug", is_flag=True, hidden=True)
@click.option("--btf.path", "unsupported_btf_path", hidden=True)
@click.option("--config.skip-cache-size", "unsupported_skip_cache_size", hidden=True)
@click.option(
    "--web.config.file",
    "web_config_file",
    metavar="FILE",
    help="TLS and basic auth, in the Prometheus exporter-toolkit's web configuration format "
    "(tls_server_config, basic_auth_users with bcrypt hashes), as node_exporter takes it.",
)
@click.option(
    "--web.max-connections",
    "max_connections",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="connections held at once; at the limit the longest-idle one is closed to make room.",
)
@click.option(
    "--capabilities.keep",
    "caps_keep",
    default="all",
    show_default=True,
    metavar="all|none|CAPS",
    help="after attaching, drop every capability but these (e.g. none, or cap_syslog,cap_bpf): "
    "serving needs none.",
)
@click.option(
    "--tgid",
    type=int,
    help="count only this process and its descendants, also those it forks later "
    "(data-loader workers), in the kernel.",
)
@click.option(
    "--comm", help="count only threads of this name (as the kernel keeps it: 15 characters)."
)
@click.option(
    "--cgroup",
    metavar="PATH",
    help="count only tasks in this cgroup v2 and below it (path below the cgroup mount).",
)
@click.option(
    "--check",
    "--config.check",
    "check",
    is_flag=True,
    help="load and attach everything, report, and exit; fails (exit 1) when a set does not "
    "load or a program does not attach, and (exit 75) when the listen address cannot be "
    "bound (a busy port: give 127.0.0.1:0 to check the sets alone).",
)
@click.option(
    "--strict",
    "--config.strict",
    "strict",
    is_flag=True,
    help="serving: a program that cannot attach is an error.",
)
@click.option(
    "--bpf-stats",
    is_flag=True,
    help="have the kernel time every BPF program (costs a little per run) and export it.",
)
@click.option(
    "--max-label-sets",
    type=click.IntRange(min=1),
    help="the most label sets a metric serves, a ceiling over every set's own max_label_sets "
    "(default: each set's own, else 10000); past it, those changed least recently are left "
    "out and counted.",
)
@click.option("--list", "list_sets", is_flag=True, help="list the built-in metric sets and exit.")
def export_command(
    configs: tuple[str, ...],
    config_dir: str | None,
    config_names: str | None,
    listen: str,
    web_listen: str | None,
    metrics_path: str,
    no_log_timestamps: bool,
    unsupported_debug: bool,
    unsupported_btf_path: str | None,
    unsupported_skip_cache_size: str | None,
    web_config_file: str | None,
    max_connections: int,
    caps_keep: str,
    tgid: int | None,
    comm: str | None,
    cgroup: str | None,
    check: bool,
    strict: bool,
    bpf_stats: bool,
    max_label_sets: int | None,
    list_sets: bool,
) -> None:
    """Serve kernel metrics (counters and histograms kept in BPF maps) to Prometheus.

    \b
    Examples (as root):
      kernmlops export                              default sets at 127.0.0.1:9435
      kernmlops export --list                       the built-in sets
      kernmlops export -c biolatency -c runqlat     only these
      kernmlops export -c my/io.yaml --check        does my set load and attach?
      kernmlops export --comm python3 --bpf-stats   one job, with program run times
      kernmlops export --tgid 1234                  one process tree (forked workers too)
      kernmlops export -c biojobs                   I/O of several jobs, by cgroup and name
      kernmlops export --listen 0.0.0.0:9435 --web.config.file web.yml   TLS, basic auth

    \b
    ebpf_exporter's configs work as they are, and these of its flags: --config.dir,
    --config.names, --config.check, --config.strict, --web.listen-address (not fd://),
    --web.telemetry-path, --capabilities.keep, --log.no-timestamps:
      kernmlops export --config.dir=examples --config.names=biolatency,timers \\
          --web.listen-address=:9435 --capabilities.keep=none
    (--debug, --btf.path and --config.skip-cache-size are refused, with why.)

    SIGTERM, Ctrl+C or a hangup (SIGHUP) stops it and detaches every program.

    \b
    Exit status: 2 for a user error (a bad flag, set or web configuration file); 75
    (EX_TEMPFAIL) when the listen address cannot be bound, e.g. a busy port, which may
    pass (the systemd unit restarts on it); 1 for a --check that failed.
    """
    try:
        if list_sets:
            _list()
            return
        from kernmlops.exporter.caps import POOL_ENV, parse_keep

        keep = parse_keep(caps_keep)
        if keep is not None:
            for var in POOL_ENV:  # before numpy starts its thread pool: see caps.py
                os.environ[var] = "1"
        _refuse_unsupported(unsupported_debug, unsupported_btf_path, unsupported_skip_cache_size)
        from kernmlops.exporter.config import resolve_sets
        from kernmlops.exporter.core import JobFilter
        from kernmlops.exporter.server import (
            ListenError,
            check_metrics_path,
            hold_listen,
            parse_listen,
            release_listen,
        )

        if config_dir and not config_names:
            raise ConfigError(
                f"--config.dir {config_dir} needs --config.names (the configs in it to load)"
            )
        if config_names and not config_dir:
            raise ConfigError(
                f"--config.names {config_names} needs --config.dir (the folder they are in)"
            )
        if config_dir and config_names:
            from kernmlops.exporter.compat import resolve_config_dir

            configs = (*configs, *resolve_config_dir(config_dir, config_names))
        sets = resolve_sets(configs)
        listen_given = click.get_current_context().get_parameter_source("listen") not in (
            None,
            click.core.ParameterSource.DEFAULT,
        )
        if web_listen is not None and listen_given:
            raise ListenError(
                f"--listen {listen} and --web.listen-address {web_listen}: both name where to "
                "serve; give one"
            )
        if web_listen is not None:
            # ebpf_exporter's form: ":9435" is every interface, IPv4 and IPv6, as in Go
            address, flag, any_host = web_listen, "--web.listen-address", True
        else:
            address, flag, any_host = listen, "--listen", False
        if address.startswith("fd://"):
            raise ListenError(
                f"{flag} {address}: systemd socket activation (fd://) is not supported: give "
                "HOST:PORT (the unit in deploy/systemd binds the port itself)"
            )
        parse_listen(address, flag=flag, any_host=any_host)  # its form, with the flags
        check_metrics_path(metrics_path)
        web = None
        if web_config_file is not None:
            from kernmlops.exporter.webconfig import load_web_config

            web = load_web_config(web_config_file)  # before any BPF work: errors come first
        check_tgid(tgid, error=ConfigError)  # one line, as every other flag error here
        # The tgid goes to the process filter (it follows forks), not to exp_tgid.
        job = JobFilter(comm=comm, cgroup=cgroup)
        require_bpf_privileges("export")
        # The port before anything is loaded: a busy one is said at once, not after every
        # program is attached; held for the server, or, for --check, tested and let go.
        try:
            host, port = hold_listen(address, flag=flag, any_host=any_host)
        except ListenError as err:
            if check:  # the same class: a busy port keeps its exit status
                raise type(err)(
                    f"{err} (--check tests the port too; {flag} 127.0.0.1:0 checks the sets alone)"
                ) from None
            raise
        try:
            from kernmlops.ebpf.build import build

            build()
            _run(
                sets, job, host, port, check, strict, bpf_stats, max_label_sets, keep,
                tgid=tgid, web=web, max_connections=max_connections, metrics_path=metrics_path,
            )  # fmt: skip
        finally:
            release_listen(host, port)  # --check, or no server started: the port goes
    except KernmlopsError as err:
        fail(err)


def _refuse_unsupported(debug: bool, btf_path: str | None, skip_cache_size: str | None) -> None:
    """ebpf_exporter's flags that kernmlops does not implement: one line each, not
    click's "no such option", and never accepted in silence."""
    if debug:
        raise ConfigError(
            "--debug (ebpf_exporter's libbpf debug log and raw /maps page) is not supported "
            "by kernmlops export: remove it"
        )
    if btf_path is not None:
        raise ConfigError(
            f"--btf.path {btf_path}: not supported; programs load against the running "
            "kernel's own BTF (/sys/kernel/btf/vmlinux): remove it"
        )
    if skip_cache_size is not None:
        raise ConfigError(
            f"--config.skip-cache-size {skip_cache_size}: ebpf_exporter's decoder skip cache "
            "is not supported by kernmlops export: remove it"
        )


def _list() -> None:
    from kernmlops.exporter.config import CounterSpec, builtin_sets

    for name, ms in builtin_sets().items():
        on = "on by default" if ms.spec.default else "off by default"
        click.echo(f"{name} ({on}): {ms.spec.description}")
        for m in ms.metrics:
            metric = m.exposed_name if isinstance(m, CounterSpec) else m.name
            kind = "counter" if isinstance(m, CounterSpec) else "histogram"
            labels = ",".join(label.name for label in m.labels)
            # no label: the name alone, as Prometheus writes such a metric (not "{}")
            click.echo(f"    {metric}{{{labels}}}  {kind}" if labels else f"    {metric}  {kind}")


def _report(statuses) -> None:
    from rich.table import Table

    table = Table(title="metric sets", title_justify="left")
    for col in ("set", "status", "programs", "not attached"):
        table.add_column(col)
    for s in statuses:
        if s.error:
            status = f"[red]failed[/]: {s.error}"
        else:
            status = f"[green]loaded[/] ({s.variant or 'no variants'})"
        missed = "\n".join(f"{p.name} ({p.section}): {p.error}" for p in s.missed) or "-"
        table.add_row(s.name, status, f"{s.attached}/{len(s.programs)}", missed)
    _console().print(table)


def _process_tree_filter(tgid: int):
    """The collector's in-kernel process filter, seeded with ``tgid`` and its
    descendants: its fork program, attached first, adds every later child."""
    import psutil

    from kernmlops.collect.filter import ProcessFilter

    flt = ProcessFilter(follow_children=True)
    flt.add(tgid)  # from now on the kernel adds its new children
    try:  # children forked before that moment
        for child in psutil.Process(tgid).children(recursive=True):
            flt.add(child.pid)
    except psutil.Error:
        pass  # it exited meanwhile: nothing more of it to count
    return flt


def _run(
    sets, job, host, port, check, strict, bpf_stats, max_label_sets, keep=None, tgid=None,
    web=None, max_connections=1024, metrics_path="/metrics",
) -> None:  # fmt: skip
    from kernmlops.exporter.core import Exporter
    from kernmlops.exporter.server import MetricsServer
    from kernmlops.exporter.service import failures, label_problems, not_attached

    stop = threading.Event()
    caught: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        caught.append(signum)
        stop.set()

    # Installed before loading: a SIGTERM during the load still detaches cleanly. A
    # hangup (its terminal closed) stops it as cleanly, not by the default action.
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    old = {sig: signal.signal(sig, on_signal) for sig in stops}
    flt = _process_tree_filter(tgid) if tgid is not None else None
    exporter = Exporter(
        sets,
        job=job,
        process_filter_fd=flt.fd if flt is not None else None,
        tracked=f"process {tgid} and its descendants",
        bpf_stats=bpf_stats,
        max_label_sets=max_label_sets,
        services_later=True,  # their threads start after the capability drop
    )
    server: MetricsServer | None = None
    try:
        statuses = exporter.start()
        # A check passes only when everything attached: "0 of 2 programs" is no pass.
        problems = failures(statuses, strict=strict or check)
        # Served without them, their metrics stay empty: said, not left to a gauge
        warnings = [] if strict or check else [*not_attached(statuses), *label_problems(statuses)]
        for line in warnings:
            _console().print(f"warning: {line}", markup=False, soft_wrap=True)
        if check or problems:
            _report(statuses)
        if check:
            if problems:
                lines = "\n".join(f"check failed: {p}" for p in problems)
                _console().print(lines, markup=False, soft_wrap=True)
                sys.exit(EXIT_CHECK_FAILED)
            from kernmlops.exporter.server import shown

            programs = sum(s.attached for s in statuses)
            _console().print(
                f"check passed: {len(statuses)} sets loaded, all {programs} programs attached, "
                f"{shown(host, port)} free to listen on",
                markup=False,
                soft_wrap=True,
            )
            return
        if problems:
            raise KernmlopsError("cannot serve:\n  " + "\n  ".join(problems))
        # bound while privileged
        server = MetricsServer(
            exporter.render, host, port, web_config=web, max_connections=max_connections,
            metrics_path=metrics_path,
        )  # fmt: skip
        if keep is not None:
            from kernmlops.exporter.caps import drop_capabilities, names

            kept = drop_capabilities(keep)
            _console().print(f"capabilities dropped; kept: {', '.join(names(kept)) or 'none'}")
        exporter.start_services()
        server.start()
        attached = sum(s.attached for s in statuses)
        _console().print(
            f"serving {len(statuses)} metric sets ({attached} programs) at {server.url}"
        )
        while not stop.wait(3600):
            pass
        _console().print(f"stopping ({signal.Signals(caught[0]).name}): detaching programs")
    finally:
        if server is not None:
            server.stop()
        exporter.close()
        if flt is not None:
            flt.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
