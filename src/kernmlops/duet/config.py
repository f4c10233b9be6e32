"""Duet configuration: the asynchronous-duet ``duet.yml`` form, validated.

A file has one ``duetbench:`` section and one section per duet::

    duetbench:
      suite: loops
      seed: 42
      duet_repetitions: 10          # A and B at the same time
      sequential_repetitions: 5     # A alone, then B alone (≥ 5 runs for a verdict)
      syncduet_repetitions: 0       # A and B with a barrier before each iteration
      schedule: randomized_interleaving_trials   # or: sequential
      timeout: 120                  # seconds per trial (0 or missing: none)
      artifacts: {gcc: gcc --version}   # more than the built-in ones
      run_base: ./loop              # prefix of every side's `run`
      results: [out.csv]            # files each side leaves (relative to its folder)
      duets: [small]

    small:
      harness: {budget_s: 2}        # time each iteration of `run` (built-in harness)
      A: {run: "20000000"}
      B: {run: "22000000"}          # missing B: an A/A duet (A against itself)

Keys are inherited: a side (A/B) overrides its duet section, which overrides
``duetbench``. A key set to null is not inherited but switched off there: its
default (``harness: null`` in a duet runs its sides without the suite's
harness; ``image``, ``timeout``, ``run_base``: none; ``env: null`` drops the
variables of the sections above; ``cpus``, ``nice``: auto). Unknown keys are
errors that name their path.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kernmlops.errors import ConfigError
from kernmlops.host.cpus import format_cpu_list, parse_cpu_list
from kernmlops.validation import key_path, keys_at, not_a_config, problems, unknown_key
from kernmlops.yamlfile import safe_yaml

#: Artifacts always captured once per suite (name -> what is recorded).
BUILTIN_ARTIFACTS = ("uname", "lscpu", "meminfo", "hostname", "date")
#: how often (ms) pinned sides trade CPU lists in a duet trial: a CPU that is slower
#: for a while (another task, the host) then costs both sides alike (`python -m bench duet`)
DEFAULT_CPU_SWAP_MS = 10.0
#: nice value of the sides by default (as root): each side is a session of its own,
#: so this is also its scheduling group's weight against other sessions (14b)
DEFAULT_NICE = -10
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HarnessOptions(_Strict):
    """Wrap ``run`` in the built-in harness: it times each execution of the command."""

    iterations: int | None = Field(None, ge=1, description="run the command this many times")
    budget_s: float | None = Field(
        None, gt=0, description="run the command until this many seconds have passed"
    )
    output: str = Field("harness.csv", description="where the harness writes (.csv or .jsonl)")

    @field_validator("output")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not value.endswith((".csv", ".jsonl", ".json")) or "/" in value:
            raise ValueError("a file name ending in .csv, .jsonl or .json")
        return value

    @model_validator(mode="after")
    def _some_limit(self) -> HarnessOptions:
        if self.iterations is None and self.budget_s is None:
            raise ValueError("give iterations, budget_s or both")
        return self


class _SideKeys(_Strict):
    """Keys a side may set (and its duet section and duetbench, for inheritance)."""

    run: str | None = Field(None, description="the command (appended to run_base)")
    image: str | None = Field(None, description="container image: run in docker/podman")
    results: list[str] | None = Field(None, description="result files the side leaves")
    run_base: str | None = Field(None, description="prefix of run")
    syncduet_run_base: str | None = Field(
        None, description="prefix of run in sync-duet trials (the side speaks the sync protocol)"
    )
    harness: HarnessOptions | None = Field(
        None, description="time run with the built-in harness (null: none, not inherited)"
    )
    env: dict[str, str] | None = Field(None, description="extra environment variables")

    @field_validator("results", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class SideSection(_SideKeys):
    pass


class _DuetKeys(_SideKeys):
    suite: str | None = None
    remove_containers: bool | None = None
    duet_repetitions: int | None = Field(None, ge=0)
    sequential_repetitions: int | None = Field(None, ge=0)
    syncduet_repetitions: int | None = Field(None, ge=0)
    timeout: float | None = Field(None, ge=0, description="seconds per trial; 0: none")
    cpus: list[str] | Literal["auto", "none"] | None = Field(
        None,
        description='two CPU lists ("0", "2-3,6"): the first side of a trial runs on the '
        "first, the other on the second (AB/BA orders swap them); auto (the default): two "
        "halves of the CPUs the runner may use, traded every cpu_swap_ms, the sides left "
        "unpinned where no cpuset can be made; none: the scheduler places the sides",
    )
    nice: int | Literal["auto"] | None = Field(
        None,
        description="nice value of both sides and of their sessions' scheduling groups "
        f"(autogroups; below 0 needs root): other work on the machine then takes less of "
        f"their CPUs; auto (the default): {DEFAULT_NICE} when the runner is root, else "
        "the runner's own; 0: as any other session",
    )
    cpu_swap_ms: float | None = Field(
        None,
        ge=0,
        description="with cpus: the two sides trade CPU lists every this many ms while a "
        f"duet or sync-duet trial runs (default {DEFAULT_CPU_SWAP_MS:g}; 0: never, each side "
        "keeps its list for the whole trial)",
    )

    @field_validator("nice", mode="before")
    @classmethod
    def _nice_value(cls, value: Any) -> Any:
        if value is None or value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not -20 <= value <= 19:
            raise ValueError(f"a nice value from -20 to 19, or auto (got {value})")
        return value

    @field_validator("cpus")
    @classmethod
    def _two_lists(
        cls, value: list[str] | Literal["auto", "none"] | None
    ) -> list[str] | Literal["auto", "none"] | None:
        if value is None or isinstance(value, str):
            return value
        if len(value) != 2:
            raise ValueError("two CPU lists, one per side, e.g. ['0', '1']")
        sets = [parse_cpus(v) for v in value]
        if sets[0] & sets[1]:
            raise ValueError("the two CPU lists overlap")
        return value


class DuetSection(_DuetKeys):
    A: SideSection
    B: SideSection | None = None


class DuetBenchSection(_DuetKeys):
    name: str | None = Field(None, description="the suite's name (same as suite)")
    verbose: bool = False
    seed: int | None = Field(None, description="seed of the randomized schedule")
    docker_command: str | None = Field(None, description="container engine: docker or podman")
    engine: str | None = Field(None, description="container engine (same as docker_command)")
    schedule: Literal["sequential", "randomized_interleaving_trials"] = "sequential"
    artifacts: dict[str, str] | list[str] = Field(
        default_factory=dict, description="name: command, captured once per suite"
    )
    duets: list[str] = Field(..., min_length=1, description="the duets to run, in order")

    @field_validator("duets")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        seen = set()
        for name in value:
            if name in seen:
                raise ValueError(f"duet {name!r} is listed twice")
            if name == "duetbench":
                raise ValueError("'duetbench' cannot be a duet name")
            seen.add(name)
        return value

    @field_validator("artifacts")
    @classmethod
    def _artifact_names(cls, value: dict[str, str] | list[str]) -> dict[str, str]:
        if isinstance(value, list):  # bare commands: named by their program
            value = {cmd.split()[0].rsplit("/", 1)[-1] if cmd.split() else "": cmd for cmd in value}
        for name in value:
            if not _NAME.match(name):
                raise ValueError(f"artifact name {name!r}: letters, digits, _ . + -")
        return value


# --- resolved -------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """One side of a duet, with every inherited key resolved."""

    pair: str  # "A" or "B"
    command: str  # run_base + run
    sync_command: str | None  # syncduet_run_base + run, if given
    image: str | None
    results: tuple[str, ...]
    harness: HarnessOptions | None
    env: dict[str, str]


@dataclass(frozen=True)
class Duet:
    name: str
    suite: str
    a: Side
    b: Side
    aa: bool  # B is A (no B section)
    duet_repetitions: int
    sequential_repetitions: int
    syncduet_repetitions: int
    timeout_s: float | None
    cpus: tuple[frozenset[int], frozenset[int]] | None
    remove_containers: bool
    #: seconds between CPU-list trades in duet trials (None: the sides keep theirs)
    cpu_swap_s: float | None = None
    #: cpus: auto: only duet and sync-duet trials are pinned, and only where the
    #: runner can make cpusets (trading CPUs), else the sides are not pinned
    cpus_auto: bool = False
    #: both sides' nice value (None: the runner's own)
    nice: int | None = None

    def side(self, pair: str) -> Side:
        return self.a if pair == "A" else self.b


@dataclass(frozen=True)
class DuetSuite:
    """A whole validated config file."""

    suite: str
    source: str | None
    seed: int | None
    schedule: str
    engine: str
    artifacts: dict[str, str]
    duets: tuple[Duet, ...]
    verbose: bool
    raw: dict[str, Any]

    @property
    def uses_containers(self) -> bool:
        return any(d.a.image or d.b.image for d in self.duets)


def _nice(value: int | str) -> int | None:
    """``nice: auto``: DEFAULT_NICE as root (it needs root), else the runner's own."""
    if value == "auto":
        return DEFAULT_NICE if os.geteuid() == 0 else None
    return int(value)


