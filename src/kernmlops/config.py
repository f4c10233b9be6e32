"""Configuration: pydantic models are the single source.

``defaults.yaml`` is generated from them (``kernmlops defaults``); a user's
overrides file is merged on top, then command-line flags. Hook and benchmark
sections come from their registries, so a new hook brings its own options; a
configuration imports and validates only the hooks and benchmarks it names or
runs (a run does not pay for every plug-in's import). Errors name the key path,
what was expected and the nearest valid key.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    create_model,
    field_validator,
    model_validator,
)

from kernmlops.benchmarks import REGISTRY as BENCHMARKS
from kernmlops.errors import ConfigError
from kernmlops.hooks import DEFAULT_HOOKS
from kernmlops.hooks import REGISTRY as HOOKS
from kernmlops.host.cpus import online_cpu_count
from kernmlops.host.environment import ENVIRONMENT_FIELDS
from kernmlops.registry import Plugins
from kernmlops.validation import (
    MAX_PROBLEMS_SHOWN,
    key_path,
    keys_at,
    not_a_config,
    problems,
    shown_key,
    unknown_key,
)

#: the validation context's key that lets collector.hooks be empty (Flags.no_hooks)
NO_HOOKS = "no_hooks"


def _key(name: str) -> str:
    """Config key of a registry name (stress-ng -> stress_ng)."""
    return name.replace("-", "_")


def _known(kind: str, name: str, plugins: Plugins[Any]) -> str:
    """``name`` if ``plugins`` has it (read from the index: nothing is imported), else
    ValueError: ``unknown hook 'x'; did you mean 'y'? (known: ...)``."""
    if name not in plugins:
        near = difflib.get_close_matches(name, plugins, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"unknown {kind} {name!r}{hint} (known: {', '.join(plugins)})")
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def default_spool_memory_mib(cpus: int | None = None, ram_mib: float | None = None) -> float:
    """collector.spool_memory_mib's default for a machine: 64 MiB per CPU online (a
    switch storm spools ~13 MiB/s per CPU: 5 s of it stays in memory), at least 256
    MiB, at most 1/16 of the RAM (spool.spool_memory also keeps half the tmpfs free)."""
    n = cpus if cpus is not None else online_cpu_count()
    if ram_mib is None:
        ram_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    ram = ram_mib
    return float(max(256, min(64 * n, ram // 16)))


class CollectorConfig(_Strict):
    output_dir: Path = Field(
        Path("data"), description="collections go to <output_dir>/curated/benchmark=<b>/..."
    )
    hooks: list[str] = Field(
        list(DEFAULT_HOOKS), description="hooks to run, by name (at least one)"
    )
    filter: Literal["auto", "system", "tgid", "tree"] = Field(
        "auto",
        description="auto: the benchmark's default; system: everything; "
        "tgid: only collector.tgid; tree: the benchmark's process tree",
    )
    tgid: int | None = Field(None, ge=1, description="process to trace with filter: tgid")
    strict: bool = Field(False, description="a hook that cannot attach is an error")
    poll_interval_ms: int = Field(
        10, ge=1, le=1000, description="shortest time between two drains of the ring buffers"
    )
    poll_max_interval_ms: int = Field(
        100,
        ge=1,
        le=10000,
        description="longest time between two polls while a hook's BPF programs cannot "
        "wake the collector (its own, not submitting with common.h's macros); otherwise "
        "it sleeps until a ring falls due (its batch_ms, or sooner at the rate it fills) "
        "or passes a quarter full, a flush, the benchmark's exit or a stop signal",
    )
    flush_interval_s: float = Field(
        5.0, gt=0, le=3600, description="longest time rows wait in memory before Parquet"
    )
    row_group_rows: int = Field(65536, ge=1024, le=16 << 20, description="Parquet row group")
    compact: bool = Field(
        True,
        description="at stop, rewrite each table's flushed parts as one compactly encoded "
        "file (an atomic swap: the parts stay if anything fails); the run's own parts are "
        "then written with lz4 and deltas only (no dictionaries, no zstd): about two thirds "
        "of the compact encoding's CPU per row while the workload runs, for ~2.7x the disk "
        "space until the stop",
    )
    spool: bool = Field(
        True,
        description="copy BPF rings to a spool in the collection (.spool/) and make rows "
        "from it only while the machine has CPU to spare, and at stop: a workload that "
        "keeps every CPU busy loses only the copy to the collector (kernmlops recover "
        "turns a killed collection's spool into parts)",
    )
    spool_memory_mib: float | None = Field(
        None,
        ge=0,
        description="with spool: the spool's first MiB go to a tmpfs (/dev/shm, at most half "
        "its free space) instead of the disk: no disk writes and no compression under a "
        "short storm, and they outlive a killed collector (not a reboot); the rest goes to "
        "the collection's disk, compressed. null: 64 MiB per CPU online (a storm spools "
        "~13 MiB/s per CPU), at least 256, at most 1/16 of the RAM. 0: all on disk",
    )
    spool_runway_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="with spool: keep this many seconds of the spool's recent disk writes "
        "allocated ahead of them (fallocate, by a thread beside the copier), 1 MiB to 2 GiB a "
        "spool (while the spool is in memory, 1 MiB, and 5 s of its writes once the memory "
        "budget is about to end): on ext4 a write that allocates waits for the journal, "
        "which a storm keeps off the CPU, and the rings overflow meanwhile. Unused blocks are "
        "given back as each "
        "segment ends; it never leaves less than twice collector.min_free_mb plus 64 MiB free. "
        "0: off",
    )
    spool_spare_cpus: float | None = Field(
        None,
        ge=0,
        description="with spool: rows are made during the run only while this much CPU "
        "(in CPUs) was idle over the last 0.1 s. null: a quarter of the CPUs the collector "
        "may use, at least 0.5 (a workload that waits on its own wake-ups, such as a switch "
        "storm, leaves a CPU or two idle for moments between them on a large machine: not "
        "spare; the stop's row workers make those rows instead)",
    )
    spool_row_workers: int | None = Field(
        None,
        ge=0,
        description="with spool: processes that make the rows of what the spool still "
        "holds once the benchmark ended, one per CPU (one core made 2.3-3.1M records' rows a "
        "second on a 2-vCPU VM, and a 16-core storm spools about 8M a second: "
        "bench/README.md). null: one per CPU the collector may "
        "use, where it may use 4 or more and at least 96 MiB of records wait (a worker's "
        "start costs 1-2 s of CPU); 0 or 1: in the collector alone",
    )
    copier_priority: int = Field(
        1,
        ge=0,
        le=99,
        description="SCHED_FIFO priority of the thread that copies BPF rings into the "
        "spool (like perf record --realtime; it only copies, then sleeps): a storm of more "
        "runnable tasks than CPUs, or in a session of its own, keeps a normal thread off "
        "the CPU for seconds and the rings overflow. 0: normal priority",
    )
    copier_workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="threads that compress the spool's disk frames beside the copiers "
        "(zstd's own, at the copier's priority), shared by a table's copiers (each gets its "
        "share, rounded up); one compresses ~6M quanta records/s on the 2-vCPU VM, a 16-core "
        "storm makes 8M/s. null: one per 8 CPUs above 4 CPUs, 0: the copier alone",
    )
    min_free_mb: float = Field(
        64,
        ge=0,
        description="refuse to start with less free space than this in output_dir; during "
        "the run (checked 4 times a second) stop the benchmark when its filesystem has less, "
        "or the spool's tmpfs has less than this and than the spool may still put there: "
        "finished parts and the spool are kept for kernmlops recover (the room left keeps "
        "the manifest and the machine's other writers going). 0: only a full filesystem "
        "stops it",
    )
    warn_free_mb: float = Field(
        1024, ge=0, description="warn when starting with less free space than this"
    )
    progress: bool = Field(True, description="live progress while collecting")
    output_graphs: bool = Field(
        False, description="draw the collection's graphs (kernmlops graph) when it ends"
    )
    export: str | None = Field(
        None,
        description="also serve the collection's live Prometheus metrics at HOST:PORT "
        "(e.g. 127.0.0.1:9435); null: off",
    )
    export_sets: list[str] = Field(
        [], description="metric sets served with export: files or built-in names; []: defaults"
    )
    export_web_config: str | None = Field(
        None,
        description="TLS and basic auth for export: a web configuration file of the "
        "Prometheus exporter-toolkit, as kernmlops export --web.config.file takes; null: "
        "plain HTTP, no auth",
    )
    export_grace_s: float | None = Field(
        None,
        ge=0,
        description="after the benchmark ends, export keeps serving the final values until a "
        "scrape took them or this many seconds passed; null: two scrape intervals as seen "
        "(30 s before any), 0: stop at once",
    )
    nice: int | None = Field(
        None,
        ge=-20,
        le=19,
        description="scheduling priority of the collector (e.g. -10 keeps up with event "
        "storms), and of its session's autogroup where the kernel groups sessions (restored "
        "afterwards); the benchmark keeps kernmlops' own priority; null: unchanged",
    )

    @property
    def spool_memory(self) -> float:
        """MiB of the spool on a tmpfs on this machine (spool_memory_mib or its default)."""
        if self.spool_memory_mib is not None:
            return self.spool_memory_mib
        return default_spool_memory_mib()

    @field_validator("hooks")
    @classmethod
    def _known_hooks(cls, hooks: list[str], info: ValidationInfo) -> list[str]:
        # a collection of nothing: a slip (`--hooks ""`), not a wish, unless asked for
        # by name (--no-hooks: the benchmark timed untraced, load_config's NO_HOOKS)
        if not hooks and not (info.context or {}).get(NO_HOOKS):
            raise ValueError(
                "give at least one hook (`kernmlops collect --help` says how; "
                "`kernmlops doctor` lists them; --no-hooks runs the benchmark with none)"
            )
        for name in hooks:
            _known("hook", name, HOOKS)
        return list(dict.fromkeys(hooks))

    @field_validator("output_dir")
    @classmethod
    def _home_expanded(cls, value: Path) -> Path:
        """``~/data`` in a file is the home folder's, as the shell makes it of ``-o``
        (it made a folder named ``~`` in the current one); under sudo, the invoking
        user's, as the shell expanded it before sudo ran."""
        text = str(value)
        if text == "~" or text.startswith("~/"):
            from kernmlops.host.invoker import invoker

            who = invoker()
            if who is not None:
                return Path(who.home, text[2:])
        return value.expanduser()

    @field_validator("export")
    @classmethod
    def _listen_address(cls, value: str | None) -> str | None:
        if value is not None:
            from kernmlops.exporter.server import parse_listen

            try:
                parse_listen(value)
            except ConfigError as err:
                raise ValueError(str(err).removeprefix("--listen ")) from None
        return value

    @model_validator(mode="after")
    def _check(self) -> CollectorConfig:
        if self.filter == "tgid" and self.tgid is None:
            raise ValueError("filter 'tgid' needs collector.tgid")
        if self.poll_max_interval_ms < self.poll_interval_ms:
            if "poll_max_interval_ms" not in self.model_fields_set:
                # the default follows a longer interval (a KernMLOps file's poll_rate 0.5)
                self.poll_max_interval_ms = self.poll_interval_ms
                return self
            raise ValueError(
                f"poll_max_interval_ms ({self.poll_max_interval_ms}) is below "
                f"poll_interval_ms ({self.poll_interval_ms}): the longest wait between "
                "two polls cannot be shorter than the shortest"
            )
        return self


