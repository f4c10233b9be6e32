"""A user's metric set: a YAML beside its .bpf.c, compiled on first use, checked
against its maps, reported by --check (and failed by --strict when a program
does not attach), and served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.ebpf.build import build
from kernmlops.exporter.cli import export_command
from kernmlops.exporter.config import MetricSet, load_metric_set
from kernmlops.exporter.core import Exporter
from tests.exporter.conftest import exporter_process, free_port, wait_logged, wait_serving

pytestmark = pytest.mark.bpf

SOURCE = r"""
#include "exp_common.h"

struct cpu_hist {
	u64 slots[7 + 2]; /* linear, bucket_max 7: slots 0..7 and the overflow */
	u64 sum;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, u32);
	__type(value, u64);
} switches SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cpu_hist);
} cpus SEC(".maps");

SEC("raw_tp/sched_switch")
int user_switch(void *ctx)
{
	u32 cpu = bpf_get_smp_processor_id(), zero = 0;
	struct cpu_hist *h;

	if (!exp_current_wanted())
		return 0;
	exp_count(&switches, &cpu, 1);
	h = bpf_map_lookup_elem(&cpus, &zero);
	if (h)
		EXP_OBSERVE(h, exp_slot_linear(cpu), cpu);
	return 0;
}

/* Loads, and cannot attach: no such tracepoint. */
SEC("tracepoint/kmo_nonexistent/nothing")
int user_never(void *ctx)
{
	return 0;
}
"""

YAML = """\
description: context switches by CPU (a test set)
metrics:
  counters:
    - name: user_switches_total
      help: context switches by CPU
      map: switches
      labels:
        - {name: cpu, size: 4, decoders: [{name: uint}]}
  histograms:
    - name: user_switch_cpu
      help: the CPU of each context switch
      map: cpus
      bucket_type: linear
      bucket_max: 7
"""


@pytest.fixture(scope="module")
def set_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The .bpf.c, compiled once for the module (into the build folder)."""
    build()  # vmlinux.h for the user's object
    directory = tmp_path_factory.mktemp("user-set")
    (directory / "exp_user_switch.bpf.c").write_text(SOURCE)
    path = directory / "exp_user_switch.yaml"
    path.write_text(YAML)
    try:
        yield directory
    finally:
        load_metric_set(path).object_path().unlink(missing_ok=True)


@pytest.fixture
def user_set(set_dir: Path) -> MetricSet:
    path = set_dir / "exp_user_switch.yaml"
    path.write_text(YAML)  # as a test may have changed it
    return load_metric_set(path)


def test_check_fails_on_a_program_that_does_not_attach(user_set: MetricSet) -> None:
    runner = CliRunner()
    for args in (["--check"], ["--check", "--strict"]):
        result = runner.invoke(export_command, [*args, "-c", str(user_set.path)])
        assert result.exit_code == 1, result.output
        assert user_set.object_path().exists()  # compiled from the .bpf.c beside the file
        assert "user_switch" in result.output and "1/2" in result.output
        assert "check passed" not in result.output
        failed = [line for line in result.output.splitlines() if line.startswith("check failed")]
        # one line for the one program that did not attach, with the kernel's reason
        assert len(failed) == 1, result.output
        assert failed[0] == (
            "check failed: set user_switch: program user_never "
            "(tracepoint/kmo_nonexistent/nothing) not attached: attach user_never "
            "(tracepoint/kmo_nonexistent/nothing): No such file or directory (errno 2)"
        )
        assert "Traceback" not in result.output


def test_check_passes_when_every_program_attaches(set_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "exp_user_switch.bpf.c").write_text(SOURCE.split("/* Loads, and cannot")[0])
    path = tmp_path / "exp_user_switch.yaml"
    path.write_text(YAML)
    try:
        result = CliRunner().invoke(export_command, ["--check", "-c", str(path)])
    finally:
        load_metric_set(path).object_path().unlink(missing_ok=True)
    assert result.exit_code == 0, result.output
    assert "1/1" in result.output
    assert "check passed: 1 sets loaded, all 1 programs attached" in result.output


def test_check_refuses_a_file_that_does_not_fit_its_maps(user_set: MetricSet) -> None:
    user_set.path.write_text(YAML.replace("bucket_max: 7", "bucket_max: 5"))
    result = CliRunner().invoke(export_command, ["--check", "-c", str(user_set.path)])
    assert result.exit_code == 1, result.output
    assert (
        f"metric set {user_set.path}: user_switch_cpu: values of map cpus are 80 bytes; "
        "the metric needs 64 (7 slots (buckets 0..5 and overflow) and the sum)" in result.output
    )
    user_set.path.write_text(YAML.replace("map: cpus", "map: cpu"))
    result = CliRunner().invoke(export_command, ["--check", "-c", str(user_set.path)])
    assert result.exit_code == 1
    assert "the object has no map 'cpu' (maps: " in result.output
    user_set.path.write_text(YAML.replace("size: 4", "size: 8"))
    result = CliRunner().invoke(export_command, ["--check", "-c", str(user_set.path)])
    assert result.exit_code == 1
    assert "labels span 8 bytes, the key of map switches has 4" in result.output


