"""Fixtures for the user side of libbpf: built objects and small test objects.

Nothing here loads BPF: compiling and reading objects needs neither root nor
a BPF-capable kernel, only clang and bpftool (installed by `make test`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kernmlops.ebpf.build import build, default_build_dir


@pytest.fixture(scope="session")
def bpf_build_dir() -> Path:
    """The project's objects, built (or found up to date) in the default build folder."""
    objs = build()
    assert objs, "no BPF sources found"
    directory = default_build_dir()
    assert all(o.parent == directory and o.exists() for o in objs)
    return directory


@pytest.fixture(scope="session")
def compile_bpf(
    bpf_build_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Path]:
    """compile_bpf(name, source) -> path of ``<name>.bpf.o`` built from C ``source``.

    The source may include the project's headers (common.h, filter.h); the
    vmlinux.h of the project build is reused. Compiled once per session and name.
    """
    from kernmlops.ebpf.build import compile_object

    out = tmp_path_factory.mktemp("bpf-test-objects")
    built: dict[str, tuple[str, Path]] = {}

    def compile_(name: str, source: str) -> Path:
        if name in built:
            assert built[name][0] == source, f"two different sources named {name}"
            return built[name][1]
        src = out / f"{name}.bpf.c"
        src.write_text(source)
        obj = compile_object(src, out / f"{name}.bpf.o", vmlinux_dir=bpf_build_dir)
        built[name] = (source, obj)
        return obj

    return compile_
