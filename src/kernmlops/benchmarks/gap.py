"""The GAP benchmark suite (gapbs): graph kernels on a generated Kronecker graph.

GAP is not vendored: ``make setup-gap`` clones and builds it, or
``benchmark.gap.source_dir`` points at a built copy. The graph is generated
once per (scale, degree, weighted) by GAP's ``converter`` into a cache folder
and read back (``-f``) by every later run, so a collection traces the kernel,
not the graph generator.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from kernmlops.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkRun,
    Launch,
    result_frame,
)
from kernmlops.errors import BenchmarkError
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")


GAP_REPO = "https://github.com/sbeamer/gapbs"
#: Where `make setup-gap` builds GAP (keep in step with the Makefile's GAP_DIR).
DEFAULT_SOURCE_DIR = Path("~/.cache/kernmlops/gapbs")
DEFAULT_GRAPH_DIR = Path("~/.cache/kernmlops/gap-graphs")
CONVERTER = "converter"

Kernel = Literal["pr", "bfs", "cc", "bc", "sssp", "tc"]
#: sssp needs edge weights: its graph is the weighted serialized form (.wsg).
WEIGHTED_KERNELS = frozenset({"sssp"})

#: said to an installed wheel's user too: commands of their own, not the checkout's
#: Makefile (`make setup-gap` runs the same two)
_ELSEWHERE = "or build GAP elsewhere and set benchmark.gap.source_dir to its folder"


def _how_to_get(src: Path) -> str:
    q = shlex.quote(str(src))
    return (
        f"clone and build it there (needs git, g++ and make): `git clone --depth 1 "
        f"{GAP_REPO} {q} && make -C {q} -j`, {_ELSEWHERE}"
    )


@dataclass
class GapOutput:
    """What one GAP kernel run printed."""

    trials: list[float] = field(default_factory=list)
    average: float | None = None
    #: other "<Label> Time:" lines by label: Read, Build, Generate, Relabel, ...
    times: dict[str, float] = field(default_factory=dict)
    #: one per trial when run with -v
    verified: list[bool] = field(default_factory=list)
    nodes: int | None = None
    edges: int | None = None
    directed: bool | None = None


# GAP prints "%-21s%3.5lf": a label with a colon padded to 21 columns, then seconds.
_TIME = re.compile(r"^\s*(?P<label>[A-Za-z][A-Za-z ]*?) Time:\s+(?P<s>[-+0-9.eE]+|nan|inf)\s*$")
_GRAPH = re.compile(
    r"Graph has (?P<nodes>\d+) nodes and (?P<edges>\d+) (?P<kind>un)?directed edges"
)
_VERIFY = re.compile(r"^\s*Verification:\s+(?P<v>PASS|FAIL)\s*$")


def parse_gap_output(text: str) -> GapOutput:
    """Parse a GAP kernel's stdout (lines it does not know are ignored)."""
    out = GapOutput()
    for line in text.splitlines():
        if m := _TIME.match(line):
            label, seconds = m["label"].strip(), float(m["s"])
            if label == "Trial":
                out.trials.append(seconds)
            elif label == "Average":
                out.average = seconds
            elif label == "Verification":
                continue  # time spent checking, not running the kernel
            else:
                out.times[label] = seconds
        elif m := _GRAPH.search(line):
            out.nodes, out.edges = int(m["nodes"]), int(m["edges"])
            out.directed = m["kind"] is None
        elif m := _VERIFY.match(line):
            out.verified.append(m["v"] == "PASS")
    return out


def gap_result_rows(out: GapOutput) -> list[tuple[str, str, float, str]]:
    """``benchmark_result`` rows: trial_N/seconds, average/seconds, read/seconds, graph/..."""
    rows: list[tuple[str, str, float, str]] = [
        (f"trial_{i}", "seconds", s, "s") for i, s in enumerate(out.trials, 1)
    ]
    rows += [(f"trial_{i}", "verified", float(ok), "bool") for i, ok in enumerate(out.verified, 1)]
    if out.average is not None:
        rows.append(("average", "seconds", out.average, "s"))
    rows += [(label.lower().replace(" ", "_"), "seconds", s, "s") for label, s in out.times.items()]
    if out.nodes is not None and out.edges is not None:
        rows += [("graph", "nodes", float(out.nodes), "count"),
                 ("graph", "edges", float(out.edges), "count")]  # fmt: skip
    return rows