def test_user_set_is_served(user_set: MetricSet) -> None:
    with Exporter([user_set]) as exporter:
        (status,) = exporter.start()
        assert status.error is None and status.attached == 1
        assert [p.name for p in status.missed] == ["user_never"]
        time.sleep(0.3)
        families = {f.name: f for f in text_string_to_metric_families(exporter.render().decode())}
    switches = families["user_switches"].samples
    assert switches and all(0 <= int(s.labels["cpu"]) < 4096 for s in switches)
    hist = {(s.name, s.labels.get("le")): s.value for s in families["user_switch_cpu"].samples}
    assert [le for name, le in hist if name.endswith("_bucket")] == [
        "0.0", "1.0", "2.0", "3.0", "4.0", "5.0", "6.0", "7.0", "+Inf",
    ]  # fmt: skip
    assert hist[("user_switch_cpu_count", None)] > 0
    attached = families["kernmlops_exporter_programs_not_attached"].samples
    assert [(s.labels, s.value) for s in attached] == [({"set": "user_switch"}, 1.0)]


def test_serving_names_a_program_that_does_not_attach(user_set: MetricSet, tmp_path: Path) -> None:
    """Without --strict the set is served without the program, and the log says
    which one and why (its metrics would stay empty with no word of it)."""
    port = free_port()
    log = tmp_path / "exporter.log"
    with exporter_process(log, "-c", str(user_set.path), "--listen", f"127.0.0.1:{port}") as proc:
        wait_serving(proc, f"http://127.0.0.1:{port}/metrics", log)
        text = wait_logged(log, "serving 1 metric sets")
    assert (
        "warning: set user_switch: program user_never (tracepoint/kmo_nonexistent/nothing) "
        "not attached: attach user_never (tracepoint/kmo_nonexistent/nothing): No such file "
        "or directory (errno 2)\n" in text
    ), text
    assert "serving 1 metric sets (1 programs)" in text


FENTRY_SOURCE = r"""
#include "exp_common.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} reads SEC(".maps");

SEC("fentry/vfs_read")
int user_read(void *ctx)
{
	u32 zero = 0;

	exp_count(&reads, &zero, 1);
	return 0;
}
"""

FENTRY_YAML = """\
description: vfs_read calls (a test set)
metrics:
  counters:
    - name: user_reads_total
      help: vfs_read calls
      map: reads
      labels:
        - {name: slot, size: 4, decoders: [{name: uint}]}
"""


def test_a_set_of_a_program_type_the_kernel_refuses_says_which(tmp_path: Path) -> None:
    """Where the kernel loads no fentry program (what doctor probes), a set with one
    fails to load with EPERM and libbpf's hint at 'ulimit -l': the error names the
    program type and the set's programs of it. Where it does, the set loads."""
    from kernmlops.ebpf.probe import probe_program

    (tmp_path / "exp_user_read.bpf.c").write_text(FENTRY_SOURCE)
    path = tmp_path / "exp_user_read.yaml"
    path.write_text(FENTRY_YAML)
    user_set = load_metric_set(path)
    try:
        with Exporter([user_set]) as exporter:
            (status,) = exporter.start()
    finally:
        user_set.object_path().unlink(missing_ok=True)
    if probe_program("fentry").ok:
        assert status.error is None and status.attached == 1, status.error
        return
    assert status.error is not None
    assert status.error.endswith(
        ": this kernel does not load fentry programs, and it has 1 (fentry/vfs_read); "
        "kernmlops doctor shows the program types it loads"
    ), status.error
    assert "\n" not in status.error


def test_collect_export_names_a_program_that_does_not_attach(user_set: MetricSet) -> None:
    """collect --export serves a set without its program that did not attach (no
    --strict), and says which and why, as kernmlops export does."""
    import os

    from kernmlops.collect.participants import ExporterParticipant
    from kernmlops.config import CollectorConfig
    from kernmlops.hooks.base import HookContext

    said: list[str] = []
    collector = CollectorConfig(
        export="127.0.0.1:0", export_sets=[str(user_set.path)], export_grace_s=0
    )
    part = ExporterParticipant(collector, on_message=said.append)
    part.start(HookContext(collection_id="t", process_filter=None, self_tgid=os.getpid()))
    part.close()
    assert said == [
        "exporter: set user_switch: program user_never (tracepoint/kmo_nonexistent/nothing) "
        "not attached: attach user_never (tracepoint/kmo_nonexistent/nothing): No such file "
        "or directory (errno 2)"
    ]
    assert part.summary is not None
    assert part.summary["sets"]["user_switch"]["attached"] == 1
