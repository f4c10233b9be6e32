"""A wheel built from the repository carries its BPF objects: installed into a
fresh venv on a machine without clang, bpftool or a vmlinux.h, it runs
`kernmlops doctor`, `collect` and `export` (root + BPF).

clang and bpftool are hidden twice: PATH holds neither, and in a private mount
namespace both binaries are covered by a trap that records any call. The
wheel's dependencies come from the test's own venv (a .pth file): installing
them from an index would take minutes and prove nothing about the objects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from kernmlops.ebpf.build import sources
from tests.conftest import REQUIRE_BPF

pytestmark = pytest.mark.bpf

REPO = Path(__file__).resolve().parents[2]
TRAP = '#!/bin/sh\necho "$0 $*" >> {log}\nexit 99\n'


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("clang") is None:
        # CI (KERNMLOPS_REQUIRE_BPF=1) installed clang with make test: missing is a failure
        (pytest.fail if REQUIRE_BPF else pytest.skip)("building the wheel needs clang (make setup)")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
         str(REPO)], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (whl,) = out.glob("kernmlops-*.whl")
    return whl


def test_the_wheel_carries_every_object_and_its_spec(wheel: Path) -> None:
    assert wheel.name.endswith(f"-py3-none-linux_{os.uname().machine}.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for src in sources():
        obj = f"kernmlops/bpf_objects/{src.name.removesuffix('.c')}.o"
        assert obj in names and f"{obj}.spec.json" in names
    assert not any(n.endswith("vmlinux.h") for n in names)  # a build input only
    assert "kernmlops/bpf_objects/libkmo_ringcopy.so" in names  # the native ring copier


def test_a_fresh_install_runs_without_a_compiler(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    deps = sysconfig.get_paths()["purelib"]
    (site / "dependencies.pth").write_text(deps + "\n")
    # pip runs in the new venv's interpreter with this environment: a PYTHONPATH of the
    # source tree (PYTHONPATH=src) would show it src/kernmlops.egg-info (left by the
    # build), as kernmlops already installed, and it would skip the wheel
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, env=clean)  # fmt: skip
    home, bin_dir, log = tmp_path / "home", tmp_path / "bin", tmp_path / "trap.log"
    home.mkdir()
    bin_dir.mkdir()
    trap = tmp_path / "trap"
    trap.write_text(TRAP.format(log=log))
    trap.chmod(0o755)
    covered = [p for p in (shutil.which("clang"), shutil.which("bpftool"),
                           shutil.which("bpftool", path="/usr/sbin:/sbin"),
                           shutil.which("cc"), shutil.which("gcc")) if p]  # fmt: skip
    mount, unshare = shutil.which("mount"), shutil.which("unshare")
    if mount is None or unshare is None:
        (pytest.fail if REQUIRE_BPF else pytest.skip)("needs mount and unshare (util-linux)")
    mounts = "".join(f"{mount} --bind {trap} {os.path.realpath(p)} && " for p in covered)
    kmo = venv / "bin" / "kernmlops"
    out = tmp_path / "out"
    script = (
        f"{mounts}"
        f"{kmo} doctor > {tmp_path}/doctor.txt 2>&1 && "
        f"{kmo} collect --no-progress -o {out} -b command -- /bin/true && "
        f"{kmo} export --check"
    )
    env = {"PATH": str(bin_dir), "HOME": str(home), "LANG": "C.UTF-8"}
    # the package these commands run is the wheel's, not the source tree's
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import kernmlops; print(kernmlops.__file__)"],
                           env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site / "kernmlops"), where.stdout
    argv = [unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", script]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    doctor = (tmp_path / "doctor.txt").read_text() if (tmp_path / "doctor.txt").exists() else ""
    assert done.returncode == 0, doctor[-3000:] + done.stdout[-3000:] + done.stderr[-3000:]
    assert not log.exists(), log.read_text()  # neither clang nor bpftool was run
    assert "check passed" in done.stdout + done.stderr
    # The installed package's objects were used: nothing was built anywhere.
    assert not list(home.rglob("*.bpf.o")) and not list(tmp_path.rglob("vmlinux.h"))
    from kernmlops.data import read_collection

    (col,) = out.glob("curated/benchmark=command/collection_id=*")
    manifest = read_collection(col).manifest
    assert manifest["state"] == "completed"
    assert manifest["hooks"]["process_trace"]["attached"]
    # the wheel's own copier library, built where the wheel was (no compiler here)
    assert manifest["hooks"]["process_trace"]["copier"]["native"] is True