class _PluginSection(_Strict):
    """A section with a subsection per plug-in (``hooks.<hook>``, ``benchmark.<name>``).

    Only the subsections it names are imported and validated: each validation uses a
    model with exactly those subsections (made once per set of names), so unknown
    keys, wrong types and bad values are errors as anywhere else. A plug-in it does
    not name has its defaults (:meth:`options`), and a section equals another that
    spells out those defaults."""

    #: the registry of this section's plug-ins
    plugins: ClassVar[Plugins[Any]]

    @classmethod
    def plugin_keys(cls) -> dict[str, str]:
        """Config key -> plug-in name of every plug-in, in the index's order (the
        registry's index: nothing is imported)."""
        return {_key(name): name for name in cls.plugins}

    @classmethod
    def options_model(cls, key: str) -> type[BaseModel] | None:
        """The options model of subsection ``key`` (its plug-in is imported); None
        where no plug-in has that key."""
        name = cls.plugin_keys().get(key)
        return None if name is None else cls.plugins[name].Options

    @classmethod
    def valid_keys(cls) -> list[str]:
        """Every key this section accepts (its own and a subsection per plug-in)."""
        return sorted({*_section_of(cls).model_fields, *cls.plugin_keys()})

    @model_validator(mode="wrap")
    @classmethod
    def _named_only(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if cls.__base__ is not _PluginSection or not isinstance(data, dict):
            return handler(data)  # a model for one set of names, or not a mapping (its error)
        named = tuple(key for key in cls.plugin_keys() if key in data)
        return _with_subsections(cls, named).model_validate(data)

    def options(self, key: str) -> BaseModel:
        """Subsection ``key``: as validated, or its plug-in's defaults if not named."""
        model = self.options_model(key)
        if model is None:
            raise KeyError(key)
        if key in type(self).model_fields:
            value: BaseModel = getattr(self, key)
            return value
        return model()

    def __eq__(self, other: object) -> bool:
        section = _section_of(type(self))
        if not isinstance(other, _PluginSection) or _section_of(type(other)) is not section:
            return NotImplemented
        own = section.model_fields
        for key in {*type(self).model_fields, *type(other).model_fields}:
            if key in own:
                same = getattr(self, key) == getattr(other, key)
            else:
                same = self.options(key) == other.options(key)
            if not same:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]  # mutable, like every model here


