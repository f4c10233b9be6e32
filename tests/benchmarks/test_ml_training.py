"""The ml-training and pytorch benchmarks and their job: LeNet-5 with PyTorch, and the
numpy MLP fallback."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.ml_training import (
    JOB_SCRIPT,
    MlTrainingBenchmark,
    PytorchBenchmark,
    job_python,
    job_result_rows,
    parse_job_output,
)
from kernmlops.config import load_config
from kernmlops.workloads import ml_job

SMALL = ["--framework", "numpy", "--samples", "3000", "--test-samples", "1000",
         "--features", "16", "--classes", "3", "--hidden", "32", "--batch-size", "32",
         "--lr", "0.05", "--seed", "1"]  # fmt: skip


def _run_job(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    assert ml_job.main(list(args)) == 0
    return parse_job_output(capsys.readouterr().out)


def test_job_learns_a_separable_problem(capsys: pytest.CaptureFixture[str]) -> None:
    records = _run_job(capsys, *SMALL, "--epochs", "4", "--separation", "1.0")
    kinds = [r["kind"] for r in records]
    assert kinds == ["setup", "epoch", "epoch", "epoch", "epoch", "done"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4]
    losses = [r["loss"] for r in epochs]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    # Cross-entropy starts near ln(3) for 3 classes (untrained) and drops well below.
    assert losses[-1] < 0.5 * np.log(3)
    assert epochs[-1]["accuracy"] > 0.9
    assert epochs[-1]["accuracy"] > epochs[0]["accuracy"]  # it learned, not just guessed well
    assert all(r["seconds"] > 0 for r in epochs)
    done = records[-1]
    setup = records[0]
    # The job's own total covers set-up and the epochs, and little else.
    assert done["seconds"] == pytest.approx(setup["seconds"] + sum(r["seconds"] for r in epochs),
                                            rel=0.05, abs=0.02)  # fmt: skip


def test_job_accuracy_is_chance_without_signal(capsys: pytest.CaptureFixture[str]) -> None:
    # Class centres all but identical: no model can beat guessing among 3 classes.
    records = _run_job(capsys, *SMALL, "--epochs", "2", "--separation", "1e-6")
    last = [r for r in records if r["kind"] == "epoch"][-1]
    assert 0.2 < last["accuracy"] < 0.47
    assert last["loss"] > 0.9 * np.log(3)


def test_backprop_matches_numerical_gradient() -> None:
    rng = np.random.default_rng(3)
    model = ml_job.MLP(rng, features=5, hidden=7, classes=4)
    for name in ("w1", "b1", "w2", "b2"):  # float64 for finite differences
        setattr(model, name, getattr(model, name).astype(np.float64))
    model.b1 += 0.1  # keep hidden units away from the ReLU kink
    x = rng.normal(size=(6, 5))
    y = rng.integers(0, 4, size=6)

    def loss() -> float:
        _, z = model.logits(x)
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(6), y].mean())

    before = {n: getattr(model, n).copy() for n in ("w1", "b1", "w2", "b2")}
    numeric = {}
    for name, param in before.items():
        grad = np.zeros_like(param)
        live = getattr(model, name)
        for idx in np.ndindex(param.shape):
            old = live[idx]
            live[idx] = old + 1e-6
            up = loss()
            live[idx] = old - 1e-6
            down = loss()
            live[idx] = old
            grad[idx] = (up - down) / 2e-6
        numeric[name] = grad
    reported = model.step(x, y, lr=1.0)
    assert reported == pytest.approx(loss_at(before, x, y), rel=1e-9)
    for name, param in before.items():
        analytic = param - getattr(model, name)  # lr = 1: the update is the gradient
        np.testing.assert_allclose(analytic, numeric[name], rtol=1e-4, atol=1e-7)


def loss_at(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy written out independently of ml_job."""
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    z = h @ params["w2"] + params["b2"]
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return float(-np.log(p[np.arange(len(y)), y]).mean())


def test_job_bad_arguments_exit_2() -> None:
    for bad in (["--epochs", "0"], ["--lr", "-1"], ["--threads", "-2"], ["--nope"]):
        with pytest.raises(SystemExit) as err:
            ml_job.main(bad)
        assert err.value.code == 2