def auto_cpus() -> list[str] | None:
    """``cpus: auto``: the CPUs this process may use, in two equal halves (an odd one
    out is left to the runner); None with fewer than two."""
    have = sorted(os.sched_getaffinity(0))
    half = len(have) // 2
    if not half:
        return None
    return [format_cpu_list(have[:half]), format_cpu_list(have[half : 2 * half])]


def parse_cpus(text: str) -> frozenset[int]:
    """``"0-2,5"`` -> {0, 1, 2, 5}, in the kernel's own notation."""
    cpus = parse_cpu_list(str(text).replace(" ", ""))
    if not cpus:
        raise ValueError(f"bad CPU list {text!r} (e.g. '0', '0-3', '0,2')")
    return frozenset(cpus)


# --- errors ---------------------------------------------------------------------
def _describe(err: dict[str, Any], prefix: tuple[str, ...], model: type[BaseModel]) -> str:
    loc = tuple(str(p) for p in err["loc"])
    path = key_path((*prefix, *loc)) or "(top level)"
    if err["type"] == "extra_forbidden":
        unknown = unknown_key(loc[-1], keys_at(model, loc[:-1]), prefix=(*prefix, *loc[:-1]))
        return f"{path}: {unknown}"
    got = err.get("input")
    msg = err["msg"].removeprefix("Value error, ")
    shown = "" if isinstance(got, dict) or got is None or f"got {got}" in msg else f" (got {got!r})"
    return f"{path}: {msg}{shown}"


