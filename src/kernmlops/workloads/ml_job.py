"""A CPU training job to watch from the kernel: LeNet-5 trained with PyTorch on
MNIST-shaped data (1x28x28 images, 10 classes) generated here, with periodic
checkpoints written to disk so its I/O shows up beside its CPU time.

Without torch the job trains a 2-layer numpy MLP instead, and says so on
stderr (``--framework numpy`` asks for it; ``--framework torch`` refuses to
fall back). The ml-training and pytorch benchmarks run this file.

Run it as ``python -m kernmlops.workloads.ml_job --epochs 5`` or by file path
(the benchmarks do the latter, so the job does not import kernmlops). It
prints one JSON line per event, flushed at once so a stopped job keeps what
it printed::

    {"kind": "setup", "framework": "torch", "seconds": ..., "samples": ..., ...}
    {"kind": "checkpoint", "step": 40, "epoch": 1, "bytes": ..., "seconds": ..., "path": ...}
    {"kind": "epoch", "epoch": 1, "steps": 79, "seconds": ..., "cpu_seconds": ...,
     "loss": ..., "accuracy": ...}
    {"kind": "done", "epochs": N, "steps": ..., "checkpoints": ..., "checkpoint_bytes": ...,
     "seconds": ..., "cpu_seconds": ..., "uptime_us": ..., "threads": ..., "pid": ...}

"steps" are optimizer steps (one per minibatch), counted from the start.
"seconds" are wall time (the done record's: from the start of set-up to the
end); "cpu_seconds" of an epoch is the process' CPU time during it, of the
done record the process' CPU time since it started (data-loader workers,
which are processes of their own, not included), read at "uptime_us" (the
monotonic clock of the kernel's tracing timestamps; the interpreter's exit
comes after it).

A checkpoint is written to a temporary name, fsync'ed and renamed, so its
blocks reach the disk from the job's own context (the job's I/O, not the
kernel's writeback threads'); the newest ``--keep-checkpoints`` are kept.

It imports numpy and torch only when it runs, so the benchmarks (imported by
benchmark discovery) can import this module for nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: MNIST's shape: one channel of 28 x 28 pixels.
IMAGE_SIDE = 28
FRAMEWORKS = ("auto", "torch", "numpy")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kernmlops.workloads.ml_job",
        description="Train LeNet-5 (PyTorch; a numpy MLP without it) on generated "
        "MNIST-shaped data; one JSON line per epoch and checkpoint.",
    )

    def positive(kind: type) -> Any:
        def convert(text: str) -> Any:
            value = kind(text)
            if value <= 0:
                raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
            return value

        return convert

    def at_least_zero(text: str) -> int:
        value = int(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    p.add_argument("--framework", choices=FRAMEWORKS, default="auto",
                   help="torch: LeNet-5; numpy: the MLP; auto: torch when installed")  # fmt: skip
    p.add_argument("--epochs", type=positive(int), default=10)
    p.add_argument("--samples", type=positive(int), default=50_000, help="training samples")
    p.add_argument("--test-samples", type=positive(int), default=5_000, help="held-out samples")
    p.add_argument("--features", type=positive(int), default=64, help="inputs (numpy MLP only)")
    p.add_argument("--classes", type=positive(int), default=10)
    p.add_argument("--hidden", type=positive(int), default=256, help="hidden units (numpy MLP)")
    p.add_argument("--batch-size", type=positive(int), default=128)
    p.add_argument("--lr", type=positive(float), default=0.05, help="SGD learning rate")
    p.add_argument("--separation", type=positive(float), default=0.5,
                   help="spread of the class centres or contrast of the class shapes "
                   "(larger: easier)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="BLAS/OpenMP/torch threads; 0 = the libraries' default")  # fmt: skip
    p.add_argument("--workers", type=at_least_zero, default=0,
                   help="data-loader worker processes (torch; forked once per run)")  # fmt: skip
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="write checkpoints here (none without it)")  # fmt: skip
    p.add_argument("--checkpoint-every", type=at_least_zero, default=0,
                   help="steps between checkpoints; 0 = at the end of each epoch")  # fmt: skip
    p.add_argument("--keep-checkpoints", type=positive(int), default=2,
                   help="newest checkpoints kept; older ones are removed")  # fmt: skip
    return p


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


class Checkpointer:
    """Writes checkpoints durably (temporary name, fsync, rename, fsync of the
    folder) and keeps the newest few."""

    def __init__(self, folder: Path | None, every: int, keep: int) -> None:
        self.folder = folder
        self.every = every
        self.keep = keep
        self.written: list[Path] = []
        self.count = 0
        self.bytes = 0
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def due(self, step: int, end_of_epoch: bool) -> bool:
        if self.folder is None:
            return False
        return step % self.every == 0 if self.every else end_of_epoch

    def write(self, step: int, epoch: int, save: Callable[[BinaryIO], None], suffix: str) -> None:
        assert self.folder is not None
        t0 = time.perf_counter()
        path = self.folder / f"ckpt-{step:09d}{suffix}"
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as out:
            save(out)
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
        tmp.replace(path)
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.written.append(path)
        while len(self.written) > self.keep:
            self.written.pop(0).unlink(missing_ok=True)
        self.count += 1
        self.bytes += size
        emit({"kind": "checkpoint", "step": step, "epoch": epoch, "bytes": size,
              "seconds": time.perf_counter() - t0, "path": str(path)})  # fmt: skip


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


def train_numpy(args: argparse.Namespace, ckpt: Checkpointer) -> dict[str, Any]:
    import numpy as np

    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    x, y = make_data(rng, args.samples + args.test_samples, args.features, args.classes,
                     args.separation)  # fmt: skip
    x_train, y_train = x[: args.samples], y[: args.samples]
    x_test, y_test = x[args.samples :], y[args.samples :]
    model = MLP(rng, args.features, args.hidden, args.classes)
    emit({"kind": "setup", "framework": "numpy", "model": "mlp",
          "seconds": time.perf_counter() - start, "samples": args.samples,
          "test_samples": args.test_samples, "features": args.features,
          "classes": args.classes, "hidden": args.hidden, "batch_size": args.batch_size,
          "parameters": model.parameters, "pid": os.getpid()})  # fmt: skip

    def save(out: BinaryIO) -> None:
        np.savez(out, w1=model.w1, b1=model.b1, w2=model.w2, b2=model.b2)

    step = 0
    for epoch in range(1, args.epochs + 1):
        t0, c0 = time.perf_counter(), cpu_seconds()
        order = rng.permutation(args.samples)
        total, seen = 0.0, 0
        for i in range(0, args.samples, args.batch_size):
            idx = order[i : i + args.batch_size]
            total += model.step(x_train[idx], y_train[idx], args.lr) * len(idx)
            seen += len(idx)
            step += 1
            last = i + args.batch_size >= args.samples
            if ckpt.due(step, last):
                ckpt.write(step, epoch, save, ".npz")
        accuracy = model.accuracy(x_test, y_test)
        seconds = time.perf_counter() - t0
        emit({"kind": "epoch", "epoch": epoch, "steps": step, "seconds": seconds,
              "cpu_seconds": cpu_seconds() - c0, "loss": total / seen, "accuracy": accuracy,
              "samples_per_s": seen / seconds})  # fmt: skip
    return {"steps": step, "framework": "numpy"}


def make_images(gen: Any, samples: int, classes: int, contrast: float) -> tuple[Any, Any]:
    """MNIST-shaped images: each class is a smooth random shape (a 7 x 7 grid of
    random intensities, upsampled to 28 x 28), shown shifted by up to 2 pixels
    and under unit noise. ``gen`` is a torch.Generator; the shapes come first, so
    a seed gives the same classes for any sample count."""
    import torch
    import torch.nn.functional as F

    coarse = torch.rand((classes, 1, 7, 7), generator=gen)
    shapes = F.interpolate(coarse, size=(IMAGE_SIDE, IMAGE_SIDE), mode="bilinear",
                           align_corners=False)  # fmt: skip
    shapes = (shapes - shapes.mean(dim=(2, 3), keepdim=True)) * (4.0 * contrast)
    labels = torch.randint(0, classes, (samples,), generator=gen)
    shifts = torch.randint(-2, 3, (samples, 2), generator=gen)
    images = shapes[labels].clone()
    for dy in range(-2, 3):  # roll in groups: 25 tensor ops, not one per sample
        for dx in range(-2, 3):
            sel = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            if sel.any():
                images[sel] = torch.roll(images[sel], shifts=(dy, dx), dims=(2, 3))
    images += torch.randn(images.shape, generator=gen)
    return images, labels


def lenet5(classes: int) -> Any:
    """LeNet-5 (LeCun et al. 1998) as usually written for 28 x 28 inputs: the
    first convolution pads by 2 to give the original 32 x 32 field; ReLU and max
    pooling in place of the original's scaled tanh and subsampling."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, classes),
    )  # fmt: skip


