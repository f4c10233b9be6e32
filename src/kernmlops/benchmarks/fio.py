"""fio: sequential and random read/write profiles with direct I/O on a file,
a folder or a block device the user names.

The profiles run one after another (stonewalled) against the same target.
fio writes its JSON report to stdout, which the session captures and keeps in
the collection (benchmark_output/stdout.txt); iops, bandwidth and latency per
profile and direction become the benchmark_result table.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from kernmlops.benchmarks._tools import (
    MEMORY_FILESYSTEMS,
    device_in_use,
    filesystem_type,
    parse_size,
    require_tool,
)
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


FIO = "fio"
Profile = Literal["seqread", "seqwrite", "randread", "randwrite", "randrw"]
#: fio's rw= for each profile.
RW: dict[str, str] = {
    "seqread": "read",
    "seqwrite": "write",
    "randread": "randread",
    "randwrite": "randwrite",
    "randrw": "randrw",
}
WRITING = frozenset({"seqwrite", "randwrite", "randrw"})
#: Direct I/O needs sizes and offsets aligned to the logical block size.
SECTOR = 512
#: Where the default target file goes, first disk-backed one wins.
DEFAULT_DIRS = (tempfile.gettempdir(), "/var/tmp")


class FioOptions(BenchmarkOptions):
    profiles: list[Profile] = Field(
        ["randread"],
        min_length=1,
        description="profiles to run one after another: seqread, seqwrite, randread, "
        "randwrite, randrw",
    )
    target: str | None = Field(
        None,
        description="file, folder or block device to test; default: a file in a temporary "
        "folder on a disk-backed filesystem. Files made in a folder or by default are "
        "removed afterwards; a file you name is kept",
    )
    allow_write_device: bool = Field(
        False,
        description="let write profiles write to a block device target (destroys its data)",
    )
    allow_write_file: bool = Field(
        False,
        description="let fio overwrite a file target you name that already holds data: "
        "write profiles, or its lay-out of a file smaller than size (destroys its content)",
    )
    size: int | str = Field(
        "64M", description="bytes each profile covers (fio sizes: 4096, 4k, 64M, 1G)"
    )
    bs: int | str = Field("4k", description="block size of each I/O")
    iodepth: int = Field(16, ge=1, le=4096, description="I/Os in flight per job")
    numjobs: int = Field(1, ge=1, le=256, description="parallel jobs per profile")
    ioengine: Literal["libaio", "io_uring", "psync", "sync", "posixaio"] = Field(
        "libaio", description="fio I/O engine"
    )
    direct: bool = Field(True, description="O_DIRECT: bypass the page cache")
    runtime_s: float | None = Field(
        None, gt=0, description="longest run of each profile in seconds (null: until size)"
    )
    time_based: bool = Field(
        False, description="run each profile for runtime_s even when size is done"
    )
    rwmixread: int = Field(50, ge=0, le=100, description="randrw: percent of reads")
    extra_args: list[str] = Field(
        default_factory=list,
        description="more fio options for every profile, e.g. ['--fsync=1']",
    )

    @field_validator("size", "bs")
    @classmethod
    def _size(cls, value: int | str) -> int | str:
        if parse_size(value) <= 0:
            raise ValueError("must be more than 0 bytes")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> FioOptions:
        size, bs = parse_size(self.size), parse_size(self.bs)
        if size < bs:
            raise ValueError(f"size ({self.size}) is smaller than bs ({self.bs})")
        if self.direct and bs % SECTOR:
            raise ValueError(f"direct I/O needs bs a multiple of {SECTOR} (got {self.bs})")
        if self.time_based and self.runtime_s is None:
            raise ValueError("time_based needs runtime_s")
        if len(set(self.profiles)) != len(self.profiles):
            raise ValueError(f"a profile is named twice: {self.profiles}")
        return self


class FioBenchmark(Benchmark[FioOptions]):
    """Runs fio profiles one after another on ``target``."""

    name: ClassVar[str] = "fio"
    default_filter: ClassVar[str] = "tree"

    def __init__(self, options: FioOptions | BenchmarkOptions | None = None) -> None:
        super().__init__(options)
        # launch() runs before setup() and again for descriptions: the file we
        # may create has its name from the start.
        self._file_name = f"kernmlops-fio-{uuid.uuid4().hex}.dat"

    # -- target --------------------------------------------------------------
    def _default_dir(self) -> str:
        for folder in DEFAULT_DIRS:
            if os.path.isdir(folder) and filesystem_type(folder) not in MEMORY_FILESYSTEMS:
                return folder
        return DEFAULT_DIRS[0]  # check() says why this will not do

    def target_path(self) -> Path:
        """The file or device fio opens."""
        target = self.options.target
        if target is None:
            return Path(self._default_dir()) / self._file_name
        if os.path.isdir(target):
            return Path(target) / self._file_name
        return Path(target)

    def owns_target(self) -> bool:
        """True when the target file is ours to make and remove."""
        return self.options.target is None or os.path.isdir(self.options.target)

    def is_device(self) -> bool:
        try:
            return stat.S_ISBLK(os.stat(self.target_path()).st_mode)
        except OSError:
            return False

    def check(self) -> None:
        require_tool("fio", FIO, "apt-get install fio")
        path = self.target_path()
        writes = [p for p in self.options.profiles if p in WRITING]
        try:
            st: os.stat_result | None = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as err:
            raise BenchmarkError(f"fio: cannot use target {str(path)!r}: {err.strerror}") from err
        if st is not None and stat.S_ISBLK(st.st_mode):
            if writes and not self.options.allow_write_device:
                raise BenchmarkError(
                    f"fio: target {str(path)!r} is a block device and profile(s) "
                    f"{', '.join(writes)} would overwrite its data; set "
                    "benchmark.fio.allow_write_device: true if that is what you want, "
                    "or use read profiles only"
                )
            busy = device_in_use(path, st.st_rdev) if writes else None
            if busy:
                raise BenchmarkError(
                    f"fio: target {str(path)!r} is {busy}; write profiles would corrupt "
                    "it: free the device first, or use read profiles only"
                )
            if not os.access(path, os.R_OK | (os.W_OK if writes else 0)):
                raise BenchmarkError(f"fio: no permission to use {str(path)!r} (run as root)")
            return
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise BenchmarkError(
                f"fio: target {str(path)!r} is neither a regular file, a folder nor a block device"
            )
        # a file of the user's with data in it: fio's writes replace that data, as
        # they would a device's; so does its lay-out of a file smaller than size, which
        # rewrites the file from its start before a read profile reads it
        if st is not None and st.st_size and not self.options.allow_write_file:
            size = parse_size(self.options.size)
            if writes:
                raise BenchmarkError(
                    f"fio: target {str(path)!r} is a file of {st.st_size:,} bytes and "
                    f"profile(s) {', '.join(writes)} would overwrite its content; set "
                    "benchmark.fio.allow_write_file: true if that is what you want, name a "
                    "folder (fio writes a file of its own there) or use read profiles only"
                )
            if st.st_size < size:
                raise BenchmarkError(
                    f"fio: target {str(path)!r} is a file of {st.st_size:,} bytes, less than "
                    f"size ({self.options.size}): fio would lay it out to size first, "
                    "overwriting its content; set benchmark.fio.size to at most its size, "
                    "name a folder, or set benchmark.fio.allow_write_file: true"
                )
        folder = path.parent
        if not folder.is_dir():
            raise BenchmarkError(f"fio: folder {str(folder)!r} of the target does not exist")
        if not os.access(folder if st is None else path, os.W_OK):
            raise BenchmarkError(f"fio: cannot write {str(path)!r} (no permission)")
        fstype = filesystem_type(folder)
        if self.options.direct and fstype in MEMORY_FILESYSTEMS:
            where = (
                "the default temporary folder" if self.options.target is None else repr(str(path))
            )
            raise BenchmarkError(
                f"fio: {where} is on {fstype}, which lives in memory: direct I/O there "
                "measures RAM, not a disk; set benchmark.fio.target to a file or folder "
                "on a disk (or a block device)"
            )

    # -- run -----------------------------------------------------------------
    def launch(self) -> Launch | None:
        o = self.options
        # fio separates several files with ':' in --filename.
        filename = str(self.target_path()).replace(":", "\\:")
        argv = [
            FIO,
            "--output-format=json",
            "--eta=never",
            f"--filename={filename}",
            f"--size={parse_size(o.size)}",
            f"--bs={parse_size(o.bs)}",
            f"--iodepth={o.iodepth}",
            f"--ioengine={o.ioengine}",
            f"--direct={int(o.direct)}",
            f"--numjobs={o.numjobs}",
            # percentiles of the whole latency (submission to completion), not
            # only of completion
            "--lat_percentiles=1",
            "--group_reporting",
        ]
        if o.runtime_s is not None:
            argv.append(f"--runtime={o.runtime_s:g}s")
        if o.time_based:
            argv.append("--time_based")
        argv += o.extra_args  # global: before the first --name
        for i, profile in enumerate(o.profiles):
            argv += [f"--name={profile}", f"--rw={RW[profile]}"]
            if profile == "randrw":
                argv.append(f"--rwmixread={o.rwmixread}")
            if i:
                argv.append("--stonewall")  # one profile after another
        return Launch(argv=argv, capture_output=True)

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        if run.stdout_path is None:
            return None
        report = load_fio_json(run.stdout_path.read_text(errors="replace"))
        if report is None:
            return None
        return result_frame(fio_rows(report))

    def teardown(self) -> None:
        if self.owns_target():
            with contextlib.suppress(FileNotFoundError):
                self.target_path().unlink()


def load_fio_json(text: str) -> dict[str, Any] | None:
    """fio's JSON report from its stdout; fio may print lines before it
    ("fio: terminating on signal 15"). None if there is no report."""
    decoder = json.JSONDecoder()
    starts = [0] if text.startswith("{") else []
    starts += [m.start() + 1 for m in re.finditer(r"\n\{", text)]
    for start in starts:  # each line that opens an object
        try:
            report, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(report, dict) and "jobs" in report:
            return report
    return None


def _percentile(lat: dict[str, Any], p: float) -> float | None:
    for key, value in (lat.get("percentile") or {}).items():
        if abs(float(key) - p) < 1e-9:
            return float(value)
    return None


def fio_rows(report: dict[str, Any]) -> list[tuple[str, str, float, str]]:
    """``(job.op, metric, value, unit)`` per job and direction that did I/O:
    iops, bw_bytes, io_bytes, lat mean/p50/p99 (µs) and the job's run time."""
    rows: list[tuple[str, str, float, str]] = []
    for job in report.get("jobs", []):
        name = str(job.get("jobname", "job"))
        for op in ("read", "write", "trim"):
            s = job.get(op) or {}
            if not s.get("total_ios") and not s.get("io_bytes"):
                continue
            key = f"{name}.{op}"
            rows += [
                (key, "iops", float(s["iops"]), "1/s"),
                (key, "bw_bytes", float(s["bw_bytes"]), "B/s"),
                (key, "io_bytes", float(s["io_bytes"]), "B"),
                (key, "total_ios", float(s["total_ios"]), "ios"),
                (key, "runtime_s", float(job.get("job_runtime", 0)) / 1e3, "s"),
            ]
            lat = s.get("lat_ns") or {}
            if "mean" in lat:
                rows.append((key, "lat_mean_us", float(lat["mean"]) / 1e3, "us"))
            for p in (50.0, 99.0):
                v = _percentile(lat, p)
                if v is not None:
                    rows.append((key, f"lat_p{p:g}_us", v / 1e3, "us"))
        if job.get("error"):
            rows.append((name, "error", float(job["error"]), "errno"))
    return rows
