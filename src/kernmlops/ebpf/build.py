"""Build the BPF objects: vmlinux.h from the running kernel's BTF, then clang.

Outputs go to a build folder outside the sources; an object is rebuilt only
when its source or a header changed.

An installed wheel carries its objects (and their .spec.json) in
``kernmlops/bpf_objects``, built once when the wheel was made (setup.py calls
:func:`ship`): CO-RE objects load on any kernel with BTF, so the machine that
runs them needs libbpf, not clang, bpftool or a vmlinux.h. A source checkout
builds into ``build/bpf`` and rebuilds what is older than its sources.

An installed wheel given another folder (``KERNMLOPS_BPF_DIR``: the systemd
unit's cache, which ``.bpf.c`` metric sets compile into) fills it with copies
of its own objects where they are missing or older than the sources, not with
clang: ``shipped.json`` records the digest of every shipped file and of the
sources they were built from, and an object is copied only when both still
match (else it is compiled, as before).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from kernmlops.ebpf.buildfolder import (
    PACKAGED_DIR,
    SOURCE_DIR,
    BuildError,
    UnsafeBuildFolder,
    check_build_dir,
)
from kernmlops.errors import why_not_written
from kernmlops.fileio import write_atomic

__all__ = [
    "NATIVE_LIBRARY",
    "PACKAGED_DIR",
    "SOURCE_DIR",
    "BuildError",
    "UnsafeBuildFolder",
    "build",
    "check_build_dir",
    "compile_object",
    "default_build_dir",
    "object_path",
    "ship",
    "shipped",
    "sources",
]
#: the native ring copier (kernmlops.ebpf.copier) and file sampler
#: (kernmlops.ebpf.sampler), one library built and shipped beside the objects
NATIVE_LIBRARY = "libkmo_ringcopy.so"
NATIVE_SOURCES = tuple(
    SOURCE_DIR.parent / "native" / name
    for name in ("ringcopy.c", "runway.c", "diskqueue.c", "sampler.c")
)
NATIVE_HEADERS = tuple(sorted((SOURCE_DIR.parent / "native").glob("*.h")))
#: beside the shipped objects: the SHA-256 of each of them and of the sources they
#: were built from (written by :func:`ship`)
SHIPPED_RECORD = "shipped.json"
VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
_ARCH = {"x86_64": "x86", "aarch64": "arm64", "arm64": "arm64", "riscv64": "riscv"}


def default_build_dir() -> Path:
    """$KERNMLOPS_BPF_DIR, else build/bpf in a source checkout, else the objects an
    installed wheel ships, else the user cache (built there on first use)."""
    env = os.environ.get("KERNMLOPS_BPF_DIR")
    if env:
        return Path(env)
    repo = SOURCE_DIR.parents[2]
    if (repo / "pyproject.toml").exists():
        return repo / "build" / "bpf"
    if shipped():
        return PACKAGED_DIR
    return Path.home() / ".cache" / "kernmlops" / "bpf"


def shipped() -> bool:
    """Whether this installation carries prebuilt objects (a wheel)."""
    return any(PACKAGED_DIR.glob("*.bpf.o"))


def _tool(name: str, package: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if not path:
        raise BuildError(f"{name} not found: install it (apt-get install {package})")
    return path


def sources() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.bpf.c"))


def object_path(name: str, build_dir: Path | None = None) -> Path:
    """Where the object built from ``bpf/<name>.bpf.c`` lives."""
    return (build_dir or default_build_dir()) / f"{name}.bpf.o"


def vmlinux_header(build_dir: Path) -> Path:
    header = build_dir / "vmlinux.h"
    if header.exists() and header.stat().st_size > 0:
        return header
    if not VMLINUX_BTF.exists():
        raise BuildError(
            f"{VMLINUX_BTF} is missing: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF)"
        )
    bpftool = _tool("bpftool", "bpftool")
    tmp = header.with_suffix(".h.tmp")
    with tmp.open("wb") as out:
        proc = subprocess.run(
            [bpftool, "btf", "dump", "file", str(VMLINUX_BTF), "format", "c"],
            stdout=out,
            stderr=subprocess.PIPE,
        )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"bpftool failed: {proc.stderr.decode(errors='replace').strip()}")
    tmp.replace(header)
    return header


def _needs_build(src: Path, obj: Path, headers: list[Path]) -> bool:
    try:
        if not obj.exists():
            return True
        built = obj.stat().st_mtime
    except PermissionError:  # e.g. another user with root's HOME (setpriv, su without -l)
        raise BuildError(
            f"cannot read the BPF objects' folder {obj.parent}: permission denied (set "
            "KERNMLOPS_BPF_DIR to a folder this user may read, or HOME to its own)"
        ) from None
    return any(p.stat().st_mtime > built for p in [src, *headers])


def build(
    build_dir: Path | None = None, *, force: bool = False, verbose: bool = False
) -> list[Path]:
    """Compile every ``*.bpf.c`` that changed; return the objects' paths."""
    build_dir = build_dir or default_build_dir()
    check_build_dir(build_dir)
    srcs = sources()
    headers = sorted(SOURCE_DIR.glob("*.h"))
    objs = [object_path(s.name.removesuffix(".bpf.c"), build_dir) for s in srcs]
    if build_dir == PACKAGED_DIR and not force:
        # Shipped: never rebuilt (an install sets file times in no useful order).
        missing = [o.name for o in objs if not o.exists()]
        if missing:
            raise BuildError(
                f"this installation lacks {', '.join(missing)} in {PACKAGED_DIR}: reinstall "
                "kernmlops, or set KERNMLOPS_BPF_DIR to a folder to build them in"
            )
        return objs
    todo = [(s, o) for s, o in zip(srcs, objs, strict=True) if force or _needs_build(s, o, headers)]
    if not todo:
        if os.access(build_dir, os.W_OK | os.X_OK):
            build_native(build_dir, verbose=verbose)
        return objs  # a user who cannot write the folder may still read built objects
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BuildError(
            f"cannot create the BPF build folder {build_dir}: {err.strerror} "
            "(set KERNMLOPS_BPF_DIR, or run `kernmlops build-bpf` as its owner)"
        ) from None
    if not os.access(build_dir, os.W_OK | os.X_OK):
        raise BuildError(
            f"{len(todo)} BPF objects need building but {build_dir} is not writable "
            "(set KERNMLOPS_BPF_DIR, or run `kernmlops build-bpf` as its owner)"
        )
    from kernmlops.ebpf.spec import object_spec

    record = None if force else _shipped_record(build_dir)
    if record is not None and _headers_as_shipped(record, headers):
        # an installed wheel's own objects, where they were built from these sources
        todo = [
            (src, obj)
            for src, obj in todo
            if not (
                _built_from_these(record, [src])
                and _copy_shipped(record, obj.name, obj, with_spec=True)
            )
        ]
    for src, obj in todo:
        compile_object(src, obj, vmlinux_dir=build_dir, verbose=verbose)
        object_spec(obj)  # parsed once here, read from <object>.spec.json when loaded
    build_native(build_dir, force=force, verbose=verbose)
    return objs


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _source_key(path: Path) -> str:
    """A source's name in :data:`SHIPPED_RECORD`: its path inside the package."""
    return path.relative_to(SOURCE_DIR.parent).as_posix()


