"""kernmlops: collect, look at, export, compare and learn from Linux kernel data."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kernmlops")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = ["__version__"]
