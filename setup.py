"""Wheels carry the BPF objects: built once here (clang, bpftool and the build
machine's kernel BTF), so the machine that installs the wheel needs only libbpf.
Everything else about the package is in pyproject.toml."""

import platform
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py


class BuildPyWithBpf(build_py):
    def run(self) -> None:
        if not getattr(self, "editable_mode", False):
            # build/lib outlives a build: a file since removed or no longer in
            # package-data (an old hook module, an object) would ship again
            shutil.rmtree(Path(self.build_lib) / "kernmlops", ignore_errors=True)
        super().run()
        if getattr(self, "editable_mode", False):
            return  # a development tree builds into build/bpf (make bpf)
        sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))
        from kernmlops.ebpf.build import PACKAGED_DIR, ship

        ship(Path(self.build_lib) / "kernmlops" / PACKAGED_DIR.name)


class BdistWheelForArch(bdist_wheel):
    """Pure Python, but the objects are built for this architecture (its pt_regs,
    its byte order): the wheel says so (linux_<machine>)."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", f"linux_{platform.machine()}"


setup(cmdclass={"build_py": BuildPyWithBpf, "bdist_wheel": BdistWheelForArch})
