"""Read a YAML file a user gives us (configs, metric sets, duet suites), refusing
hostile ones before any work: too big, binary or not UTF-8, nested too deep,
or an alias bomb ("billion laughs": anchors whose aliases nest, so a few
hundred bytes stand for millions of values).

``yaml.safe_load`` composes aliases into shared objects cheaply, but whoever
walks the result (pydantic's validation, deepcopy, error messages) walks every
alias again, so the cost is exponential. The loader here counts nodes as such
a walk would see them, each alias adding the size of the node it names, and
stops at a limit while composing.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from kernmlops.errors import ConfigError
from kernmlops.host.pinned import TooBig, read_bounded

#: Largest file read. The defaults are ~4 KiB; a real config is far below this.
MAX_BYTES = 1 << 20
#: Most values (nodes), each alias counted as the nodes it stands for. The
#: defaults have ~270; a bomb passes this after a few hundred aliases.
MAX_NODES = 50_000
#: Deepest nesting; PyYAML's composer recurses and would hit Python's limit.
MAX_DEPTH = 100


class _Refused(yaml.YAMLError):
    """A limit was hit; the message says which and where."""


class _Limits(yaml.composer.Composer):
    """The composer's and constructor's checks, mixed into a loader."""

    max_nodes = MAX_NODES
    max_depth = MAX_DEPTH

    def _start_limits(self) -> None:
        self._nodes = 0  # nodes composed so far, aliases expanded
        self._aliases = 0
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(anchored node) -> its expanded size

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > self.max_nodes:
            bomb = " once its aliases are expanded (an alias bomb?)" if self._aliases else ""
            raise _Refused(f"line {mark.line + 1}: more than {self.max_nodes:,} values{bomb}")

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = self.anchors.get(event.anchor)
            if node is not None:  # an unknown anchor: the composer's own error
                size = self._sizes.get(id(node))
                if size is None:  # still being composed: the alias is inside its anchor
                    raise _Refused(
                        f"line {event.start_mark.line + 1}: alias *{event.anchor} is inside "
                        "the node it names (a cycle)"
                    )
                self._aliases += 1
                self._count(size, event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > self.max_depth:
            raise _Refused(
                f"line {event.start_mark.line + 1}: nested deeper than {self.max_depth} levels"
            )
        start = self._nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if getattr(event, "anchor", None) is not None:
            self._sizes[id(node)] = self._nodes - start
        return node

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> Any:
        # YAML forbids a key twice in one mapping; PyYAML keeps the last in silence, so
        # a section written twice lost the first one's settings. Merged keys (<<) may
        # be overridden: only the mapping's own keys are compared.
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                    key_node, yaml.ScalarNode
                ):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"the key {key!r} is given twice in one mapping (first on line "
                        f"{seen[key] + 1}): the first would be ignored",
                        key_node.start_mark,
                    )  # fmt: skip
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:
            # e.g. an integer of 5000 digits, or the date 2024-13-01
            raise yaml.constructor.ConstructorError(
                None, None, f"bad value: {err}", node.start_mark
            ) from None


class LimitedLoader(_Limits, yaml.SafeLoader):
    """SafeLoader (pure Python) that refuses alias bombs, cycles and deep nesting."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._start_limits()

    def fetch_flow_collection_start(self, TokenClass: type) -> None:
        # Refused while scanning: the scanner looks far ahead inside "[[[[..."
        if self.flow_level >= self.max_depth:
            raise _Refused(f"line {self.line + 1}: nested deeper than {self.max_depth} levels")
        super().fetch_flow_collection_start(TokenClass)


if yaml.__with_libyaml__:
    from yaml.cyaml import CParser

    class LimitedCLoader(_Limits, CParser, SafeConstructor, Resolver):
        """The same checks on libyaml's events: ~20x faster to scan a large file.
        The Python composer comes first in the MRO, so every node passes the checks."""

        def __init__(self, stream: str | bytes) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            yaml.composer.Composer.__init__(self)
            self._start_limits()

        # libyaml >= 0.2.5 stops at 1000 levels while scanning ahead inside "[[[[...",
        # before the composer counts to max_depth: the same refusal, one wording.
        def _nesting(self, err: yaml.YAMLError) -> yaml.YAMLError:
            if "maximum nesting depth" not in str(err):
                return err
            mark = getattr(err, "problem_mark", None)
            line = f"line {mark.line + 1}: " if mark is not None else ""
            return _Refused(f"{line}nested deeper than {self.max_depth} levels")

        def check_event(self, *choices: Any) -> bool:
            try:
                return CParser.check_event(self, *choices)
            except yaml.YAMLError as err:
                raise self._nesting(err) from None

        def peek_event(self) -> Any:
            try:
                return CParser.peek_event(self)
            except yaml.YAMLError as err:
                raise self._nesting(err) from None

        def get_event(self) -> Any:
            try:
                return CParser.get_event(self)
            except yaml.YAMLError as err:
                raise self._nesting(err) from None

    LOADER: type = LimitedCLoader
else:  # pragma: no cover - PyYAML built without libyaml
    LOADER = LimitedLoader