def train_torch(args: argparse.Namespace, ckpt: Checkpointer) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
        with contextlib.suppress(RuntimeError):  # settable once per process (in tests: run twice)
            torch.set_num_interop_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    x, y = make_images(gen, args.samples + args.test_samples, args.classes, args.separation)
    x_test, y_test = x[args.samples :], y[args.samples :]
    train_set = TensorDataset(x[: args.samples], y[: args.samples])
    loader = DataLoader(
        train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        persistent_workers=args.workers > 0, generator=torch.Generator().manual_seed(args.seed),
    )  # fmt: skip
    model = lenet5(args.classes)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    params = sum(p.numel() for p in model.parameters())
    emit({"kind": "setup", "framework": "torch", "model": "lenet5",
          "torch_version": torch.__version__, "seconds": time.perf_counter() - start,
          "samples": args.samples, "test_samples": args.test_samples,
          "image": [1, IMAGE_SIDE, IMAGE_SIDE], "classes": args.classes,
          "batch_size": args.batch_size, "parameters": params, "workers": args.workers,
          "pid": os.getpid()})  # fmt: skip

    step = 0
    batches = len(loader)

    def save(out: BinaryIO) -> None:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "step": step}, out)  # fmt: skip

    for epoch in range(1, args.epochs + 1):
        t0, c0 = time.perf_counter(), cpu_seconds()
        model.train()
        total, seen = 0.0, 0
        for i, (xb, yb) in enumerate(loader, 1):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            total += loss.item() * len(yb)
            seen += len(yb)
            if ckpt.due(step, i == batches):
                ckpt.write(step, epoch, save, ".pt")
        model.eval()
        with torch.no_grad():
            right = sum(int((model(x_test[j : j + 4096]).argmax(1) == y_test[j : j + 4096]).sum())
                        for j in range(0, len(y_test), 4096))  # fmt: skip
        seconds = time.perf_counter() - t0
        emit({"kind": "epoch", "epoch": epoch, "steps": step, "seconds": seconds,
              "cpu_seconds": cpu_seconds() - c0, "loss": total / seen,
              "accuracy": right / len(y_test), "samples_per_s": seen / seconds})  # fmt: skip
    return {"steps": step, "framework": "torch"}


