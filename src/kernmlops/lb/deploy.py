"""The model decides: build, load, switch and unload the ``kmo_lb`` kernel module.

``kmo_lb`` (C source in ``kmod/``, GPL-2.0) puts a kretprobe on
``can_migrate_task``; where the kernel reached the cache-hotness part of the
decision (every hard constraint passed), it evaluates the exported Q20.11
model and, in ``replace`` mode, returns the model's answer. ``shadow`` counts
agreement and decides nothing; ``off`` leaves every answer to the kernel.

The module is built with kbuild against the target kernel's headers (Debian's
``linux-headers-<release>``), on the host for the lab's kernel or in the lab
itself. The private structures it reads (``struct lb_env``, ``rq``,
``cfs_rq``, ``task_group``, ``kthread``) are laid out from the running
kernel's BTF here and passed as a module parameter.

This module imports neither numpy nor polars: it runs in the kernel lab,
where every import is 20-28x slower.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernmlops.errors import KernmlopsError
from kernmlops.lb.modelfile import FIXED_FORMAT, HIDDEN, check_model_doc, read_model_doc

MODULE = "kmo_lb"
SOURCE_DIR = Path(__file__).parent / "kmod"
SOURCES = ("kmo_lb.c", "Kbuild")
SYSFS = Path("/sys/module") / MODULE
MODES = ("off", "shadow", "replace")
NR_HIDDEN = HIDDEN
KPROBES_LIST = Path("/sys/kernel/debug/kprobes/list")
HEADERS_HINT = "in kernmlops' source checkout, make lab installs them for the lab's kernel"

#: (struct, member, byte size or None for an embedded struct), in the order
#: of enum kmo_layout in kmod/kmo_lb.c.
LAYOUT: tuple[tuple[str, str, int | None], ...] = (
    ("lb_env", "sd", 8),
    ("lb_env", "src_rq", 8),
    ("lb_env", "src_cpu", 4),
    ("lb_env", "dst_cpu", 4),
    ("lb_env", "dst_rq", 8),
    ("lb_env", "idle", 4),
    ("lb_env", "flags", 4),
    ("rq", "nr_running", 4),
    ("rq", "nr_numa_running", 4),
    ("rq", "nr_preferred_running", 4),
    ("rq", "clock_task", 8),
    ("rq", "cfs", None),
    ("cfs_rq", "avg", None),
    ("cfs_rq", "next", 8),
    ("cfs_rq", "last", 8),
    ("cfs_rq", "throttle_count", 4),
    ("task_group", "cfs_rq", 8),
    ("kthread", "flags", 8),
)

#: The raw inputs ``eval`` takes, in struct kmo_inputs' order.
EVAL_INPUTS: tuple[str, ...] = (
    "delta_ns", "src_load", "dst_load", "delta_faults", "total_faults", "src_len",
    "src_preferred_len", "dst_len", "nr_balance_failed", "cache_nice_tries", "cpu_idle",
    "cpu_not_idle", "cpu_newly_idle", "same_node", "prefer_src", "prefer_dst", "buddy_hot",
)  # fmt: skip


class KmodError(KernmlopsError):
    """The module cannot be built, loaded, switched or unloaded."""


# --- the model --------------------------------------------------------------------------


@dataclass(frozen=True)
class Q11Model:
    """The integer weights, flat in the module's layout (w1[feature * 10 + hidden])."""

    w1: tuple[int, ...]
    b1: tuple[int, ...]
    w2: tuple[int, ...]
    b2: int
    meta: dict[str, Any]

    def params(self) -> list[str]:
        join = lambda v: ",".join(str(int(x)) for x in v)  # noqa: E731
        return [f"w1={join(self.w1)}", f"b1={join(self.b1)}", f"w2={join(self.w2)}",
                f"b2={self.b2}"]  # fmt: skip


def load_q11(path: Path) -> Q11Model:
    """Read and check ``lb export``'s ``*.q11.json`` as every reader of a model checks
    it (:mod:`kernmlops.lb.modelfile`, without numpy): Q20.11, MLLB's 15 features in
    order; and the network the module runs, 15 -> 10 -> 1. Anything else is refused
    with one clear line."""
    where = str(path)
    doc = read_model_doc(path, KmodError)
    if doc.get("format") != FIXED_FORMAT:
        raise KmodError(
            f"{where} is not a fixed-point model: export it first "
            "(kernmlops lb export MODEL -o DIR)"
        )
    checked = check_model_doc(doc, where, error=KmodError)
    if checked.hidden != NR_HIDDEN:
        raise KmodError(f"{where}: the module runs 15 -> {NR_HIDDEN} -> 1, the model has "
                        f"{checked.hidden} hidden units")  # fmt: skip
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    return Q11Model(
        tuple(map(int, checked.w1)),
        tuple(map(int, checked.b1)),
        tuple(map(int, checked.w2)),
        int(checked.b2),
        meta,
    )


# --- the layout of the kernel's private structures ---------------------------------------


