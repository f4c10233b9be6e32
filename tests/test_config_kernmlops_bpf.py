"""The test of test_config_kernmlops.py that needs root and BPF (the main lane), apart
from the others so that those run beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_config_kernmlops import _collect, _file


@pytest.mark.bpf
def test_collect_runs_a_kernmlops_file_from_overrides_yaml(tmp_path: Path) -> None:
    _file(
        tmp_path,
        "benchmark_config: {generic: {benchmark: faux}}\n"
        "collector_config: {generic: {poll_rate: 0.05, output_dir: out, output_graphs: true,\n"
        "                             hooks: [process_trace, quanta_runtime]}}\n",
    )
    proc = _collect(tmp_path, "-d", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("using overrides.yaml")
    found = list((tmp_path / "out" / "curated" / "benchmark=faux").glob("collection_id=*"))
    assert len(found) == 1
    from kernmlops.data import read_collection

    col = read_collection(found[0])
    assert col.manifest.config["collector"]["poll_interval_ms"] == 50
    # the hooks it names ran (process_trace may see no process start in 1 s of faux)
    assert col.manifest.config["collector"]["hooks"] == ["process_trace", "quanta_runtime"]
    assert col.manifest.hooks["process_trace"].attached and "quanta_runtime" in col
    # output_graphs: the graphs `kernmlops graph` draws, beside the collection
    drawn = sorted(p.name for p in (found[0] / "graphs").glob("*.png"))
    assert drawn and f"{len(drawn)} graphs in" in proc.stderr