def _shipped_record(build_dir: Path) -> dict | None:
    """The record of the objects this installation ships, when ``build_dir`` is
    another folder that may take copies of them; None where there is nothing to
    copy (a source checkout, a wheel made before the record, a damaged record)."""
    if build_dir.resolve() == PACKAGED_DIR.resolve() or not shipped():
        return None
    try:
        record = json.loads((PACKAGED_DIR / SHIPPED_RECORD).read_text())
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("sources"), dict)
        and isinstance(record.get("objects"), dict)
    )
    return record if ok else None


def _built_from_these(record: dict, inputs: list[Path]) -> bool:
    """Whether the shipped files were built from ``inputs`` as they are now: each
    one's SHA-256 is the one recorded (a source edited after the install, or one
    the build did not have, is not)."""
    sources = record["sources"]
    for path in inputs:
        sha = _sha256(path)
        if sha is None or sources.get(_source_key(path)) != sha:
            return False
    return True


def _copy_shipped(record: dict, name: str, dest: Path, *, with_spec: bool) -> bool:
    """Copy the shipped file ``name`` (and its spec) to ``dest`` when its content is
    the one recorded; written whole under a new name and renamed, never through a
    link planted at ``dest``."""
    from kernmlops.ebpf.spec import spec_path

    shipped_file = PACKAGED_DIR / name
    try:
        data = shipped_file.read_bytes()
        spec = spec_path(shipped_file).read_bytes() if with_spec else b""
    except OSError:
        return False
    sha = hashlib.sha256(data).hexdigest()
    if record["objects"].get(name) != sha:
        return False  # not the file the package was made with
    if with_spec:
        try:
            if json.loads(spec).get("sha256") != sha:
                return False
        except (ValueError, AttributeError):
            return False
    try:
        if with_spec:
            write_atomic(spec_path(dest), spec)
        write_atomic(dest, data)
    except OSError as err:
        raise BuildError(f"cannot write {dest}: {why_not_written(err, dest)}") from None
    return True


def _headers_as_shipped(record: dict, headers: list[Path]) -> bool:
    """Whether the BPF headers are the ones the shipped objects were built with
    (every object includes some): none added, removed or changed since."""
    recorded = {k for k in record["sources"] if k.startswith("bpf/") and k.endswith(".h")}
    if recorded != {_source_key(h) for h in headers}:
        return False
    return _built_from_these(record, headers)