def _section_of(model: type[_PluginSection]) -> type[_PluginSection]:
    """The section class (HooksConfig, BenchmarkConfig) of a model made for a set of names."""
    while model.__base__ is not _PluginSection:
        model = model.__base__  # type: ignore[assignment]
    return model


@functools.cache
def _with_subsections(section: type[_PluginSection], keys: tuple[str, ...]) -> type[BaseModel]:
    """``section`` with a subsection for each of ``keys`` (their plug-ins imported)."""
    fields: dict[str, Any] = {}
    for key in keys:
        model = section.options_model(key)
        fields[key] = (model, Field(default_factory=model))
    return create_model(section.__name__, __base__=section, __module__=__name__, **fields)


class HooksConfig(_PluginSection):
    plugins = HOOKS


BenchmarkConfig = create_model(
    "BenchmarkConfig",
    __base__=_PluginSection,
    __module__=__name__,
    name=(
        Annotated[str, AfterValidator(lambda name: _known("benchmark", name, BENCHMARKS))],
        Field("stress-ng", description="which benchmark runs"),
    ),
    duration_s=(
        float | None,
        # finite: inf would be accepted by gt=0 and never stop (null is "when done")
        Field(
            None,
            gt=0,
            allow_inf_nan=False,
            description="stop after this many seconds (null: when done)",
        ),
    ),
    as_user=(
        bool,
        Field(
            False,
            description="under sudo, run the benchmark as the user who ran sudo (SUDO_UID, "
            "SUDO_GID, their groups and HOME) instead of root. Off by default, as perf "
            "record, bpftrace -c and strace run their command with the tool's own "
            "privileges: what is measured runs as it would under those tools, and the "
            "benchmarks that drop caches, set THP or use devices can. The collection's "
            "files belong to the user either way",
        ),
    ),
    **ENVIRONMENT_FIELDS,
)
BenchmarkConfig.plugins = BENCHMARKS


