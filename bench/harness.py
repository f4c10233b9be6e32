"""What every benchmark shares: its command line, its rounds, its statistics, its results file.

A benchmark is a module of this package with a docstring (its first line is its
purpose), a ``TARGET`` string and ``main(argv) -> int | None``; ``python -m bench``
finds it. This module imports only the standard library at load time, so listing
the benchmarks and starting a child of one stay cheap; numpy and scipy are
imported by the statistics that need them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
BUILD = BENCH / "build"
#: the results file's layout; 0 is a file written before the harness (no "bench" key)
FORMAT = 1
#: the key the harness adds to a result; the benchmark's own keys are left as they were
META_KEY = "bench"

#: set by ``python -m bench`` for the run in progress: the name and options recorded
_run: dict[str, Any] = {}


# --- names and command line ---------------------------------------------------------------
def thread_cpu(pid: int, acc: dict[int, tuple[str, float]]) -> None:
    """Each thread's CPU seconds so far (utime + stime), kept by tid in ``acc`` with its
    name (comm)."""
    tck = os.sysconf("SC_CLK_TCK")
    try:
        for t in Path(f"/proc/{pid}/task").iterdir():
            try:
                st = (t / "stat").read_text()
            except OSError:
                continue
            comm = st[st.index("(") + 1 : st.rindex(")")]
            f = st.rsplit(")", 1)[1].split()
            acc[int(t.name)] = (comm, (int(f[11]) + int(f[12])) / tck)
    except OSError:
        pass


def remove_output(out: Path) -> None:
    """Delete a benchmark's collection folder, and the tmpfs folder of each of its
    spools that a killed collector left in /dev/shm (the collector deletes its own
    when it finishes; kernmlops would warn about a leftover at every later start)."""
    import shutil

    from kernmlops.spool.collection import SPOOL_DIR
    from kernmlops.spool.memory import own_memory

    for spool_dir in out.glob(f"curated/*/*/{SPOOL_DIR}"):
        folder = own_memory(spool_dir)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


def name_of(module: str) -> str:
    """The command-line name of a benchmark module: ``bench.collector_cpu`` -> ``collector-cpu``."""
    return module.rsplit(".", 1)[-1].replace("_", "-")


def parser(
    module: str, doc: str | None, *, defaults_in_help: bool = False, **kwargs: Any
) -> argparse.ArgumentParser:
    """The benchmark's parser, named as it is run (``python -m bench <name>``), its
    description the docstring's first paragraph."""
    if defaults_in_help:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
    return argparse.ArgumentParser(
        prog=f"python -m bench {name_of(module)}",
        description=(doc or "").split("\n\n")[0],
        **kwargs,
    )


def result_path(name: str) -> Path:
    """Where a benchmark writes by default: ``bench/results/<name>.json``."""
    return RESULTS / f"{name}.json"


def begin(name: str, argv: Sequence[str]) -> None:
    """Record which benchmark runs with which options (``python -m bench`` calls this)."""
    _run.clear()
    _run.update(name=name, argv=list(argv))


