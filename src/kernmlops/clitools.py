"""What every command does the same way: fail with one clear line, show progress
on long work only where someone watches, and check for the privileges that
loading BPF programs needs."""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from kernmlops.errors import KernmlopsError, KernmlopsWarning

if TYPE_CHECKING:
    import click
    from rich.console import Console

#: every command's help: -h as well as --help, lines up to 100 columns (the option
#: help texts are written for that width)
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def fail(err: KernmlopsError) -> NoReturn:
    """Print ``error: <message>`` on stderr, one line, and exit with the error's code."""
    error_line(str(err))
    sys.exit(err.exit_code)


def error_line(message: str) -> None:
    """``error: <message>`` on stderr, one line (every command's errors look alike)."""
    from rich.console import Console  # rich only when there is something to print
    from rich.markup import escape

    # escape: a message may hold [brackets]; soft_wrap: it stays one line (no wrap at 80)
    console = Console(stderr=True, highlight=False)
    console.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """While inside, a KernmlopsWarning (a collection that is not whole, ...) is said as
    one ``warning: <message>`` line on stderr, as the commands say their own warnings,
    not as Python's two lines (the file and line that warned, then that source line).
    Other warnings (a library's deprecation, a bug's) keep Python's form, which says
    where they come from. The library's callers in Python still get the warning."""
    with warnings.catch_warnings():  # showwarning and the filters are restored on the way out
        python_way = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if not issubclass(category, KernmlopsWarning):
                python_way(message, category, filename, lineno, file, line)
                return
            from rich.console import Console
            from rich.markup import escape

            # soft_wrap: one line however long (paths), as fail() says an error
            console = Console(stderr=True, highlight=False)
            console.print(f"[yellow]warning:[/] {escape(str(message))}", soft_wrap=True)

        warnings.showwarning = show
        yield


def shows_live(enabled: bool | None = None, console: Console | None = None) -> bool:
    """Whether a live display (collect's table, a long command's progress) is drawn:
    never where turned off (``--no-progress``: ``enabled`` False), else only when
    stderr is a terminal, as rich judges it (a TTY; ``TTY_COMPATIBLE=1`` or
    ``FORCE_COLOR`` force it). Logs, pipes and CI get no display: what scripts parse
    stays as it is."""
    if enabled is False:
        return False
    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    return console.is_terminal


#: without a terminal, long work says how far it got at most this often (seconds)
PLAIN_EVERY_S = 10.0


class Steps:
    """How far one piece of work got, in ``unit`` (frames, bytes, collections, ...);
    what :func:`progress` yields. A library function takes its ``__call__`` (or
    ``advance``) as a plain callback, and never knows whether anything is drawn."""

    def __init__(self, what: str, unit: str, total: int | None, show: Any, plain: bool) -> None:
        self.what, self.unit = what, unit
        self.done = 0
        self.total = total
        self._show = show  # (rich Progress, its task) on a terminal, else None
        self._plain = plain
        self._said = time.monotonic()

    def __call__(self, done: int, total: int | None = None) -> None:
        """``done`` units of ``total`` (None: the total as it was)."""
        self.done = done
        if total is not None:
            self.total = total
        if self._show is not None:
            bar, task = self._show
            bar.update(task, completed=done, total=self.total)
        elif self._plain and time.monotonic() - self._said >= PLAIN_EVERY_S:
            self._said = time.monotonic()
            print(self.line(), file=sys.stderr, flush=True)

    def advance(self, n: int = 1) -> None:
        """``n`` more units done."""
        self(self.done + n)

    def line(self) -> str:
        """``<what>: <done>/<total> <unit>`` (bytes in KB, MB, ...)."""

        def amount(n: int) -> str:
            if self.unit != "bytes":
                return f"{n:,}"
            from rich.filesize import decimal

            return decimal(n)

        of = f"/{amount(self.total)}" if self.total is not None else ""
        unit = "" if self.unit == "bytes" else f" {self.unit}"
        return f"{self.what}: {amount(self.done)}{of}{unit}"


@contextlib.contextmanager
def progress(
    what: str,
    unit: str,
    *,
    total: int | None = None,
    enabled: bool | None = None,
    console: Console | None = None,
) -> Iterator[Steps]:
    """Progress of long work, shared by every command: on a terminal (:func:`shows_live`)
    a transient rich bar (``what``, done/total in ``unit``, elapsed and remaining time)
    that leaves nothing behind; elsewhere (a log, a pipe, CI) nothing, except one plain
    ``what: done/total unit`` line every PLAIN_EVERY_S seconds while it lasts longer.
    ``enabled`` False (``--no-progress``) says nothing at all."""
    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    if not shows_live(enabled, console):
        yield Steps(what, unit, total, None, plain=enabled is not False)
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    counted = [DownloadColumn()] if unit == "bytes" else [MofNCompleteColumn(), TextColumn(unit)]
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        *counted,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task(what, total=total)
    with bar:
        yield Steps(what, unit, total, (bar, task), plain=False)


#: a wait of unknown length says so once it has lasted this long (seconds), off a terminal
WAIT_SAY_AFTER_S = 2.0