def train(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    ckpt = Checkpointer(args.checkpoint_dir, args.checkpoint_every, args.keep_checkpoints)
    framework = args.framework
    if framework == "auto":
        framework = "torch" if torch_available() else "numpy"
        if framework == "numpy":
            print("ml_job: torch is not installed: training the numpy MLP fallback instead "
                  "of LeNet-5 (install a CPU build of torch: make ml)", file=sys.stderr,
                  flush=True)  # fmt: skip
    out = train_torch(args, ckpt) if framework == "torch" else train_numpy(args, ckpt)
    emit({"kind": "done", "framework": out["framework"], "epochs": args.epochs,
          "steps": out["steps"], "checkpoints": ckpt.count, "checkpoint_bytes": ckpt.bytes,
          "seconds": time.perf_counter() - start, "cpu_seconds": cpu_seconds(),
          "uptime_us": time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000,
          "threads": thread_count(), "pid": os.getpid()})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    if args.framework == "torch" and not torch_available():
        p.error("--framework torch: torch is not installed (make ml installs a CPU build)")
    if args.threads:
        # Read by the BLAS/OpenMP runtimes when numpy/torch load: set before importing them.
        for var in THREAD_VARIABLES:
            os.environ[var] = str(args.threads)
    try:
        train(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except OSError as err:  # a checkpoint folder that cannot be written, a full disk
        print(f"ml_job: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
