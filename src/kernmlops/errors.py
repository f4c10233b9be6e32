"""Errors a user can cause; the CLI turns each into a message and an exit code."""

from __future__ import annotations

import errno
from pathlib import Path

#: The exit status of a condition that may pass by itself, as sysexits.h's EX_TEMPFAIL
#: (75): a listen address that cannot be bound now (a port still held by an exiting
#: process, an address not configured yet at boot). Not 2, a user error: a service
#: manager may retry it (the systemd unit restarts on it, and not on 2).
EXIT_TEMPORARY = 75


class KernmlopsError(Exception):
    """Base class: the message is meant for the user, without a traceback."""

    exit_code = 2


class KernmlopsWarning(UserWarning):
    """Base class of the warnings a user should read (work goes on): a command says
    each as one ``warning: <message>`` line, a library caller gets the warning."""


class ConfigError(KernmlopsError):
    """Bad configuration (unknown key, wrong type, bad value)."""


class BenchmarkError(KernmlopsError):
    """A benchmark cannot run (missing tool, bad arguments) or failed."""


class HookUnavailable(KernmlopsError):
    """A hook cannot run on this kernel; the message says why."""


class CollectionError(KernmlopsError):
    """A collection folder or file is missing or unreadable."""


class EmptyCollectionError(CollectionError):
    """A collection that finished and recorded no row: nothing in it is damaged, there
    is only nothing to read (exit 1: nothing done, as a command with nothing to draw)."""

    exit_code = 1


class OutputError(CollectionError):
    """The output folder cannot take the collection (read-only, not a folder, no
    permission, full)."""


#: what a hook may raise that is the collection's error (a full disk, a failed write,
#: a kernel that refuses), not a bug in the hook. Anything else a hook raises is its
#: bug, which costs that hook alone (kernmlops.collect.loop, kernmlops.collect.attach).
NOT_A_HOOKS_BUG: tuple[type[Exception], ...] = (KernmlopsError, OSError)


def why_not_written(err: OSError, path: Path | None = None) -> str:
    """Why a file or folder could not be made or written, in words rather than an
    errno's (``path``: what was written, for a missing folder above it)."""
    if err.errno == errno.ENOENT and path is not None:
        if path.parent.is_dir():  # /proc answers ENOENT to a new file in a folder it has
            return f"no file can be made in {path.parent}"
        return f"there is no folder {path.parent}"
    if err.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder"
    if err.errno == errno.EROFS:
        return "the file system is read-only"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    return err.strerror or str(err)