# --- loading --------------------------------------------------------------------
def _inherit(key: str, *layers: BaseModel | None, default: Any = None) -> Any:
    """``key`` from the first layer (side, duet, duetbench) that sets it. A null set
    explicitly ends the search with the key's default: ``harness: null`` in a duet
    runs its sides without the suite's harness, ``image: null`` runs them here (the
    original tool's inheritance also takes a null it finds as the value)."""
    for layer in layers:
        if layer is not None and key in layer.model_fields_set:
            value = getattr(layer, key)
            return default if value is None else value
    return default


def _join(base: str | None, run: str | None) -> str | None:
    parts = [p for p in (base, run) if p]
    return " ".join(parts) if parts else None


def _side(pair: str, sec: SideSection, duet: DuetSection, bench: DuetBenchSection) -> Side:
    layers = (sec, duet, bench)
    run = _inherit("run", *layers)
    harness = _inherit("harness", *layers)
    results = list(_inherit("results", *layers, default=[]))
    if harness is not None and harness.output not in results:
        results.append(harness.output)
    sync_base = _inherit("syncduet_run_base", *layers)
    env: dict[str, str] = {}
    merged: list[BaseModel] = []
    for layer in layers:  # a layer's env: null drops the layers' above it
        if "env" in layer.model_fields_set and getattr(layer, "env", None) is None:
            break
        merged.append(layer)
    for layer in reversed(merged):
        env.update(getattr(layer, "env", None) or {})
    return Side(
        pair=pair,
        command=_join(_inherit("run_base", *layers), run) or "",
        sync_command=_join(sync_base, run) if sync_base else None,
        image=_inherit("image", *layers),
        results=tuple(results),
        harness=harness,
        env=env,
    )


