"""A small CPU training job to watch from the kernel: a 2-layer MLP (numpy only)
trained with minibatch SGD on a generated classification data set.

Run it as ``python -m kernmlops.workloads.ml_job --epochs 5`` or by file path
(the ml-training benchmark does the latter, so the job does not import
kernmlops). It prints one JSON line per event, flushed at once so a stopped
job keeps what it printed::

    {"kind": "setup", "seconds": ..., "samples": ..., ...}
    {"kind": "epoch", "epoch": 1, "seconds": ..., "cpu_seconds": ..., "loss": ..., "accuracy": ...}
    {"kind": "done", "epochs": N, "seconds": ..., "cpu_seconds": ..., "threads": ..., "pid": ...}

"seconds" are wall time (the done record's: from the start of set-up to the
end); "cpu_seconds" of an epoch is the process' CPU time during it, of the
done record the process' CPU time since it started.

It imports numpy only when it runs, so the ml-training benchmark (imported
by benchmark discovery) can import this module for nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kernmlops.workloads.ml_job",
        description="Train a 2-layer MLP with minibatch SGD; one JSON line per epoch.",
    )

    def positive(kind: type) -> Any:
        def convert(text: str) -> Any:
            value = kind(text)
            if value <= 0:
                raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
            return value

        return convert

    p.add_argument("--epochs", type=positive(int), default=10)
    p.add_argument("--samples", type=positive(int), default=50_000, help="training samples")
    p.add_argument("--test-samples", type=positive(int), default=5_000, help="held-out samples")
    p.add_argument("--features", type=positive(int), default=64)
    p.add_argument("--classes", type=positive(int), default=10)
    p.add_argument("--hidden", type=positive(int), default=256, help="hidden units")
    p.add_argument("--batch-size", type=positive(int), default=128)
    p.add_argument("--lr", type=positive(float), default=0.05, help="SGD learning rate")
    p.add_argument("--separation", type=positive(float), default=0.5,
                   help="spread of the class centres (larger: easier)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="BLAS/OpenMP threads; 0 = the libraries' default")  # fmt: skip
    return p


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def make_data(
    rng: np.random.Generator, samples: int, features: int, classes: int, separation: float
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters: a few centres per class, unit noise around each, so the
    classes are not linearly separable when there are several centres per class."""
    import numpy as np

    per_class = 2
    centres = rng.normal(0.0, separation, size=(classes * per_class, features))
    which = rng.integers(0, classes * per_class, size=samples)
    x = centres[which] + rng.normal(0.0, 1.0, size=(samples, features))
    return x.astype(np.float32), (which % classes).astype(np.int64)


class MLP:
    """ReLU hidden layer, softmax output, cross-entropy loss, plain SGD."""

    def __init__(self, rng: np.random.Generator, features: int, hidden: int, classes: int) -> None:
        import numpy as np

        # He initialisation for the ReLU layer, Glorot-like for the output.
        self.w1 = (rng.normal(size=(features, hidden)) * np.sqrt(2.0 / features)).astype(np.float32)
        self.b1 = np.zeros(hidden, np.float32)
        self.w2 = (rng.normal(size=(hidden, classes)) * np.sqrt(1.0 / hidden)).astype(np.float32)
        self.b2 = np.zeros(classes, np.float32)

    @property
    def parameters(self) -> int:
        return sum(a.size for a in (self.w1, self.b1, self.w2, self.b2))

    def logits(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Hidden activations (after ReLU) and output logits."""
        import numpy as np

        h = x @ self.w1 + self.b1
        np.maximum(h, 0.0, out=h)
        return h, h @ self.w2 + self.b2

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One SGD step on a minibatch; the batch's mean loss before the step."""
        import numpy as np

        h, z = self.logits(x)
        z -= z.max(axis=1, keepdims=True)  # stable softmax
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        n = len(y)
        rows = np.arange(n)
        loss = float(-np.log(np.maximum(p[rows, y], 1e-12)).mean())
        dz = p
        dz[rows, y] -= 1.0
        dz /= n
        dh = dz @ self.w2.T
        dh[h <= 0] = 0.0
        self.w2 -= lr * (h.T @ dz)
        self.b2 -= lr * dz.sum(axis=0)
        self.w1 -= lr * (x.T @ dh)
        self.b1 -= lr * dh.sum(axis=0)
        return loss

    def accuracy(self, x: np.ndarray, y: np.ndarray, chunk: int = 8192) -> float:
        right = 0
        for i in range(0, len(y), chunk):
            _, z = self.logits(x[i : i + chunk])
            right += int((z.argmax(axis=1) == y[i : i + chunk]).sum())
        return right / len(y)


def cpu_seconds() -> float:
    """CPU time of the whole process (all threads) since it started."""
    t = os.times()
    return t.user + t.system


def thread_count() -> int | None:
    """Threads of this process as the kernel lists them (BLAS workers included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def train(args: argparse.Namespace) -> None:
    import numpy as np

    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    x, y = make_data(rng, args.samples + args.test_samples, args.features, args.classes,
                     args.separation)  # fmt: skip
    x_train, y_train = x[: args.samples], y[: args.samples]
    x_test, y_test = x[args.samples :], y[args.samples :]
    model = MLP(rng, args.features, args.hidden, args.classes)
    emit({"kind": "setup", "seconds": time.perf_counter() - start, "samples": args.samples,
          "test_samples": args.test_samples, "features": args.features,
          "classes": args.classes, "hidden": args.hidden, "batch_size": args.batch_size,
          "parameters": model.parameters, "pid": os.getpid()})  # fmt: skip
    for epoch in range(1, args.epochs + 1):
        t0, c0 = time.perf_counter(), cpu_seconds()
        order = rng.permutation(args.samples)
        total, seen = 0.0, 0
        for i in range(0, args.samples, args.batch_size):
            idx = order[i : i + args.batch_size]
            total += model.step(x_train[idx], y_train[idx], args.lr) * len(idx)
            seen += len(idx)
        accuracy = model.accuracy(x_test, y_test)
        seconds = time.perf_counter() - t0
        emit({"kind": "epoch", "epoch": epoch, "seconds": seconds,
              "cpu_seconds": cpu_seconds() - c0, "loss": total / seen, "accuracy": accuracy,
              "samples_per_s": seen / seconds})  # fmt: skip
    emit({"kind": "done", "epochs": args.epochs, "seconds": time.perf_counter() - start,
          "cpu_seconds": cpu_seconds(), "threads": thread_count(), "pid": os.getpid()})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads < 0:
        parser().error(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        # Read by the BLAS/OpenMP runtimes when numpy loads: set before importing it.
        for var in THREAD_VARIABLES:
            os.environ[var] = str(args.threads)
    try:
        train(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