def test_job_script_runs_alone_with_its_threads() -> None:
    # By file path, as the benchmark runs it: numpy loads, kernmlops does not.
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(JOB_SCRIPT), *SMALL, "--epochs", "1",
         "--threads", "1"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    imported = {ln.split("|")[-1].strip() for ln in done.stderr.splitlines() if "|" in ln}
    assert "numpy" in imported
    assert not any(m.startswith(("kernmlops", "polars", "pydantic")) for m in imported)
    records = parse_job_output(done.stdout)
    assert records[-1]["kind"] == "done"
    assert records[-1]["framework"] == "numpy"
    assert records[-1]["threads"] == 1  # no BLAS worker threads with --threads 1


def test_importing_the_benchmarks_does_not_load_numpy() -> None:
    # Discovery imports ml_training, which imports the job module: that must stay cheap.
    code = "import sys, kernmlops.benchmarks.ml_training; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_job_runs_as_a_module_without_warnings() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops.workloads.ml_job", *SMALL, "--epochs", "1"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stderr == ""
    assert [r["kind"] for r in parse_job_output(done.stdout)] == ["setup", "epoch", "done"]


def test_job_without_torch_says_it_falls_back_to_numpy(tmp_path: Path) -> None:
    # torch hidden from the job (a None entry in sys.modules: find_spec says absent).
    hide = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
    small = [a for a in SMALL if a not in ("--framework", "numpy")]
    done = subprocess.run([sys.executable, "-c", hide, str(JOB_SCRIPT), *small, "--epochs", "1",
                           "--checkpoint-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "torch is not installed: training the numpy MLP fallback" in done.stderr
    records = parse_job_output(done.stdout)
    assert records[0]["framework"] == "numpy" and records[-1]["framework"] == "numpy"
    assert records[-1]["checkpoints"] == 1 and len(list(tmp_path.glob("ckpt-*.npz"))) == 1
    refused = subprocess.run([sys.executable, "-c", hide, str(JOB_SCRIPT), "--framework",
                              "torch"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2
    assert "--framework torch: torch is not installed" in refused.stderr


def test_parse_job_output_skips_noise_and_cut_lines() -> None:
    text = "\n".join([
        json.dumps({"kind": "setup", "seconds": 0.5}),
        "RuntimeWarning: overflow",
        json.dumps({"kind": "epoch", "epoch": 1, "seconds": 1.5, "cpu_seconds": 1.4,
                    "loss": 0.7, "accuracy": 0.8, "samples_per_s": 1000.0}),
        '{"kind": "epoch", "epoch": 2, "seco',  # killed mid-line
        json.dumps({"no": "kind"}),
    ])  # fmt: skip
    records = parse_job_output(text)
    assert [r["kind"] for r in records] == ["setup", "epoch"]
    assert job_result_rows(records) == [
        ("epoch_1", "seconds", 1.5, "s"),
        ("epoch_1", "cpu_seconds", 1.4, "s"),
        ("epoch_1", "loss", 0.7, "nat"),
        ("epoch_1", "accuracy", 0.8, "fraction"),
        ("epoch_1", "samples_per_s", 1000.0, "1/s"),
        ("total", "epochs", 1.0, "count"),
        ("total", "seconds", 1.5, "s"),
        ("setup", "seconds", 0.5, "s"),
    ]


def test_results_from_a_real_job_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ml_job.main([*SMALL, "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    (tmp_path / "stdout.txt").write_text(out)
    bench = MlTrainingBenchmark()
    frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=tmp_path / "stdout.txt"))
    assert frame is not None
    seconds = frame.filter((frame["metric"] == "seconds") & frame["key"].str.starts_with("epoch_"))
    assert seconds["key"].to_list() == ["epoch_1", "epoch_2", "epoch_3"]
    total = frame.filter((frame["key"] == "total") & (frame["metric"] == "seconds"))["value"][0]
    assert total == pytest.approx(seconds["value"].sum())
    epochs = [json.loads(ln) for ln in out.splitlines() if '"epoch"' in ln]
    assert seconds["value"].to_list() == [r["seconds"] for r in epochs]
    assert bench.results(BenchmarkRun(tmp_path, 1)) is None


def test_options_reach_the_job_unchanged() -> None:
    opts = MlTrainingBenchmark.Options(epochs=3, samples=123, test_samples=45, features=6,
                                       classes=4, hidden=7, batch_size=8, learning_rate=0.125,
                                       separation=2.5, seed=9, threads=2, workers=3,
                                       framework="numpy", checkpoint_every=5,
                                       keep_checkpoints=4, checkpoint_dir="/ck")  # fmt: skip
    bench = MlTrainingBenchmark(opts)
    args = ml_job.parser().parse_args(bench.job_args())
    assert vars(args) == {"epochs": 3, "samples": 123, "test_samples": 45, "features": 6,
                          "classes": 4, "hidden": 7, "batch_size": 8, "lr": 0.125,
                          "separation": 2.5, "seed": 9, "threads": 2, "framework": "numpy",
                          "workers": 3, "checkpoint_dir": Path("/ck"), "checkpoint_every": 5,
                          "keep_checkpoints": 4}  # fmt: skip
    launch = bench.launch()
    assert launch is not None
    assert launch.argv[:2] == [job_python(), str(JOB_SCRIPT)]
    assert launch.capture_output
    assert launch.env == dict.fromkeys(ml_job.THREAD_VARIABLES, "2")
    assert MlTrainingBenchmark(MlTrainingBenchmark.Options(threads=0)).launch().env == {}
    assert bench.describe().startswith("ml-training: ml_job.py --framework numpy --epochs 3")
    # Without a folder of its own the checkpoints go in the run's private folder.
    plain = MlTrainingBenchmark()
    plain.setup(Path("/run/x"))
    assert plain.checkpoint_dir() == Path("/run/x/checkpoints")


def test_options_validation_and_config_section() -> None:
    assert MlTrainingBenchmark.name == "ml-training"
    assert MlTrainingBenchmark.default_filter == "tree"
    for bad in ({"epochs": 0}, {"classes": 1}, {"learning_rate": 0}, {"threads": -1},
                {"epoch": 3}, {"framework": "jax"}, {"workers": -1}):  # fmt: skip
        with pytest.raises(ValidationError):
            MlTrainingBenchmark.Options(**bad)
    cfg = load_config({"benchmark": {"name": "ml-training", "ml_training": {"epochs": 2}}})
    assert cfg.benchmark_options().epochs == 2


def test_pytorch_without_torch_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernmlops.benchmarks import ml_training
    from kernmlops.errors import BenchmarkError

    monkeypatch.setattr(ml_training, "has_torch", lambda python: False)
    with pytest.raises(BenchmarkError) as info:
        PytorchBenchmark().check()
    assert "pytorch: torch is not installed for" in str(info.value)
    assert "make ml" in str(info.value)
    MlTrainingBenchmark().check()  # auto: falls back to numpy, no error
    # The interpreter: this one unless the system python3 has torch and this one has not.
    monkeypatch.setattr(ml_training, "has_torch", lambda python: python == "/usr/bin/python3")
    expected = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    assert job_python() == expected
    assert job_python("/opt/py") == "/opt/py"


@pytest.mark.parametrize("cls", [MlTrainingBenchmark, PytorchBenchmark])
def test_an_interpreter_that_is_not_there_is_refused_by_check(
    cls: type[MlTrainingBenchmark] | type[PytorchBenchmark], tmp_path: Path
) -> None:
    """It was found missing only once the probes were attached: exit 127, and the
    reason in the collection's benchmark_output/stderr.txt alone."""
    from kernmlops.errors import BenchmarkError

    missing = str(tmp_path / "python3")
    section = cls.name.replace("-", "_")
    with pytest.raises(BenchmarkError, match=rf"interpreter '{missing}' \(benchmark\.{section}"):
        cls(cls.Options(python=missing)).check()
    plain = tmp_path / "plain"  # there, but not a program
    plain.write_text("")
    with pytest.raises(BenchmarkError, match="not an executable program"):
        cls(cls.Options(python=str(plain))).check()
    MlTrainingBenchmark(
        MlTrainingBenchmark.Options(python=sys.executable, framework="numpy")
    ).check()