def build_native(build_dir: Path, *, force: bool = False, verbose: bool = False) -> Path | None:
    """Compile the native ring copier (kernmlops.ebpf.copier) beside the objects, with
    the machine's C compiler; None where there is none (the spool then copies in
    Python). It needs only the C library: a wheel built here loads on older ones."""
    out = build_dir / NATIVE_LIBRARY
    newest = max(src.stat().st_mtime for src in (*NATIVE_SOURCES, *NATIVE_HEADERS))
    if out.exists() and not force and out.stat().st_mtime >= newest:
        return out
    record = None if force else _shipped_record(build_dir)
    if (
        record is not None
        and _built_from_these(record, [*NATIVE_SOURCES, *NATIVE_HEADERS])
        and _copy_shipped(record, NATIVE_LIBRARY, out, with_spec=False)
    ):
        return out  # the installation's own, as the objects are
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    tmp = out.with_suffix(".tmp")
    cmd = [cc, "-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-pthread", "-shared", "-o", str(tmp),
           *map(str, NATIVE_SOURCES)]  # fmt: skip
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        names = ", ".join(src.name for src in NATIVE_SOURCES)
        raise BuildError(f"{Path(cc).name} failed on {names}:\n{proc.stderr.strip()}")
    tmp.replace(out)
    return out


@functools.cache
def clang_system_includes(clang: str) -> tuple[str, ...]:
    """The folders ``clang`` searches for ``<...>`` when compiling for the host,
    as ``-idirafter`` flags: ``-target bpf`` leaves out the architecture's own
    (Debian's /usr/include/x86_64-linux-gnu, where ``<asm/errno.h>`` is), so a
    program including ``<linux/errno.h>`` would not build. ebpf_exporter's and
    libbpf-bootstrap's Makefiles add them the same way; searched last, they
    change nothing that built without them."""
    proc = subprocess.run([clang, "-v", "-E", "-"], input="", capture_output=True, text=True)
    lines = proc.stderr.splitlines()
    try:
        start = lines.index("#include <...> search starts here:") + 1
        end = lines.index("End of search list.", start)
    except ValueError:
        return ()
    flags: list[str] = []
    for line in lines[start:end]:
        folder = line.strip().split(" (")[0]  # macOS adds "(framework directory)"
        if folder:
            flags += ["-idirafter", folder]
    return tuple(flags)


def compile_object(
    src: Path,
    obj: Path,
    *,
    vmlinux_dir: Path | None = None,
    verbose: bool = False,
    cflags: tuple[str, ...] = (),
) -> Path:
    """Compile one BPF C file (it may include bpf/*.h) to ``obj``; vmlinux.h is
    generated in ``vmlinux_dir`` (default: the default build folder). ``cflags``
    come before the usual include folders (e.g. another -I searched first)."""
    clang = _tool("clang", "clang")
    vmlinux_dir = vmlinux_dir or default_build_dir()
    for folder in {obj.parent, vmlinux_dir}:  # both are loaded from (or included) as root
        check_build_dir(folder)
    obj.parent.mkdir(parents=True, exist_ok=True)
    vmlinux_dir.mkdir(parents=True, exist_ok=True)
    vmlinux = vmlinux_header(vmlinux_dir)
    arch = _ARCH.get(platform.machine(), platform.machine())
    cmd = [
        clang, "-target", "bpf", "-g", "-O2", "-Wall", "-Wno-unused-function",
        f"-D__TARGET_ARCH_{arch}", *cflags, "-I", str(vmlinux.parent), "-I", str(SOURCE_DIR),
        *clang_system_includes(clang), "-c", str(src), "-o", str(obj.with_suffix(".tmp")),
    ]  # fmt: skip
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"clang failed on {src.name}:\n{proc.stderr.strip()}")
    obj.with_suffix(".tmp").replace(obj)
    return obj


def ship(dest: Path) -> list[Path]:
    """Build (or bring up to date) every object in the default build folder and copy
    it with its spec into ``dest``: what setup.py puts in a wheel."""
    objs = build()
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for obj in objs:
        from kernmlops.ebpf.spec import object_spec, spec_path

        object_spec(obj)  # make sure the spec beside it is current
        for path in (obj, spec_path(obj)):
            shutil.copyfile(path, dest / path.name)
        out.append(dest / obj.name)
    native = objs[0].parent / NATIVE_LIBRARY if objs else None
    if native is not None and native.exists():
        shutil.copyfile(native, dest / NATIVE_LIBRARY)
        out.append(dest / NATIVE_LIBRARY)
    # what was shipped and from which sources: an installation copies its objects
    # into another folder (KERNMLOPS_BPF_DIR) only where both still match
    inputs = [*sources(), *SOURCE_DIR.glob("*.h"), *NATIVE_SOURCES, *NATIVE_HEADERS]
    record = {
        "format": 1,
        "objects": {p.name: _sha256(p) for p in out},
        "sources": {_source_key(p): _sha256(p) for p in sorted(inputs)},
    }
    (dest / SHIPPED_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the kernmlops BPF objects.")
    parser.add_argument("--out", type=Path, default=None, help="build folder")
    parser.add_argument("--force", action="store_true", help="rebuild everything")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        objs = build(args.out, force=args.force, verbose=args.verbose)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{len(objs)} BPF objects in {objs[0].parent if objs else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
