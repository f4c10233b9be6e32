"""Discovery of plug-in classes: every module of a package is imported and the
subclasses it defines are collected by name. A new hook or benchmark is then a
module of its own, with no list to edit elsewhere."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import TypeVar

T = TypeVar("T")


def discover(package: str, base: type[T], skip: frozenset[str] = frozenset()) -> dict[str, type[T]]:
    """``{cls.name: cls}`` for each concrete subclass of ``base`` defined in a
    module of ``package`` (modules in ``skip`` are not imported), by module order."""
    pkg = importlib.import_module(package)
    found: dict[str, type[T]] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name in skip or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, base)
                and cls.__module__ == module.__name__
                and not inspect.isabstract(cls)
                and isinstance(getattr(cls, "name", None), str)
            ):
                if cls.name in found:
                    raise TypeError(f"two classes named {cls.name!r} in {package}")
                found[cls.name] = cls
    return found