def _naming(section: Any, names: Any, plugins: Plugins[Any]) -> Any:
    """``section`` (the file's) with an empty subsection, i.e. the defaults, for each
    of ``names`` it leaves out; a section that is not a mapping or names that are not
    a list of plug-ins are left to the validation that reports them."""
    if not isinstance(section, dict):
        return section
    section = dict(section)
    for name in names if isinstance(names, (list, tuple)) else ():
        if isinstance(name, str) and name in plugins:
            section.setdefault(_key(name), {})
    return section


def _given(section: Any, key: str, default: Any) -> Any:
    """``section[key]`` of a mapping or a model, else ``default``."""
    if isinstance(section, dict):
        return section.get(key, default)
    return getattr(section, key, default)


class Config(_Strict):
    collector: CollectorConfig = Field(default_factory=CollectorConfig)
    # SerializeAsAny: dumped as the model made for the subsections named, not as the
    # section's bare class (which has none)
    hooks: SerializeAsAny[HooksConfig] = Field(default_factory=HooksConfig)
    benchmark: SerializeAsAny[BenchmarkConfig] = Field(default_factory=BenchmarkConfig)  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _sections_a_run_uses(cls, data: Any) -> Any:
        """The subsections of the hooks and the benchmark a run uses are validated with
        the rest (their defaults where the file leaves them out): their plug-ins are
        imported here, before anything starts, and the resolved configuration (the
        manifest's) holds their options."""
        if not isinstance(data, dict):
            return data
        hooks = _given(data.get("collector"), "hooks", DEFAULT_HOOKS)
        default_benchmark = BenchmarkConfig.model_fields["name"].default
        benchmark = _given(data.get("benchmark"), "name", default_benchmark)
        return {
            **data,
            "hooks": _naming(data.get("hooks", {}), hooks, HOOKS),
            "benchmark": _naming(data.get("benchmark", {}), [benchmark], BENCHMARKS),
        }

    def hook_options(self, name: str) -> BaseModel:
        return self.hooks.options(_key(name))

    def benchmark_options(self, name: str | None = None) -> BaseModel:
        section: _PluginSection = self.benchmark
        return section.options(_key(name or self.benchmark.name))


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model that holds the keys at ``loc`` of the configuration (walking nested
    models, and a plug-in's subsection through its registry), else None."""
    model: type[BaseModel] = Config
    for part in loc:
        if issubclass(model, _PluginSection) and (sub := model.options_model(str(part))):
            model = sub
            continue
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """Valid keys of the section at ``loc`` (validation.keys_at, which knows the plug-in
    subsections only through the registries)."""
    for depth in range(len(loc), -1, -1):
        model = _model_at(loc[:depth])
        if model is not None:
            if issubclass(model, _PluginSection) and depth == len(loc):
                return model.valid_keys()
            return keys_at(model, loc[depth:])
    return []


# --- errors ------------------------------------------------------------------
#: Most problems listed in one message; a hostile file can have thousands.
def _shown(value: Any) -> str:
    """A value as the user wrote it, cut short (a hostile one may be huge)."""
    return reprlib.repr(value)


def _from_flag(err: dict[str, Any], flags: frozenset[tuple[str, ...]]) -> bool:
    loc = tuple(str(p) for p in err["loc"])
    return any(loc[: len(f)] == f for f in flags)


def _dotted(loc: tuple[Any, ...], renames: dict[str, str]) -> str:
    """A key path as the user wrote it: ``renames`` maps our paths (or prefixes) to
    the file's own (a KernMLOps file's ``benchmark_config.gap`` for ``benchmark.gap``).
    A part that is not a key (a line of some other file) is cut (validation.shown_key)."""
    parts = [str(p) for p in loc]
    for ours in sorted(renames, key=len, reverse=True):
        head = ours.split(".")
        if parts[: len(head)] == head:
            return ".".join([renames[ours], *map(shown_key, parts[len(head) :])])
    return key_path(parts)


def _describe(
    err: dict[str, Any],
    flags: frozenset[tuple[str, ...]] = frozenset(),
    renames: dict[str, str] | None = None,
) -> str:
    loc = tuple(err["loc"])
    renames = renames or {}
    path = _dotted(loc, renames) or "(top level)"
    kind = err["type"]
    origin = " (set on the command line)" if _from_flag(err, flags) else ""
    if kind == "extra_forbidden":
        parent = _dotted(loc[:-1], renames)  # as the file names it (a KernMLOps file's own)
        prefix = parent.split(".") if parent else ()
        unknown = unknown_key(str(loc[-1]), _keys_at(loc[:-1]), prefix=prefix)
        return f"{path}: {unknown}{origin}"
    got = err.get("input")
    if kind in ("model_type", "dict_type"):  # a section that is not a mapping
        return f"{path}: expected a mapping of keys (got {_shown(got)}){origin}"
    msg = err["msg"].removeprefix("Value error, ")
    said = isinstance(got, dict) or any(f"got {g}" in msg for g in {str(got), _shown(got)})
    shown = "" if said else f" (got {_shown(got)})"  # a validator that names it already
    return f"{path}: {msg}{shown}{origin}"


def format_errors(
    error: ValidationError,
    source: str | None = None,
    flags: frozenset[tuple[str, ...]] = frozenset(),
    renames: dict[str, str] | None = None,
) -> str:
    """One line for one problem, else a list; ``source`` is the file, ``flags``
    the key paths set on the command line (their errors say so), ``renames`` the
    file's own names of our key paths (see _dotted)."""
    errors = error.errors()
    only_flags = all(_from_flag(e, flags) for e in errors)
    where = f" in {source}" if source and not only_flags else ""
    shown = [_describe(e, flags, renames) for e in errors[:MAX_PROBLEMS_SHOWN]]
    return problems(f"invalid configuration{where}", shown, len(errors))


# --- loading -------------------------------------------------------------------
@dataclass(frozen=True)
class Flags:
    """What the command line sets, typed: None leaves the file's (or default) value.
    :meth:`paths` is the one place a flag meets its configuration key."""

    #: -d/--duration: benchmark.duration_s, read by the session's loop
    duration_s: float | None = None
    #: -o: collector.output_dir
    output_dir: Path | str | None = None
    #: -b: benchmark.name
    benchmark: str | None = None
    #: the command after ``--``: benchmark.command.argv (and benchmark.name command)
    argv: list[str] | None = None
    #: --hooks: collector.hooks
    hooks: list[str] | None = None
    #: --tgid: collector.tgid
    tgid: int | None = None
    #: --tgid (tgid), --system-wide (system): collector.filter
    filter: Literal["auto", "system", "tgid", "tree"] | None = None
    #: --strict: collector.strict
    strict: bool | None = None
    #: --no-progress: collector.progress
    progress: bool | None = None
    #: --export: collector.export
    export: str | None = None
    #: --export-grace: collector.export_grace_s
    export_grace_s: float | None = None
    #: --web.config.file: collector.export_web_config
    export_web_config: str | None = None
    #: --as-user: benchmark.as_user
    as_user: bool | None = None
    #: -p/--poll-rate (KernMLOps' seconds): collector.poll_interval_ms
    poll_interval_ms: int | None = None
    #: --no-hooks: collector.hooks empty (the one way it may be: the benchmark alone)
    no_hooks: bool = False
    #: --cpus: benchmark.cpus (a count, or a list such as "0-3,8")
    cpus: int | str | None = None
    #: KernMLOps' `collect data -d`: its benchmark folder, as its config's benchmark_dir
    benchmark_dir: Path | str | None = None

    def paths(self) -> dict[str, Any]:
        """``{"section.key": value}`` of every flag that is set."""
        paths: dict[str, Any] = {
            "benchmark.duration_s": self.duration_s,
            "collector.output_dir": str(self.output_dir) if self.output_dir else None,
            "benchmark.name": "command" if self.argv is not None else self.benchmark,
            "benchmark.command.argv": list(self.argv) if self.argv is not None else None,
            "collector.hooks": self.hooks,
            "collector.tgid": self.tgid,
            "collector.filter": self.filter,
            "collector.strict": self.strict,
            "collector.progress": self.progress,
            "collector.export": self.export,
            "collector.export_grace_s": self.export_grace_s,
            "collector.export_web_config": self.export_web_config,
            "benchmark.as_user": self.as_user,
            "collector.poll_interval_ms": self.poll_interval_ms,
            "benchmark.cpus": self.cpus,
        }
        if self.no_hooks:
            paths["collector.hooks"] = []
        if self.benchmark_dir is not None:
            from kernmlops.config_kernmlops import benchmark_dir_keys

            paths.update(benchmark_dir_keys(self.benchmark_dir))
        return {k: v for k, v in paths.items() if v is not None}


def _set_path(data: dict[str, Any], dotted: str, value: Any, source: str | None = None) -> None:
    node = data
    *parents, last = dotted.split(".")
    for i, part in enumerate(parents):
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            if _model_at(tuple(parents[: i + 1])) is not None:
                # a section the file (or dict) gave as a scalar or list: its fault, not the flag's
                where = f" in {source}" if source else ""
                section = ".".join(parents[: i + 1])
                raise ConfigError(
                    f"invalid configuration{where}: {section}: expected a mapping of keys "
                    f"(got {_shown(nxt)})"
                )
            raise ConfigError(f"{dotted}: {part} is not a section")
        node = nxt
    node[last] = value


def read_overrides(
    path: str | Path, on_empty: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The overrides file's mapping; a hostile file (huge, binary, an alias bomb)
    is refused before it costs anything (kernmlops.yamlfile). ``on_empty``: called
    with its name where it holds no YAML at all (see load_config)."""
    from kernmlops.yamlfile import safe_yaml  # PyYAML only when there is a file

    path = Path(path)
    data = safe_yaml(path, what="config", dash_is_stdin=True)
    if data is None:
        if on_empty is not None:
            on_empty(_shown_path(path))
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{_shown_path(path)}: the top level must be a mapping of sections")
    if not_a_config(data):  # e.g. -c /etc/shadow: its lines are not echoed as keys
        raise ConfigError(
            f"{_shown_path(path)} is not a kernmlops configuration: no key of its top level "
            "looks like one (its lines are not shown)"
        )
    return data


def _shown_path(path: str | Path) -> str:
    """How errors name the overrides file: ``-`` (``-c -``) is stdin."""
    return "stdin" if str(path) == "-" else str(path)


def load_config(
    overrides: str | Path | dict[str, Any] | None = None,
    flags: Flags | Mapping[str, Any] | None = None,
    on_empty: Callable[[str], None] | None = None,
) -> Config:
    """Defaults, then the overrides file (or dict), then flags (:class:`Flags`, or
    ``{"a.b": value}``). ``on_empty``: called with the file's name where it holds no
    YAML (empty, comments only, a FIFO nothing was written to): the defaults stand,
    which a user who meant to change them should hear (``{}`` says so on purpose).

    The file may be in KernMLOps' form (``benchmark_config`` / ``collector_config``):
    it is mapped onto ours first (kernmlops.config_kernmlops), and its errors name
    its own keys."""
    from kernmlops import config_kernmlops

    source = None
    if isinstance(overrides, (str, Path)):
        source = _shown_path(overrides)
        data = read_overrides(overrides, on_empty)
    else:
        data = copy.deepcopy(overrides or {})  # flags must not change the caller's dict
    renames: dict[str, str] = {}
    if config_kernmlops.is_kernmlops(data, source):
        data, renames = config_kernmlops.translate(data, source)
    set_by_flags: set[tuple[str, ...]] = set()
    by_path = flags.paths() if isinstance(flags, Flags) else (flags or {})
    for dotted, value in by_path.items():
        if value is not None:
            _set_path(data, dotted, value, source)
            set_by_flags.add(tuple(dotted.split(".")))
    no_hooks = isinstance(flags, Flags) and flags.no_hooks
    try:
        return Config.model_validate(data, context={NO_HOOKS: no_hooks})
    except ValidationError as err:
        raise ConfigError(format_errors(err, source, frozenset(set_by_flags), renames)) from None


# --- defaults.yaml ---------------------------------------------------------------
def _emit(model: BaseModel, indent: int, out: list[str]) -> None:
    import yaml

    pad = "  " * indent
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if field.description:
            out.append(f"{pad}# {field.description}")
        if isinstance(value, BaseModel):
            if type(value).model_fields:
                out.append(f"{pad}{name}:")
                _emit(value, indent + 1, out)
            else:
                out.append(f"{pad}{name}: {{}}")
            continue
        plain = model.model_dump(mode="json", include={name})[name]
        text = yaml.safe_dump(plain, default_flow_style=True, width=1000)
        dumped = f"{name}: {text.removesuffix(chr(10)).removesuffix('...').strip()}"
        out.append(pad + dumped)


def every_section() -> Config:
    """The defaults with every hook's and every benchmark's subsection spelled out
    (every plug-in is imported)."""
    return Config.model_validate(
        {
            "hooks": {key: {} for key in HooksConfig.plugin_keys()},
            "benchmark": {key: {} for key in BenchmarkConfig.plugin_keys()},
        }
    )


def defaults_yaml() -> str:
    """The full default configuration, with each key's description as a comment."""
    out = ["# kernmlops defaults: generated by `kernmlops defaults`; do not edit.", ""]
    _emit(every_section(), 0, out)
    return "\n".join(out) + "\n"
