"""linux-build: compile a real Linux tree (KernMLOps' linux_build).

The tree is Debian's ``linux-source-6.1`` (``/usr/src/linux-source-6.1.tar.xz``,
unpacked once into ``~/.cache/kernmlops/``) or any tree named by ``source_dir``. setup()
makes the configuration (``config``: defconfig, tinyconfig, ...) in a build folder
(``make O=...``), before the probes attach; the benchmark is ``make -j<jobs> <targets>``.
Results: the build time and how many files were compiled (kbuild's ``CC`` lines).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from kernmlops.benchmarks._tools import require_tool
from kernmlops.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkRun,
    Launch,
    result_frame,
)
from kernmlops.errors import BenchmarkError
from kernmlops.host.cpus import online_cpu_count
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")

DEBIAN_SOURCE = Path("/usr/src/linux-source-6.1.tar.xz")
CACHE = Path.home() / ".cache" / "kernmlops"
INSTALL = "apt-get install linux-source-6.1 make gcc flex bison bc libelf-dev libssl-dev"
#: kbuild's line for a kernel object compiled from C ("  CC [M]  fs/ext4/inode.o")
_COMPILED = re.compile(r"^\s+CC(?: \[M\])?\s+(\S+)$", re.MULTILINE)


class LinuxBuildOptions(BenchmarkOptions):
    source_dir: str | None = Field(
        None,
        description="a Linux source tree; null: Debian's linux-source-6.1, unpacked "
        "once into ~/.cache/kernmlops/linux-source-6.1",
    )
    build_dir: str | None = Field(
        None,
        description="the build folder (make O=); null: a fresh one per run, removed "
        "after (a full build); a folder: kept, so a run builds what changed",
    )
    config: str | None = Field(
        "defconfig",
        pattern=r"^[a-z0-9_]+config$",
        description="make target that writes .config before the run (defconfig, "
        "tinyconfig, allnoconfig, ...); null: the build folder's .config as it is",
    )
    targets: list[str] = Field(
        default_factory=list,
        description="make targets (e.g. [vmlinux] or [lib/]); []: make's default (all)",
    )
    jobs: int | None = Field(
        None, ge=1, le=4096, description="make -j; null: the CPUs the benchmark may use"
    )
    clean: bool = Field(False, description="make clean in build_dir before the run")


class LinuxBuildBenchmark(Benchmark[LinuxBuildOptions]):
    """make a Linux kernel (or part of one) with -j jobs."""

    name: ClassVar[str] = "linux-build"
    default_filter: ClassVar[str] = "tree"

    def __init__(self, options: LinuxBuildOptions | BenchmarkOptions | None = None) -> None:
        super().__init__(options)
        self.build_dir: Path | None = None

    @property
    def source_dir(self) -> Path:
        if self.options.source_dir:
            return Path(self.options.source_dir).expanduser()
        return CACHE / DEBIAN_SOURCE.name.removesuffix(".tar.xz")

    def check(self) -> None:
        for tool in ("make", "gcc", "flex", "bison", "bc"):
            require_tool("linux-build", tool, INSTALL)
        if self.options.source_dir:
            if not (self.source_dir / "Makefile").is_file():
                raise BenchmarkError(
                    f"linux-build: {self.source_dir} is not a Linux source tree (no Makefile)"
                )
        elif not (self.source_dir / "Makefile").is_file() and not DEBIAN_SOURCE.is_file():
            raise BenchmarkError(f"linux-build: no {DEBIAN_SOURCE}; install it: {INSTALL}")

    def jobs(self) -> int:
        if self.options.jobs is not None:
            return self.options.jobs
        env = self.environment
        if env is not None and env.cpus:
            return len(env.cpus)
        return online_cpu_count()

    def setup(self, workdir: Path) -> None:
        if not (self.source_dir / "Makefile").is_file():
            unpack_debian_source(self.source_dir)
        if self.options.build_dir:
            self.build_dir = Path(self.options.build_dir).expanduser()
        else:
            self.build_dir = workdir / "build"
        self.build_dir.mkdir(parents=True, exist_ok=True)
        steps = (["clean"] if self.options.clean else []) + (
            [self.options.config] if self.options.config else []
        )
        for step in steps:
            self._make(step)

    def _make(self, target: str) -> None:
        out = subprocess.run(
            ["make", "-s", "-C", str(self.source_dir), f"O={self.build_dir}", target],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
            raise BenchmarkError(f"linux-build: make {target} failed: {tail}")

    def launch(self) -> Launch | None:
        build = self.build_dir or Path("build")
        argv = ["make", "-C", str(self.source_dir), f"O={build}", f"-j{self.jobs()}",
                *self.options.targets]  # fmt: skip
        return Launch(argv=argv, capture_output=True)

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        rows: list[tuple[str, str, float, str]] = [("build", "jobs", float(self.jobs()), "1")]
        # a build stopped (-d, Ctrl+C: make exits 143) or failed took no build's time
        if run.exit_code == 0 and run.started_us is not None and run.ended_us is not None:
            rows.append(("build", "build_time_s", (run.ended_us - run.started_us) / 1e6, "s"))
        if run.stdout_path is not None:
            text = run.stdout_path.read_text(errors="replace")
            rows.append(("build", "compiled_files", float(len(compiled_files(text))), "1"))
        return result_frame(rows)


def compiled_files(kbuild_output: str) -> list[str]:
    """The kernel objects kbuild says it compiled from C (its ``CC`` lines; host tools,
    assembly and links are not counted)."""
    return _COMPILED.findall(kbuild_output)


def unpack_debian_source(dest: Path) -> None:
    """Unpack Debian's linux-source tarball as ``dest`` (once: into a temporary folder
    beside it, then renamed, so an interrupted unpack is never taken for a tree)."""
    if not DEBIAN_SOURCE.is_file():
        raise BenchmarkError(f"linux-build: no {DEBIAN_SOURCE}; install it: {INSTALL}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        require_tool("linux-build", "tar", "apt-get install tar xz-utils")
        subprocess.run(["tar", "-xJf", str(DEBIAN_SOURCE), "-C", str(tmp)], check=True,
                       capture_output=True)  # fmt: skip
        inner = tmp / dest.name
        if not (inner / "Makefile").is_file():
            raise BenchmarkError(f"linux-build: {DEBIAN_SOURCE} holds no {dest.name}/Makefile")
        inner.rename(dest)
    except subprocess.CalledProcessError as err:
        raise BenchmarkError(
            f"linux-build: cannot unpack {DEBIAN_SOURCE}: {err.stderr.decode(errors='replace')}"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