def _describe_yaml_error(err: yaml.YAMLError, text: str = "") -> str:
    """One line: where and what, without PyYAML's multi-line excerpt (``text``: the
    document, to name a tab where the error is)."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        what = err.problem or err.context or "syntax error"
        lines = text.split("\n")
        line = lines[mark.line] if 0 <= mark.line < len(lines) else ""
        if 0 <= mark.column < len(line) and line[mark.column] == "\t" and "tab" not in what:
            what += " (a tab: YAML indents with spaces)"  # PyYAML's words do not say so
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _size(n: int) -> str:
    if n < 1 << 20:
        return f"{n:,} bytes"
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n / (1 << 20):.1f} MiB"


def not_plain(mode: int) -> str:
    """What a file of ``mode`` (not a plain one) is, for a message."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a folder" if stat.S_ISDIR(mode) else "not a file"


def read_limited(path: Path, max_bytes: int, *, plain: bool = False) -> bytes:
    """The bytes of ``path``, at most ``max_bytes``: a plain file over it is not read
    (pinned.read_bounded), a pipe or a device no further than one byte past it.
    ``plain``: a plain file only (OSError EINVAL, naming what it is, for anything
    else: a FIFO whose writer never writes would be waited on for ever, one without
    a writer read as empty).

    A pipe (``-c <(...)``) or another file that is not plain is read for at most
    :data:`PIPE_WAIT_S` seconds: a FIFO planted at the name whose writer stays and
    sends nothing (or a byte a minute) is refused (OSError ETIMEDOUT), not waited on
    for ever.

    Raises:
        TooBig: over ``max_bytes``; its ``size`` where the file's is known.
    """
    # O_NONBLOCK: a FIFO with no writer would block the open forever; one without a
    # writer gives EOF at once (a pipe of `-c <(...)` has its writer)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode):
            return read_bounded(f, max_bytes, path)
        if plain:
            raise OSError(errno.EINVAL, f"{not_plain(st.st_mode)}, not a plain file", str(path))
        data = _read_for_a_while(fd, path, max_bytes + 1, PIPE_WAIT_S)
        if len(data) > max_bytes:
            raise TooBig(errno.EFBIG, f"more than {_size(max_bytes)}", str(path))
        return data


#: how long a pipe (or a device) given as a YAML file may take to send all of it
PIPE_WAIT_S = 30.0


def _read_for_a_while(fd: int, path: Path, limit: int, wait_s: float) -> bytes:
    """Up to ``limit`` bytes of the non-blocking ``fd``, up to its end, within
    ``wait_s`` seconds."""
    import select
    import time

    deadline = time.monotonic() + wait_s
    chunks: list[bytes] = []
    got = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while got < limit:
        try:
            chunk = os.read(fd, min(limit - got, 1 << 16))
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(
                    errno.ETIMEDOUT,
                    f"{not_plain(os.fstat(fd).st_mode)} that sent no end in {wait_s:g} s",
                    str(path),
                ) from None
            poller.poll(left * 1000)
            continue
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


#: the path that names standard input where a caller allows it (``-c -``)
STDIN = "-"


def safe_yaml(
    path: str | Path,
    *,
    what: str = "config",
    error: type[ConfigError] = ConfigError,
    max_bytes: int = MAX_BYTES,
    plain: bool = False,
    dash_is_stdin: bool = False,
) -> Any:
    """The parsed YAML of ``path``. Every problem raises ``error`` with one line
    that names the file: unreadable, over ``max_bytes``, not UTF-8 text, not
    YAML, or over the loader's limits. ``what`` names the file's kind; ``plain``:
    a plain file only (no FIFO, no device). ``dash_is_stdin``: ``-`` is standard
    input (named ``stdin`` in errors), read with the same limits as a file."""
    if dash_is_stdin and str(path) == STDIN:
        # opened anew, not read through fd 0: O_NONBLOCK on a new open file leaves the
        # shell's terminal or pipe as it was; a plain file (< file) is read from its start
        opened, path = Path("/dev/stdin"), Path("stdin")
    else:
        opened = path = Path(path)
    try:
        raw = read_limited(opened, max_bytes, plain=plain)
    except TooBig as err:
        shown = _size(err.size) if err.size is not None else f"more than {_size(max_bytes)}"
        raise error(f"{path} is {shown}: a {what} file may be at most {_size(max_bytes)}") from None
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror}") from None
    nul = raw.find(b"\0")
    if nul >= 0:
        raise error(f"{path} is not a text file (a NUL byte at offset {nul}): expected YAML")
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = bom + err.start
        raise error(
            f"{path} is not UTF-8 text (byte {raw[at]:#04x} at offset {at}): expected YAML"
        ) from None
    try:
        return yaml.load(text, Loader=LOADER)  # safe: LOADER constructs plain data only
    except _Refused as err:
        raise error(f"{path}: refused: {err}") from None
    except yaml.YAMLError as err:
        raise error(f"{path} is not valid YAML: {_describe_yaml_error(err, text)}") from None
