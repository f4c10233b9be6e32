"""kernmlops: collect, look at, export, compare and learn from Linux kernel data."""

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    # Resolved on first use: importlib.metadata costs tens of milliseconds, and
    # a collection attaches its probes before it needs the version.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("kernmlops")
        except PackageNotFoundError:  # a source tree without installation
            value = "0.0.0"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'kernmlops' has no attribute {name!r}")