def _size(type_id: int) -> int | None:
    from kernmlops.ebpf.btf import Kind, kernel_type_by_id

    t = kernel_type_by_id(type_id)
    while t is not None and t.kind in (Kind.TYPEDEF, Kind.VOLATILE, Kind.CONST, Kind.RESTRICT,
                                       Kind.TYPE_TAG):  # fmt: skip
        t = kernel_type_by_id(t.ref)
    if t is None:
        return None
    return 8 if t.kind is Kind.PTR else t.size


def kernel_layout() -> list[int]:
    """Byte offsets of the fields kmo_lb reads, from /sys/kernel/btf/vmlinux,
    each checked for its size."""
    from kernmlops.ebpf.btf import Kind, kernel_type

    offsets, cache = [], {}
    for struct, member, size in LAYOUT:
        if struct not in cache:
            cache[struct] = kernel_type(Kind.STRUCT, struct)
            if cache[struct] is None:
                raise KmodError(
                    f"this kernel's BTF has no struct {struct} (needs CONFIG_DEBUG_INFO_BTF)"
                )
        found = [m for m in cache[struct].members if m[0] == member]
        if not found:
            raise KmodError(f"struct {struct} has no field {member} in this kernel: kmo_lb "
                            "knows the 5.17-6.5 scheduler")  # fmt: skip
        _name, type_id, bit_off, bf_size = found[0]
        if bf_size or bit_off % 8:
            raise KmodError(f"{struct}.{member} is a bitfield in this kernel")
        if size is not None and _size(type_id) != size:
            got = _size(type_id)
            raise KmodError(f"{struct}.{member} is {got} bytes here, kmo_lb reads {size}")
        offsets.append(bit_off // 8)
    return offsets


# --- building -----------------------------------------------------------------------------


def default_build_dir() -> Path:
    """$KERNMLOPS_KMOD_DIR, else build/kmod in a source checkout, else the user cache."""
    env = os.environ.get("KERNMLOPS_KMOD_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    if (repo / "pyproject.toml").exists():
        return repo / "build" / "kmod"
    return Path.home() / ".cache" / "kernmlops" / "kmod"


def headers_dir(release: str) -> Path:
    for d in (Path(f"/lib/modules/{release}/build"), Path(f"/usr/src/linux-headers-{release}")):
        if (d / "Makefile").exists():
            return d
    raise KmodError(f"no kernel headers for {release}: apt-get install linux-headers-{release} "
                    f"({HEADERS_HINT})")  # fmt: skip


def source_digest() -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def vermagic(ko: Path) -> str:
    """The kernel release a module was built for (first word of its vermagic)."""
    try:
        data = ko.read_bytes()
    except OSError as err:
        raise KmodError(f"cannot read {ko}: {err.strerror}") from err
    for item in data.split(b"\0"):
        if item.startswith(b"vermagic="):
            return item[len(b"vermagic=") :].decode(errors="replace").split()[0]
    raise KmodError(f"{ko} is not a kernel module (no vermagic)")


def module_path(release: str, build_dir: Path | None = None) -> Path:
    return (build_dir or default_build_dir()) / release / f"{MODULE}.ko"


def is_current(ko: Path, release: str) -> bool:
    """Built from today's sources for ``release``."""
    stamp = ko.parent / ".source"
    try:
        same = stamp.read_text().strip() == source_digest()
        return ko.exists() and same and vermagic(ko) == release
    except (OSError, KmodError):
        return False


def _check_folder(folder: Path) -> None:
    """As root, refuse a module folder another user can change: root builds there
    (make runs its files) and insmods what is there (UnsafeBuildFolder, one line)."""
    from kernmlops.ebpf.buildfolder import check_build_dir

    check_build_dir(folder, what="the kernel module folder", loads="no module (nor builds one)",
                    env="--build-dir or KERNMLOPS_KMOD_DIR")  # fmt: skip


def build(release: str, build_dir: Path | None = None, *, force: bool = False) -> Path:
    """``kmo_lb.ko`` for ``release`` (kbuild against its headers); reused when current."""
    ko = module_path(release, build_dir)
    _check_folder(ko.parent)
    if not force and is_current(ko, release):
        return ko
    headers = headers_dir(release)
    make = shutil.which("make")
    if not make:
        raise KmodError("make not found: apt-get install make gcc")
    out = ko.parent
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in SOURCES:
            shutil.copyfile(SOURCE_DIR / name, out / name)
    except OSError as err:
        raise KmodError(f"cannot write the module's build folder {out}: {err.strerror}") from err
    proc = subprocess.run(
        [make, "-C", str(headers), f"M={out.resolve()}", "modules"],
        capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if proc.returncode != 0 or not ko.exists():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
        raise KmodError(f"building {MODULE} for {release} failed: {tail}")
    (out / ".source").write_text(source_digest() + "\n")
    return ko


def find_or_build(release: str, build_dir: Path | None = None) -> Path:
    """A current module for ``release``: prebuilt (e.g. on the host for the lab),
    else built now; where the build folder is read-only (the lab), in a
    temporary folder."""
    ko = module_path(release, build_dir)
    if is_current(ko, release):
        return ko
    try:
        return build(release, build_dir)
    except KmodError as err:
        if "cannot write" not in str(err):
            raise
    return build(release, Path(tempfile.mkdtemp(prefix="kmo-lb-")))


# --- loading, switching, unloading ----------------------------------------------------------


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise KmodError(f"{what} loads a kernel module: run it as root")


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if not found:
        raise KmodError(f"{name} not found: apt-get install kmod")
    return found


def loaded() -> bool:
    return SYSFS.exists()


def _param(name: str) -> Path:
    return SYSFS / "parameters" / name


def migration_cost(meta: dict[str, Any], override: int | None) -> int:
    if override is not None:
        return override
    v = meta.get("migration_cost_ns", 500_000)
    return int(v) if isinstance(v, int) and v > 0 else 500_000


def deploy(
    model: Q11Model,
    mode: str,
    *,
    ko: Path | None = None,
    build_dir: Path | None = None,
    migration_cost_ns: int | None = None,
) -> Path:
    """Load kmo_lb with ``model`` in ``mode``; returns the module file used."""
    if mode not in MODES:
        raise KmodError(f"mode {mode!r}: one of {', '.join(MODES)}")
    _require_root("lb deploy")
    if loaded():
        raise KmodError(
            f"{MODULE} is already loaded (mode {current_mode()}): switch with "
            "`kernmlops lb mode MODE` or unload with `kernmlops lb undeploy`"
        )
    release = os.uname().release
    _check_folder(ko.parent if ko is not None else module_path(release, build_dir).parent)
    offsets = kernel_layout()
    if ko is None:
        ko = find_or_build(release, build_dir)
    elif vermagic(ko) != release:
        raise KmodError(f"{ko} was built for {vermagic(ko)}, this kernel is {release}")
    params = [
        *model.params(),
        "layout=" + ",".join(map(str, offsets)),
        f"migration_cost_ns={migration_cost(model.meta, migration_cost_ns)}",
        f"mode={mode}",
    ]
    proc = subprocess.run([_tool("insmod"), str(ko), *params], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    if proc.returncode != 0 or not loaded():
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise KmodError(f"the kernel refused {MODULE}: {msg[-1] if msg else 'no message'} "
                        "(dmesg says why); the kernel is unchanged")  # fmt: skip
    return ko


def current_mode() -> str:
    try:
        return _param("mode").read_text().strip()
    except OSError as err:
        raise KmodError(f"{MODULE} is not loaded: kernmlops lb deploy MODEL first") from err


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise KmodError(f"mode {mode!r}: one of {', '.join(MODES)}")
    if not loaded():
        raise KmodError(f"{MODULE} is not loaded: kernmlops lb deploy MODEL --mode {mode}")
    try:
        _param("mode").write_text(mode + "\n")
    except PermissionError as err:
        raise KmodError("switching the mode needs root") from err
    except OSError as err:
        raise KmodError(f"cannot switch {MODULE} to {mode}: {err.strerror}") from err


def stats() -> dict[str, Any]:
    """The module's counters, summed over CPUs, with the derived figures."""
    try:
        text = _param("stats").read_text()
    except OSError as err:
        raise KmodError(f"{MODULE} is not loaded: kernmlops lb deploy MODEL first") from err
    out: dict[str, Any] = {"mode": current_mode()}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        out[key] = int(value)
    d = out.get("decisions", 0)
    out["agreement"] = out["agree"] / d if d else None
    out["ns_mean"] = out["ns_sum"] / d if d else None
    return out


def undeploy() -> None:
    """Unload kmo_lb: can_migrate_task is the kernel's alone again."""
    _require_root("lb undeploy")
    if not loaded():
        raise KmodError(f"{MODULE} is not loaded")
    proc = subprocess.run([_tool("rmmod"), MODULE], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    if proc.returncode != 0 or loaded():
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise KmodError(f"cannot unload {MODULE}: {msg[-1] if msg else 'still loaded'}")


def probed_functions() -> list[str] | None:
    """Lines of the kernel's kprobe list naming can_migrate_task (None when
    debugfs is not mounted or not readable)."""
    try:
        text = KPROBES_LIST.read_text()
    except OSError:
        return None
    return [line for line in text.splitlines() if "can_migrate_task" in line]


def evaluate(rows: list[list[int]]) -> list[tuple[int, list[int]]]:
    """The loaded module's arithmetic on raw inputs (EVAL_INPUTS order): the
    Q20.11 logit and the 15 features of each row."""
    out = []
    for row in rows:
        if len(row) != len(EVAL_INPUTS):
            raise KmodError(f"eval takes {len(EVAL_INPUTS)} inputs per row, got {len(row)}")
        _param("eval").write_text(" ".join(str(int(v)) for v in row) + "\n")
        logit, *x = (int(v) for v in _param("eval").read_text().split())
        out.append((logit, x))
    return out


def bench(n: int) -> float:
    """ns per evaluation (features + MLP) of the last ``evaluate`` row, over
    ``n`` evaluations in the kernel (no probe, no clock read per decision)."""
    _param("bench").write_text(f"{n}\n")
    count, ns = (int(v) for v in _param("bench").read_text().split())
    return ns / count
