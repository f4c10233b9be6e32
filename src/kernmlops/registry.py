"""Discovery of plug-in classes: every module of a package is imported and the
subclasses it defines are collected by name. A new hook or benchmark is then a
module of its own, with no list to edit elsewhere."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing
from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def options_model(cls: type, base: type[M]) -> type[M] | None:
    """The options model a plug-in class names as its generic parameter
    (``class QuantaRuntimeHook(BpfHook[QuantaRuntimeOptions])``), else None."""
    for parent in cls.__dict__.get("__orig_bases__", ()):
        for arg in typing.get_args(parent):
            if isinstance(arg, type) and issubclass(arg, base):
                return arg
    return None


def options_of(model: type[M], options: BaseModel | None) -> M:
    """``options`` as ``model``: the defaults for None; a section of a base model
    (``HookOptions()``) validated into ``model`` once, here."""
    if options is None:
        return model()
    if isinstance(options, model):
        return options
    given: dict[str, Any] = options.model_dump()
    return model.model_validate(given)


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