def validate_duet_config(data: Any, source: str | None = None) -> DuetSuite:
    """Validate a parsed ``duet.yml``; raise ConfigError naming every bad key."""
    where = f" in {source}" if source else ""
    if data is None:  # an empty file, comments only, or a FIFO nothing was written to
        raise ConfigError(f"invalid duet configuration{where}: it is empty (no suite, no duet)")
    if not isinstance(data, dict):
        raise ConfigError(f"invalid duet configuration{where}: the top level must be a mapping")
    errors: list[str] = []
    if not_a_config(data):  # e.g. /etc/shadow: its lines are not echoed as sections
        raise ConfigError(
            f"invalid duet configuration{where}: not a duet configuration (no key of its top "
            "level looks like one; its lines are not shown)"
        )
    if "duetbench" not in data:
        raise ConfigError(
            f"invalid duet configuration{where}: duetbench: missing section (suite, duets, ...)"
        )
    bench: DuetBenchSection | None = None
    try:
        bench = DuetBenchSection.model_validate(data["duetbench"] or {})
    except ValidationError as err:
        errors += [_describe(e, ("duetbench",), DuetBenchSection) for e in err.errors()]
    sections: dict[str, DuetSection] = {}
    raw_duets = (
        (data["duetbench"] or {}).get("duets") if isinstance(data["duetbench"], dict) else None
    )
    listed = {str(n) for n in raw_duets} if isinstance(raw_duets, list) else set()
    for key, value in data.items():
        # Sections no duet lists (YAML anchor blocks, notes) are not ours to
        # judge: the original tool ignores them too.
        if key == "duetbench" or key not in listed:
            continue
        if not isinstance(value, dict):
            errors.append(f"{key}: expected a duet section (a mapping with A and optional B)")
            continue
        try:
            sections[key] = DuetSection.model_validate(value)
        except ValidationError as err:
            errors += [_describe(e, (str(key),), DuetSection) for e in err.errors()]
    if bench is not None:
        for name in bench.duets:
            if name not in data:
                near = difflib.get_close_matches(name, [k for k in data if k != "duetbench"], n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                errors.append(f"duetbench.duets: no section for duet {name!r}{hint}")
        own = all(isinstance(data.get(n), dict) and data[n].get("suite") for n in bench.duets)
        if bench.suite is None and bench.name is None and not own:
            errors.append("duetbench.name: required (the suite's name; or give suite)")
    if errors or bench is None:
        raise ConfigError(problems(f"invalid duet configuration{where}", errors))
    # The run's folder is named by the suite (or the config's name); a duet's
    # own suite names its result files and its rows, as in the original.
    suite = bench.suite or bench.name or (Path(source).name.split(".")[0] if source else "duet")
    duets = []
    for name in bench.duets:
        sec = sections[name]
        a = _side("A", sec.A, sec, bench)
        b = _side("B", sec.B, sec, bench) if sec.B is not None else _side("B", sec.A, sec, bench)
        layers = (sec, bench)
        cpu_lists = _inherit("cpus", *layers, default="auto")
        auto = cpu_lists == "auto"
        if auto:
            cpu_lists = auto_cpus()
        elif cpu_lists == "none":
            cpu_lists = None
        swap_ms = _inherit("cpu_swap_ms", *layers, default=DEFAULT_CPU_SWAP_MS)
        duet = Duet(
            name=name,
            suite=_inherit("suite", sec, default=suite),
            a=a,
            b=b,
            aa=sec.B is None,
            duet_repetitions=_inherit("duet_repetitions", *layers, default=1),
            sequential_repetitions=_inherit("sequential_repetitions", *layers, default=0),
            syncduet_repetitions=_inherit("syncduet_repetitions", *layers, default=0),
            timeout_s=_inherit("timeout", *layers, default=0) or None,
            cpus=tuple(parse_cpus(c) for c in cpu_lists) if cpu_lists else None,  # type: ignore[misc]
            remove_containers=_inherit("remove_containers", *layers, default=True),
            cpu_swap_s=swap_ms / 1000 if cpu_lists and swap_ms else None,
            cpus_auto=auto and bool(cpu_lists),
            nice=_nice(_inherit("nice", *layers, default="auto")),
        )
        errors += _check_duet(duet)
        duets.append(duet)
    if errors:
        raise ConfigError(problems(f"invalid duet configuration{where}", errors))
    engine = bench.engine or bench.docker_command or "docker"
    return DuetSuite(
        suite=suite,
        source=source,
        seed=bench.seed,
        schedule=bench.schedule,
        engine=engine,
        artifacts=dict(bench.artifacts),  # type: ignore[arg-type]
        duets=tuple(duets),
        verbose=bench.verbose,
        raw=data,
    )


def _check_duet(duet: Duet) -> list[str]:
    errors = []
    # an A/A duet's B is A's section again: its mistakes are A's, said once
    for side in (duet.a,) if duet.aa else (duet.a, duet.b):
        where = f"{duet.name}.{side.pair}"
        if not side.command:
            # one mistake, one error: what it would measure is moot without a command
            errors.append(f"{where}.run: no command (set run, or run_base)")
            continue
        if not side.results:
            errors.append(
                f"{where}.results: no result files and no harness: nothing to measure "
                "(give results: [...] or harness: {iterations: N})"
            )
        if side.image and side.harness:
            errors.append(
                f"{where}.harness: the built-in harness runs local commands only, not in image "
                f"{side.image!r} (put a harness in the image and list its results instead)"
            )
        if duet.syncduet_repetitions and side.harness and side.sync_command:
            # sync-duet trials run syncduet_run_base + run in place of the harness, so
            # its file would be missing; the harness needs no base (it speaks the sync
            # protocol itself), and a base that is a harness of its own needs no harness
            errors.append(
                f"{where}: harness and syncduet_run_base are both set, but a sync-duet trial "
                "runs syncduet_run_base in place of the harness (the harness synchronizes by "
                "itself: drop syncduet_run_base, or set harness: null)"
            )
        elif duet.syncduet_repetitions and not (side.harness or side.sync_command):
            errors.append(
                f"{where}: syncduet_repetitions needs a side that speaks the sync protocol: "
                "harness: {...} or syncduet_run_base"
            )
    if duet.cpus is not None:
        have = os.sched_getaffinity(0)
        missing = sorted((duet.cpus[0] | duet.cpus[1]) - have)
        if missing:
            errors.append(
                f"{duet.name}.cpus: CPU(s) {missing} not available here (have {sorted(have)})"
            )
    if not (duet.duet_repetitions or duet.sequential_repetitions or duet.syncduet_repetitions):
        errors.append(f"{duet.name}: every *_repetitions is 0: nothing to run")
    return errors


def load_duet_config(path: str | Path) -> DuetSuite:
    path = Path(path)
    data = safe_yaml(path, what="duet config")
    return validate_duet_config(data, str(path))
