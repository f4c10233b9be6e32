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
from tests.exporter.conftest import LIVE_SETS

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
    # every file of the package as git has it (pyproject's package-data is a list of
    # globs: a new kind of file, as bpf/ebpf_exporter/bpf/*.h, is easily left out);
    # documentation only stays in the checkout
    git = shutil.which("git")
    if git and (REPO / ".git").exists():
        listed = subprocess.run([git, "-C", str(REPO), "ls-files", "src/kernmlops"],
                                capture_output=True, text=True, check=True)  # fmt: skip
        tracked = listed.stdout.split()
        wanted = {t.removeprefix("src/") for t in tracked if not t.endswith(".md")}
        assert len(wanted) > 200
        assert sorted(wanted - names) == []
        # and nothing else: a file left in build/lib by an earlier build is not shipped
        made = {n for n in names if n.startswith("kernmlops/bpf_objects/")}
        made |= {n for n in names if n.startswith("kernmlops-")}  # the .dist-info
        assert sorted(names - made - wanted) == []


def _install(wheel: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The wheel installed in a fresh venv under ``tmp_path``: (venv, its site-packages)."""
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
    return venv, site


def _no_compilers(tmp_path: Path) -> tuple[str, Path]:
    """Shell commands that cover clang, bpftool and the C compiler with a trap that
    records any call (run them in a private mount namespace), and the trap's log."""
    log = tmp_path / "trap.log"
    trap = tmp_path / "trap"
    trap.write_text(TRAP.format(log=log))
    trap.chmod(0o755)
    covered = [p for p in (shutil.which("clang"), shutil.which("bpftool"),
                           shutil.which("bpftool", path="/usr/sbin:/sbin"),
                           shutil.which("cc"), shutil.which("gcc")) if p]  # fmt: skip
    mount = shutil.which("mount")
    if mount is None or shutil.which("unshare") is None:
        (pytest.fail if REQUIRE_BPF else pytest.skip)("needs mount and unshare (util-linux)")
    return "".join(f"{mount} --bind {trap} {os.path.realpath(p)} && " for p in covered), log


def _in_private_mounts(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    unshare = shutil.which("unshare")
    assert unshare is not None
    argv = [unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", script]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def test_a_fresh_install_runs_without_a_compiler(wheel: Path, tmp_path: Path) -> None:
    venv, site = _install(wheel, tmp_path)
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    mounts, log = _no_compilers(tmp_path)
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
    done = _in_private_mounts(script, env)
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


def test_a_bpf_dir_of_its_own_is_filled_with_the_wheels_objects_not_clang(
    wheel: Path, tmp_path: Path
) -> None:
    """The systemd unit's KERNMLOPS_BPF_DIR (its CacheDirectory, empty at the first
    start) on a machine without clang, bpftool or cc: `export --check` of the unit's
    sets and of the default ones passes on the wheel's own objects, copied there byte
    for byte with their specs and the ring copier. Then, where clang is, an
    ebpf_exporter config given as its .bpf.c compiles into that folder, and the copies
    stay as they are."""
    venv, _ = _install(wheel, tmp_path)
    home, bin_dir, cache = tmp_path / "home", tmp_path / "bin", tmp_path / "cache"
    for folder in (home, bin_dir, cache):
        folder.mkdir()
    mounts, log = _no_compilers(tmp_path)
    kmo = venv / "bin" / "kernmlops"
    check = f"{kmo} export --check --listen 127.0.0.1:0"
    unit_sets = " ".join(f"-c {name}" for name in LIVE_SETS)  # the unit's, as deployed
    env = {"PATH": str(bin_dir), "HOME": str(home), "LANG": "C.UTF-8",
           "KERNMLOPS_BPF_DIR": str(cache)}  # fmt: skip
    done = _in_private_mounts(f"{mounts}{check} {unit_sets} && {check}", env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not log.exists(), log.read_text()  # neither clang, bpftool nor cc was run
    assert (done.stdout + done.stderr).count("check passed") == 2, done.stdout + done.stderr
    # what clang is for there, in doctor's words (it asks the trapped tools' versions)
    doctor = _in_private_mounts(f"{mounts}{kmo} doctor", env)
    shown = " ".join((doctor.stdout + doctor.stderr).split())
    assert "not needed for the built-in sets" in shown, shown
    shipped = {
        n.removeprefix("kernmlops/bpf_objects/"): zipfile.ZipFile(wheel).read(n)
        for n in zipfile.ZipFile(wheel).namelist()
        if n.startswith("kernmlops/bpf_objects/") and not n.endswith("shipped.json")
    }
    assert len(shipped) == 2 * len(sources()) + 1  # objects, their specs, the copier
    copied = {p.name: p.read_bytes() for p in cache.iterdir()}
    assert copied == shipped  # the wheel's own files, byte for byte; no vmlinux.h
    times = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}

    # where clang is: an ebpf_exporter config as its .bpf.c, compiled into the folder
    config = REPO / "tests" / "exporter" / "ebpf_exporter" / "cpu-clock.yaml"
    env["PATH"] = os.environ["PATH"]
    done = subprocess.run([str(kmo), "export", "--check", "--listen", "127.0.0.1:0", "-c",
                           str(config)], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "check passed: 1 sets loaded" in done.stdout + done.stderr
    assert list(cache.glob("exporter-cpu-clock-*.bpf.o"))
    assert times == {  # the copies stay as they are
        p.name: p.stat().st_mtime_ns for p in cache.iterdir() if p.name in times
    }
