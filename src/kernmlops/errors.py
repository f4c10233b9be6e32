"""Errors a user can cause; the CLI turns each into a message and an exit code."""


class KernmlopsError(Exception):
    """Base class: the message is meant for the user, without a traceback."""

    exit_code = 2


class ConfigError(KernmlopsError):
    """Bad configuration (unknown key, wrong type, bad value)."""


class BenchmarkError(KernmlopsError):
    """A benchmark cannot run (missing tool, bad arguments) or failed."""


class HookUnavailable(KernmlopsError):
    """A hook cannot run on this kernel; the message says why."""


class CollectionError(KernmlopsError):
    """A collection folder or file is missing or unreadable."""


class OutputError(CollectionError):
    """The output folder cannot take the collection (read-only, not a folder, no
    permission, full)."""