class GapOptions(BenchmarkOptions):
    source_dir: str | None = Field(
        None,
        description="folder of a built GAP (gapbs) copy; null: where `make setup-gap` "
        "puts it (~/.cache/kernmlops/gapbs)",
    )
    kernel: Kernel = Field("bfs", description="GAP kernel: pr, bfs, cc, bc, sssp or tc")
    scale: int = Field(
        20, ge=1, le=32, description="Kronecker graph of 2^scale vertices (GAP's -g)"
    )
    degree: int = Field(16, ge=1, le=1024, description="average degree (GAP's -k)")
    trials: int = Field(3, ge=1, description="times the kernel runs (GAP's -n)")
    threads: int = Field(
        0, ge=0, description="OpenMP threads (OMP_NUM_THREADS); 0 = OpenMP's default"
    )
    verify: bool = Field(False, description="check each trial's result (GAP's -v)")
    graph_dir: str | None = Field(
        None,
        description="where generated graphs are kept and reused; "
        "null: ~/.cache/kernmlops/gap-graphs",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="more kernel arguments, appended as given"
    )


class GapBenchmark(Benchmark[GapOptions]):
    """One GAP kernel, ``trials`` times, on a cached Kronecker graph."""

    name: ClassVar[str] = "gap"
    default_filter: ClassVar[str] = "tree"

    # -- paths ----------------------------------------------------------------
    @property
    def source_dir(self) -> Path:
        given = self.options.source_dir
        return (Path(given) if given else DEFAULT_SOURCE_DIR).expanduser().absolute()

    @property
    def graph_dir(self) -> Path:
        given = self.options.graph_dir
        return (Path(given) if given else DEFAULT_GRAPH_DIR).expanduser().absolute()

    @property
    def weighted(self) -> bool:
        return self.options.kernel in WEIGHTED_KERNELS

    @property
    def graph_path(self) -> Path:
        """The cached graph this run reads: one file per scale, degree and weighting."""
        suffix = "wsg" if self.weighted else "sg"
        return self.graph_dir / f"kron-g{self.options.scale}-k{self.options.degree}.{suffix}"

    def program(self, name: str) -> Path:
        return self.source_dir / name

    # -- lifecycle --------------------------------------------------------------
    def check(self) -> None:
        src = self.source_dir
        if not src.is_dir():
            raise BenchmarkError(
                f"gap: the GAP benchmark suite was not found in {src}; {_how_to_get(src)}"
            )
        needed = [self.options.kernel]
        if not self.graph_path.is_file():
            needed.append(CONVERTER)  # only to generate the graph the first time
        for name in needed:
            prog = self.program(name)
            if not (prog.is_file() and os.access(prog, os.X_OK)):
                raise BenchmarkError(
                    f"gap: {src} has no built {name!r} program; build it with "
                    f"`make -C {shlex.quote(str(src))}`, {_ELSEWHERE}"
                )

    def converter_argv(self, out: Path) -> list[str]:
        """GAP's converter writing the serialized kron graph (weighted for sssp) to ``out``."""
        argv = [str(self.program(CONVERTER)), "-g", str(self.options.scale),
                "-k", str(self.options.degree)]  # fmt: skip
        if self.weighted:
            argv.append("-w")
        return [*argv, "-b", str(out)]

    def ensure_graph(self) -> bool:
        """Generate the graph unless it is cached; True when it was generated now."""
        target = self.graph_path
        if target.is_file():
            return False
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise BenchmarkError(
                f"gap: cannot create the graph folder {target.parent}: {err.strerror}; "
                "set benchmark.gap.graph_dir to a writable folder"
            ) from err
        # GAP's reader picks the format by suffix, so the partial file keeps it;
        # the rename makes a half-written graph impossible to reuse.
        partial = target.with_name(f".{target.stem}.{os.getpid()}.partial{target.suffix}")
        print(
            f"gap: generating the kron graph (scale {self.options.scale}, degree "
            f"{self.options.degree}) once into {target}; later runs reuse it",
            file=sys.stderr,
        )
        try:
            done = subprocess.run(
                self.converter_argv(partial), capture_output=True, text=True, check=False
            )
            if done.returncode != 0 or not partial.is_file():
                tail = (done.stderr or done.stdout).strip()[-500:]
                raise BenchmarkError(
                    f"gap: the converter failed (exit {done.returncode}) generating "
                    f"{target.name}: {tail or 'no output'}"
                )
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return True

    def setup(self, workdir: Path) -> None:
        self.ensure_graph()

    def launch(self) -> Launch | None:
        argv = [str(self.program(self.options.kernel)), "-f", str(self.graph_path),
                "-n", str(self.options.trials)]  # fmt: skip
        if self.options.verify:
            argv.append("-v")
        env = {"OMP_NUM_THREADS": str(self.options.threads)} if self.options.threads else {}
        return Launch(argv=[*argv, *self.options.extra_args], env=env, capture_output=True)

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        if run.stdout_path is None:
            return None
        rows = gap_result_rows(parse_gap_output(run.stdout_path.read_text(errors="replace")))
        return result_frame(rows) if rows else None

    def describe(self) -> str:
        launch = self.launch()
        assert launch is not None
        return shlex.join(launch.argv)
