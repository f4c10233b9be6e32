"""Heavy libraries wait for their first use: a collection attaches its probes
before numpy, polars, pyarrow, pyelftools, PyYAML or rich are imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import ModuleType

import pytest

from kernmlops.lazy import lazy_import

HEAVY = ("numpy", "polars", "pyarrow", "elftools", "yaml", "rich")


def run_python(code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_lazy_module_imports_on_first_attribute(tmp_path: Path) -> None:
    (tmp_path / "kmo_lazy_probe.py").write_text("import time\nLOADED = time.time()\nX = 41\n")
    code = """
        import sys
        from kernmlops.lazy import lazy_import
        probe = lazy_import("kmo_lazy_probe")
        before = "kmo_lazy_probe" in sys.modules
        value = probe.X + 1
        same = probe.LOADED == sys.modules["kmo_lazy_probe"].LOADED
        print(before, "kmo_lazy_probe" in sys.modules, value, same)
    """
    out = run_python(code, cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "42", "True"]


def test_threads_touching_a_lazy_module_at_once_run_it_once(tmp_path: Path) -> None:
    # The module counts its executions in a file; eight threads race to use it.
    count = tmp_path / "count"
    count.write_text("0")
    (tmp_path / "kmo_lazy_race.py").write_text(
        "import pathlib, time\n"
        f"p = pathlib.Path({str(count)!r})\n"
        "p.write_text(str(int(p.read_text()) + 1))\n"
        "time.sleep(0.2)  # a slow import widens the race\n"
        "def f():\n    return 7\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        mod = lazy_import("kmo_lazy_race")
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(mod.f())) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kmo_lazy_race", None)
    assert results == [7] * 8
    assert count.read_text() == "1"


def test_a_missing_attribute_is_an_attribute_error() -> None:
    mod = lazy_import("json")
    with pytest.raises(AttributeError):
        _ = mod.no_such_name
    assert mod.dumps({"a": 1}) == json.dumps({"a": 1})


def test_the_command_line_and_the_collect_path_import_nothing_heavy() -> None:
    code = f"""
        import sys
        import kernmlops.cli, kernmlops.config, kernmlops.collect.session
        import kernmlops.hooks, kernmlops.benchmarks, kernmlops.ebpf.spec
        # a run's configuration and its plug-ins (the default hooks, faux)
        from kernmlops.config import load_config
        from kernmlops.hooks import get_hook
        from kernmlops.benchmarks import get_benchmark
        config = load_config({{"benchmark": {{"name": "faux"}}}})
        hooks = [get_hook(n)(config.hook_options(n)) for n in config.collector.hooks]
        get_benchmark("faux")(config.benchmark_options())
        print([m for m in {HEAVY!r} if m in sys.modules])
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_module_growing_in_another_thread_while_first_used() -> None:
    # A thread importing a submodule adds names to its parent's dict (pyarrow
    # gains .parquet while preload runs): the stand-in must copy the names
    # without tripping over the dict changing under it. A big module and a
    # busy writer make the switch land inside the copy on the old code.
    big = ModuleType("kmo_lazy_growing")
    big.__dict__.update({f"name{i}": i for i in range(50_000)})
    sys.modules[big.__name__] = big
    stop = threading.Event()

    def grow() -> None:
        n = 0
        while not stop.is_set():
            setattr(big, f"late{n % 64}", n)
            if n % 64 == 63:
                for k in range(64):
                    delattr(big, f"late{k}")
            n += 1

    writer = threading.Thread(target=grow)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer.start()
    try:
        for _ in range(5):
            assert lazy_import(big.__name__).name49999 == 49_999
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(old_interval)
        sys.modules.pop(big.__name__, None)


def test_the_first_rows_import_nothing_once_the_libraries_are_in(tmp_path: Path) -> None:
    # The collector imports its decoding libraries in the background right after
    # attaching (preload); whatever the first flush imports on top runs later, in
    # the sink's thread or the loop, under the storm it records. numpy 2's first
    # np.unique imports numpy.ma (pure Python: ~15 ms idle, far more under a storm),
    # which the sink's first part used to pay; pyarrow's first array from Python
    # objects (memory_usage's rows, and this table's) imports dateutil.relativedelta.
    code = f"""
        import sys
        import pyarrow as pa
        from pathlib import Path
        from kernmlops.collect.tuning import DECODING_LIBRARIES, UNUSED_LIBRARIES
        from kernmlops.collect.parquet import ParquetSink
        from kernmlops.lazy import keep_out, preload
        keep_out(*UNUSED_LIBRARIES)  # as `kernmlops collect` does
        assert preload(*DECODING_LIBRARIES).wait(60)
        before = set(sys.modules)
        n = 10_000
        table = pa.table({{
            "ts_uptime_us": pa.array(range(n), pa.uint64()),
            "cpu": pa.array([i % 2 for i in range(n)], pa.uint32()),
            "comm": pa.array([f"task{{i % 7}}" for i in range(n)]),
            "ratio": pa.array([None if i % 5 == 0 else i / 3 for i in range(n)]),
        }})
        sink = ParquetSink(Path({str(tmp_path)!r}), "c0ffee")
        sink.write("quanta", table)
        sink.flush(durable=True)
        sink.close()
        print(sorted(set(sys.modules) - before))
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert list(tmp_path.glob("quanta/part-*.parquet"))


def test_a_module_kept_out_is_not_imported_and_one_already_in_stays() -> None:
    code = """
        import json, sys
        from kernmlops.lazy import keep_out
        keep_out("json", "kmo_never_there")
        try:
            import kmo_never_there
        except ImportError:
            print("refused")
        print(sys.modules["json"] is json)
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused", "True"]


@pytest.mark.parametrize("kept_out", [True, False])
def test_a_collection_writes_and_reads_parquet_without_pyarrows_remote_filesystems(
    tmp_path: Path, kept_out: bool
) -> None:
    # What `kernmlops collect` keeps out of its process (MiB of RSS): the first
    # rows, a durable part, compaction and reading the collection back still work,
    # and libarrow_s3 is never mapped (the control maps it).
    code = f"""
        import sys
        from pathlib import Path
        from kernmlops.collect.tuning import UNUSED_LIBRARIES
        from kernmlops.lazy import keep_out
        if {kept_out}:
            keep_out(*UNUSED_LIBRARIES)
        import pyarrow as pa
        from kernmlops.collect.manifest import write_manifest
        from kernmlops.collect.parquet import ParquetSink
        from kernmlops.data import read_collection
        folder = Path({str(tmp_path)!r})
        write_manifest(folder, {{"collection_id": "c0ffee", "benchmark": "faux"}})
        sink = ParquetSink(folder, "c0ffee")
        sink.write("quanta", pa.table({{"ts_uptime_us": pa.array(range(1000), pa.uint64())}}))
        sink.flush(durable=True)
        sink.write("quanta", pa.table({{"ts_uptime_us": pa.array(range(1000, 1500), pa.uint64())}}))
        sink.close()
        sink.compact()
        frame = read_collection(folder)["quanta"]
        print(frame.height, "libarrow_s3" in Path("/proc/self/maps").read_text())
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1500", str(not kept_out)]