def child_env() -> dict[str, str]:
    """The environment for a child that runs ``python -m bench ...`` again, from any folder.
    A ``PYTHONPATH`` given comes first: a wheel installed with ``pip --target`` (a
    machine without clang, bench/scale.sh) is the kernmlops its children run too."""
    env = dict(os.environ)
    paths = [env.get("PYTHONPATH", ""), str(ROOT), str(ROOT / "src")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def tree_env(tree: Path | None) -> dict[str, str]:
    """The variables that run another tree's ``kernmlops`` (``--baseline TREE``): a source
    checkout (its ``src/``) or a folder a wheel was installed into (``pip --target``),
    ahead of the ``PYTHONPATH`` there is; {} for this tree."""
    if tree is None:
        return {}
    path = tree / "src" if (tree / "src" / "kernmlops").is_dir() else tree
    if not (path / "kernmlops").is_dir():
        raise SystemExit(f"--baseline {tree}: no kernmlops there (a checkout or a --target folder)")
    paths = [str(path.resolve()), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


# --- the machine --------------------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def git_commit() -> str | None:
    """The checkout's commit, ``+`` when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def machine() -> dict[str, Any]:
    """What a reader needs to know which machine a figure is from."""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
    }


def record(name: str | None = None, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The harness's part of a results file: which benchmark, when, on what, at which commit."""
    return {
        "format": FORMAT,
        "benchmark": name or _run.get("name"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "argv": list(argv if argv is not None else _run.get("argv", sys.argv[1:])),
        "machine": machine(),
    }


# --- results files ------------------------------------------------------------------------
def prog_runs(obj) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of all the object's programs together (only the attached
    one runs; the counts grow only while the kernel's timing is on)."""
    from kernmlops.ebpf.libbpf import prog_info

    ns = count = 0
    for prog in obj.programs.values():
        if prog.fd < 0:
            continue  # not loaded (the raw_tp twin where tp_btf works)
        info = prog_info(prog.fd)
        ns += info.run_time_ns
        count += info.run_cnt
    return ns, count


def portable(text: str) -> str:
    """Paths under the checkout become relative to it, so results read the same anywhere."""
    return text.replace(str(ROOT) + "/", "").replace(str(ROOT), ".")  # "found in <root>;"


def save(path: Path, result: Any, *, indent: int | None = 2) -> None:
    """Write one results file: the benchmark's own keys as they were, plus ``"bench"``
    (the run's record) when the result is a mapping. Checkout-relative paths, a
    trailing newline; written to a temporary name and renamed."""
    if isinstance(result, dict):
        name = _run.get("name") or path.stem
        result = {**result, META_KEY: record(name)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(portable(json.dumps(result, indent=indent, default=str)) + "\n")
    tmp.replace(path)


def load(path: Path) -> dict[str, Any]:
    """Read a results file of any format. A file from before the harness gets a
    ``"bench"`` record with ``format`` 0 and whatever machine facts it holds."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return {"rows": data, META_KEY: {"format": 0, "benchmark": path.stem}}
    if META_KEY not in data:
        known = data.get("machine") or data.get("host") or {}
        data[META_KEY] = {
            "format": 0,
            "benchmark": path.stem,
            "date": data.get("date") or data.get("when"),
            "machine": {k: known[k] for k in ("cpus", "cpu_model", "kernel") if k in known},
        }
    return data


# --- rounds -------------------------------------------------------------------------------
def rotations(items: Sequence[Any], rounds: int) -> Iterator[tuple[int, list[Any]]]:
    """Interleaved rounds: every round runs every item, the order turning by one each
    round, so no item always runs first (on warm caches) or last (after the others)."""
    items = list(items)
    for r in range(rounds):
        k = r % len(items) if items else 0
        yield r, items[k:] + items[:k]


# --- statistics ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    """A sample's median with a distribution-free interval, and its mean with a t interval."""

    n: int
    median: float
    median_low: float
    median_high: float
    #: the median interval's exact coverage (order statistics give only some levels)
    median_coverage: float
    mean: float
    #: None where scipy is missing (mean_interval)
    mean_low: float | None
    mean_high: float | None
    confidence: float

    def as_dict(self, digits: int | None = None) -> dict[str, float | None]:
        """The fields; ``digits`` rounds the measured values (not the confidence and
        the coverage, which rounding to a digit made 0.9 and 1.0)."""
        out = asdict(self)
        if digits is not None:
            kept = ("n", "median_coverage", "confidence")
            out = {k: v if v is None or k in kept else round(v, digits) for k, v in out.items()}
        return out


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """The narrowest order-statistic interval [x(j), x(n+1-j)] that holds the median
    with at least ``confidence`` (binomial, no assumption about the distribution).
    Too few values for that level: the range, with the coverage it does have.
    Returns (low, high, coverage)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        raise ValueError("no values")
    if n == 1:
        return xs[0], xs[0], 0.0
    # P(X < j) for X ~ Binomial(n, 1/2); coverage of [x(j), x(n+1-j)] is 1 - 2 P(X < j)
    below = 0.0
    best = (xs[0], xs[-1], 1 - 2 * 0.5**n)
    for j in range(1, n // 2 + 1):
        below += math.comb(n, j - 1) * 0.5**n
        coverage = 1 - 2 * below
        if coverage < confidence:
            break
        best = (xs[j - 1], xs[n - j], coverage)
    return best


def mean_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float] | tuple[None, None]:
    """Student's t interval of the mean (the duet analysis' t interval, one stratum);
    (None, None) where scipy is missing: a bundle run on a machine whose Python lacks
    it (the 16-core machine's, bench/bundle.sh) still gets the medians' intervals."""
    import numpy as np

    try:
        import scipy.stats  # noqa: F401  (t_interval's quantiles)
    except ImportError:
        return None, None
    from kernmlops.duet.analysis import t_interval

    xs = np.asarray(values, float)
    if len(xs) < 2:
        m = float(xs.mean())
        return m, m
    ci = t_interval((xs,), confidence)
    assert ci is not None  # two values or more
    return ci.low, ci.high


def summarize(values: Sequence[float], confidence: float = 0.95) -> Summary:
    """Median and mean of a benchmark's rounds, each with its interval."""
    xs = [float(v) for v in values]
    lo, hi, cov = median_interval(xs, confidence)
    mlo, mhi = mean_interval(xs, confidence)
    ordered = sorted(xs)
    mid = len(ordered) // 2
    med = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return Summary(
        n=len(xs), median=med, median_low=lo, median_high=hi, median_coverage=cov,
        mean=sum(xs) / len(xs), mean_low=mlo, mean_high=mhi, confidence=confidence,
    )  # fmt: skip