@contextlib.contextmanager
def waiting(
    what: str, *, enabled: bool | None = None, console: Console | None = None
) -> Iterator[None]:
    """A wait of unknown length that may last seconds (reaching a server whose client
    retries): on a terminal a transient spinner (``what`` and the time so far); elsewhere
    one plain ``what ...`` line once it has lasted WAIT_SAY_AFTER_S, so a slow step is
    never silent. ``enabled`` False (``--no-progress``) says nothing."""
    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    if shows_live(enabled, console):
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        spinner = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        spinner.add_task(what, total=None)
        with spinner:
            yield
        return
    if enabled is False:
        yield
        return
    import threading

    # a timer thread: the wait itself is a blocking call that cannot report
    said = threading.Timer(
        WAIT_SAY_AFTER_S, lambda: print(f"{what} ...", file=sys.stderr, flush=True)
    )
    said.daemon = True
    said.start()
    try:
        yield
    finally:
        said.cancel()


@functools.cache
def _reachable_path() -> type[click.Path]:
    import click

    class ReachablePath(click.Path):
        """click.Path that tells a path the user may not reach (a folder above it they may
        not search) from a missing one: click's own check stats it and takes any error
        for a missing path, so it said "does not exist" (exists=True), or let it through
        to the command, where the first stat of it ended in a PermissionError's traceback."""

        def convert(self, value: Any, param: Any, ctx: Any) -> Any:
            if not (self.allow_dash and value in ("-", b"-")):
                try:
                    os.stat(value)
                except OSError as err:
                    # missing (or under a file): click's own words for it, as before
                    if err.errno not in (errno.ENOENT, errno.ENOTDIR):
                        denied = err.errno in (errno.EACCES, errno.EPERM)
                        why = "permission denied" if denied else (err.strerror or str(err))
                        shown = click.format_filename(value)
                        self.fail(f"{self.name.title()} {shown!r} cannot be reached: {why}",
                                  param, ctx)  # fmt: skip
            return super().convert(value, param, ctx)

    return ReachablePath


def reachable_path(**options: Any) -> click.Path:
    """``click.Path(**options)`` for a path a user gives: one they may not reach is
    refused as such (``Path 'x' cannot be reached: permission denied``), not said to be
    missing, nor passed on to fail later. click is imported on first use."""
    return _reachable_path()(**options)


def check_tgid(
    tgid: int | None, option: str = "--tgid", error: type[KernmlopsError] | None = None
) -> None:
    """Refuse a ``tgid`` that is not a running process's id, before anything is set up;
    None passes. Raises ``error`` (``<option> <tgid>: why``, one line) where given, else
    click.BadParameter (a usage error)."""
    import click

    if tgid is None:
        return
    if tgid <= 0:
        why, said = "a process id is positive", f"{tgid}: a process id is positive"
    elif not os.path.exists(f"/proc/{tgid}"):
        why = said = f"no process {tgid}"
    elif (leader := _thread_group_of(tgid)) not in (None, tgid):
        # a thread's id (top -H, ps -L): the filter matches processes, so nothing would be
        why = said = f"{tgid} is a thread of process {leader}: give the process id, {leader}"
    else:
        return
    if error is not None:
        raise error(f"{option} {tgid}: {why}")
    raise click.BadParameter(said, param_hint=option)


def _thread_group_of(pid: int) -> int | None:
    """The process (thread group) ``pid`` is a thread of, as /proc says (None: it
    cannot tell, e.g. the thread exited meanwhile)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def require_bpf_privileges(command: str, error: type[KernmlopsError] = KernmlopsError) -> None:
    """Raise ``error`` unless this process may load BPF programs (CAP_BPF + CAP_PERFMON
    or CAP_SYS_ADMIN in its effective set: uid 0 alone is not enough); ``command``
    names what the user ran, for the message."""
    # imported here, not at the top: importing kernmlops.cli stays light
    from kernmlops.ebpf.probe import has_bpf_capabilities

    if has_bpf_capabilities():
        return
    if os.geteuid() == 0:  # root whose bounding set (setpriv, capsh, a unit) left them out
        raise error(
            f"{command} needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN) to load BPF "
            "programs, and this uid 0 lacks them (its capability bounding set)"
        )
    raise error(
        f"{command} needs root (or CAP_BPF + CAP_PERFMON) to load BPF programs: run it with sudo"
    )


class _Unbroken(io.RawIOBase):
    """fd 1 or 2 as a raw stream whose reader may go away (``| head``, a closed log
    pipe, a terminal hung up: EPIPE, EIO) or whose file cannot take more (ENOSPC):
    from the first write it refuses, the fd points at /dev/null and writing goes on,
    so a command never stops (or loses what it collected) for its output."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            raise  # a non-blocking fd that is full now, not gone
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.dup2(null, self._fd, inheritable=True)
            finally:
                os.close(null)
            return len(memoryview(data))


def _unbroken(stream: Any, fd: int) -> Any:
    if stream is None or getattr(stream, "_kmo_unbroken", False):
        return stream
    try:
        if stream.fileno() != fd:
            return stream  # already redirected by the caller (a test, an embedding)
    except (AttributeError, OSError, ValueError):
        return stream
    text = io.TextIOWrapper(
        io.BufferedWriter(_Unbroken(fd)),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=stream.line_buffering,
        write_through=getattr(stream, "write_through", False),
    )
    text._kmo_unbroken = True  # type: ignore[attr-defined]
    return text


def survive_closed_output() -> None:
    """Make stdout and stderr writes that find their reader gone go to /dev/null
    instead of raising BrokenPipeError: ``kernmlops collect ... | head -1`` and a log
    pipe that closes mid-run would otherwise end a collection in an error. The
    streams Python started with stay open (sys.__stdout__, sys.__stderr__)."""
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout = _unbroken(sys.stdout, 1)
    sys.stderr = _unbroken(sys.stderr, 2)
