"""The PyTorch job (LeNet-5) and the pytorch benchmark: need torch (make ml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.ml_training import (
    JOB_SCRIPT,
    PytorchBenchmark,
    parse_job_output,
)
from kernmlops.config import load_config
from kernmlops.workloads import ml_job


def _run_job(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    assert ml_job.main(list(args)) == 0
    return parse_job_output(capsys.readouterr().out)


torch = pytest.importorskip("torch", reason="torch is not installed (make ml)")

TORCH_SMALL = ["--framework", "torch", "--samples", "600", "--test-samples", "300",
               "--batch-size", "64", "--lr", "0.02", "--threads", "1", "--seed", "2"]  # fmt: skip


def test_lenet5_has_lecuns_layer_sizes() -> None:
    model = ml_job.lenet5(10)
    out = model(torch.zeros(3, 1, 28, 28))
    assert tuple(out.shape) == (3, 10)
    # Parameters written out from the architecture: conv 1->6 5x5, conv 6->16 5x5,
    # 16*5*5 -> 120 -> 84 -> 10, each with biases.
    expected = (6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + 850
    assert sum(p.numel() for p in model.parameters()) == expected == 61_706


def test_torch_job_counts_steps_and_writes_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "ck"
    records = _run_job(capsys, *TORCH_SMALL, "--epochs", "2", "--checkpoint-dir", str(ck),
                       "--checkpoint-every", "7", "--keep-checkpoints", "1")  # fmt: skip
    setup, done = records[0], records[-1]
    assert setup["framework"] == "torch" and setup["model"] == "lenet5"
    assert setup["image"] == [1, 28, 28] and setup["parameters"] == 61_706
    per_epoch = -(-600 // 64)  # ceil: the last minibatch is short
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["steps"] for r in epochs] == [per_epoch, 2 * per_epoch]
    assert done["steps"] == 2 * per_epoch
    ckpts = [r for r in records if r["kind"] == "checkpoint"]
    assert [r["step"] for r in ckpts] == list(range(7, 2 * per_epoch + 1, 7))
    assert done["checkpoints"] == len(ckpts)
    assert done["checkpoint_bytes"] == sum(r["bytes"] for r in ckpts)
    # Only the newest is kept; it is the model as it was at that step.
    files = sorted(ck.iterdir())
    assert [f.name for f in files] == [f"ckpt-{ckpts[-1]['step']:09d}.pt"]
    assert files[0].stat().st_size == ckpts[-1]["bytes"]
    state = torch.load(files[0], weights_only=True)
    assert state["step"] == ckpts[-1]["step"]
    assert set(state["model"]) == set(ml_job.lenet5(10).state_dict())


def test_torch_job_learns_and_checkpoints_each_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = _run_job(capsys, *TORCH_SMALL, "--epochs", "3", "--separation", "2.0",
                       "--checkpoint-dir", str(tmp_path))  # fmt: skip
    epochs = [r for r in records if r["kind"] == "epoch"]
    ckpts = [r for r in records if r["kind"] == "checkpoint"]
    assert [r["epoch"] for r in ckpts] == [1, 2, 3]  # default: one at each epoch's end
    assert [r["step"] for r in ckpts] == [r["steps"] for r in epochs]
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    assert epochs[-1]["accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert len(list(tmp_path.iterdir())) == 2  # keep 2 by default


def test_torch_job_data_loader_workers_are_forked_processes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(JOB_SCRIPT), *TORCH_SMALL, "--epochs", "1", "--workers", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = parse_job_output(done.stdout)
    assert records[0]["workers"] == 2 and records[-1]["steps"] == -(-600 // 64)


def test_pytorch_benchmark_repeats_the_job_in_fresh_processes(tmp_path: Path) -> None:
    opts = PytorchBenchmark.Options(repeat=2, sleep_s=0.1, samples=200, test_samples=100,
                                    checkpoint_dir=str(tmp_path))  # fmt: skip
    bench = PytorchBenchmark(opts)
    assert bench.name == "pytorch" and bench.framework() == "torch"
    bench.check()
    launch = bench.launch()
    assert launch is not None and launch.argv[0] == "/bin/sh"
    done = subprocess.run(launch.argv, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **launch.env})  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = parse_job_output(done.stdout)
    dones = [r for r in records if r["kind"] == "done"]
    assert len(dones) == 2 and dones[0]["pid"] != dones[1]["pid"]
    (tmp_path / "stdout.txt").write_text(done.stdout)
    frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=tmp_path / "stdout.txt"))
    assert frame is not None
    value = {(k, m): v for k, m, v, _ in frame.iter_rows()}
    per_run = -(-200 // 32)
    assert value[("run_1/process", "steps")] == value[("run_2/process", "steps")] == per_run
    assert value[("run_2/checkpoints", "count")] == 1
    assert value[("run_1/setup", "torch")] == 1.0


def test_pytorch_benchmark_stops_at_a_failing_run() -> None:
    bench = PytorchBenchmark(PytorchBenchmark.Options(repeat=3))
    launch = bench.launch()
    assert launch is not None
    loop = [*launch.argv[:6], "sh", "-c", "echo run; exit 3"]
    done = subprocess.run(loop, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and done.stdout.count("run") == 1


def test_pytorch_options_follow_kernmlops() -> None:
    o = PytorchBenchmark.Options()
    assert (o.repeat, o.epochs, o.batch_size, o.device) == (1, 1, 32, "cpu")
    with pytest.raises(ValidationError):
        PytorchBenchmark.Options(device="cuda")
    cfg = load_config({"benchmark": {"name": "pytorch", "pytorch": {"repeat": 2}}})
    assert cfg.benchmark_options().repeat == 2
