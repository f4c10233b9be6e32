"""Where root may load BPF objects and the native library from: the build folder's
check, below everything that opens an object (kernmlops.ebpf.build, .spec,
.objects, .copier).

Root loads a build folder's objects into the kernel, parses their ELF and BTF, and
dlopens its ring copier (whose constructor runs as root): a folder another user
can change makes what root runs theirs to choose. :func:`check_build_dir` refuses
such a folder, and runs wherever an object is opened (:class:`~kernmlops.ebpf.
objects.BpfObject`, :func:`~kernmlops.ebpf.spec.object_spec`) or the library is
loaded, whichever way the folder was given (``KERNMLOPS_BPF_DIR``, ``--bpf-dir``,
a metric set's folder, a library call), not only where :func:`kernmlops.ebpf.
build.build` runs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kernmlops.errors import KernmlopsError

__all__ = ["PACKAGED_DIR", "SOURCE_DIR", "BuildError", "UnsafeBuildFolder", "check_build_dir"]

SOURCE_DIR = Path(__file__).resolve().parent.parent / "bpf"
#: The objects a wheel ships (absent in a source checkout).
PACKAGED_DIR = SOURCE_DIR.parent / "bpf_objects"


class BuildError(KernmlopsError):
    """clang or bpftool is missing or failed."""


class UnsafeBuildFolder(BuildError):
    """A folder root would load objects (or a library, or a module) from that another
    user can change."""


def check_build_dir(
    build_dir: Path,
    *,
    what: str = "the BPF build folder",
    loads: str = "no object or library",
    env: str = "KERNMLOPS_BPF_DIR",
) -> None:
    """As root, refuse a build folder another user can change: root loads its objects
    into the kernel and dlopens its ring copier (whose constructor runs as root), so a
    file planted there, or a folder swapped in above it, would be theirs to choose.
    The folder (or, while it is missing, the one it will be made in) must be root's
    and open to no one else; each folder above it root's and open to others only if
    sticky (/tmp: no one renames root's entry); a link on the way is followed only
    where no other user could have made it (kernmlops.host.pinned). Once checked,
    only root can change what is loaded: no race between the check and the load.
    Folders inside kernmlops' own tree (its checkout, its installed objects) are not
    checked: who can change those changes kernmlops itself. Nothing without root.
    ``what``, ``loads`` and ``env`` word the refusal for another kind of folder.

    Raises:
        UnsafeBuildFolder: naming the folder and who could change it.
    """
    if os.geteuid() != 0:
        return
    path = Path(os.path.abspath(build_dir))
    real = Path(os.path.realpath(path))
    if any(real.is_relative_to(os.path.realpath(own)) for own in _own_trees()):
        return
    from kernmlops.errors import OutputError
    from kernmlops.host.pinned import UnsafePath, pin

    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        pin(existing, action="read", what=what).close()
    except UnsafePath as err:
        raise UnsafeBuildFolder(f"{what} {build_dir}: {err}") from None
    except OutputError:
        return  # a file in the way: the build's own step says so
    real = Path(os.path.realpath(existing))
    for i, folder in enumerate([real, *real.parents]):
        st = os.stat(folder)
        where = "it" if folder == real and existing == path else str(folder)
        why = None
        if st.st_uid != 0:
            why = f"{where} belongs to {_user(st.st_uid)}"
        elif st.st_mode & 0o022 and (i == 0 or not st.st_mode & stat.S_ISVTX):
            # the folder itself: a sticky one still lets anyone add a file
            who = "any user" if st.st_mode & 0o002 else "its group"
            why = f"{who} may write in {where}"
        if why:
            raise UnsafeBuildFolder(
                f"{what} {build_dir} can be changed by another user ({why}): "
                f"as root, kernmlops loads {loads} from it; use a folder only "
                f"root can change ({env})"
            )


def _own_trees() -> list[Path]:
    """kernmlops' own files: the installed objects and, in a checkout, the checkout."""
    repo = SOURCE_DIR.parents[2]
    return [PACKAGED_DIR, *([repo] if (repo / "pyproject.toml").exists() else [])]


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
