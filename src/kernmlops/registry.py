"""Plug-in classes by name. A new hook or benchmark is a module of its own, with no
list to edit elsewhere: :func:`discover` imports every module of a package and
collects the subclasses it defines.

Importing every plug-in costs a run that uses a few of them most of its start-up,
so the hook and benchmark registries are :class:`Plugins`: a generated index
(``_index.py`` beside the plug-ins: name -> module and class) names them, and a
class is imported when it is first looked up. ``python -m kernmlops.plugin_indexes``
(``make defaults``) writes the indexes; a module the index does not know makes the
registry discover the package instead, so a new plug-in works before it is indexed.

This module sits below the packages that use it and imports none of them: which
registries have an index is kernmlops.plugin_indexes' to know.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
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


#: An index: plug-in name -> (module in the package, class name), in discovery order.
Index = dict[str, tuple[str, str]]


def _modules_on_disk(package: str, skip: frozenset[str]) -> set[str]:
    """The plug-in modules of ``package`` (files and subpackages, as discover sees
    them) without importing any: a directory listing."""
    paths = importlib.import_module(package).__path__
    return {
        m.name
        for m in pkgutil.iter_modules(paths)
        if m.name not in skip and not m.name.startswith("_")
    }


class Plugins(Mapping[str, type[T]]):
    """``{name: class}`` of a plug-in package, read from its generated index: a class
    (and its module) is imported when it is first looked up, so iterating names, ``in``
    and ``len`` import nothing. Where the package has a module the index does not
    name (or names one it lacks), the index is stale and the package is discovered."""

    def __init__(self, package: str, base: type[T], skip: frozenset[str] = frozenset()) -> None:
        self.package = package
        self.base = base
        self.skip = skip
        self._index: Index | None = None
        self._discovered: dict[str, type[T]] | None = None

    def index(self) -> Index:
        """name -> (module, class) of every plug-in, without importing them."""
        if self._index is None:
            try:
                index: Index = importlib.import_module(f"{self.package}._index").INDEX
            except (ImportError, AttributeError):
                index = {}
            if {m for m, _ in index.values()} != _modules_on_disk(self.package, self.skip):
                index = index_of(self.discover())
            self._index = index
        return self._index

    def discover(self) -> dict[str, type[T]]:
        """Every plug-in class, by importing every module (what the index is made from)."""
        if self._discovered is None:
            self._discovered = discover(self.package, self.base, self.skip)
        return self._discovered

    def __getitem__(self, name: str) -> type[T]:
        module, attr = self.index()[name]
        cls = getattr(importlib.import_module(f"{self.package}.{module}"), attr, None)
        if not (isinstance(cls, type) and issubclass(cls, self.base) and cls.name == name):  # type: ignore[attr-defined]
            # a module changed since the index was written: believe the modules
            self._index = index_of(self.discover())
            cls = self.discover().get(name)
            if cls is None:
                raise KeyError(name)
        return cls

    def __iter__(self) -> Iterator[str]:
        return iter(self.index())

    def __len__(self) -> int:
        return len(self.index())

    def __contains__(self, name: object) -> bool:
        return name in self.index()

    def __repr__(self) -> str:
        return f"Plugins({self.package!r}: {', '.join(self.index())})"


def index_of(classes: Mapping[str, type]) -> Index:
    """The index of discovered classes: name -> (module in their package, class name)."""
    return {
        name: (cls.__module__.rsplit(".", 1)[1], cls.__qualname__) for name, cls in classes.items()
    }


def index_source(plugins: Plugins[Any]) -> str:
    """The text of ``plugins``' ``_index.py``, from importing every module."""
    lines = [
        f'"""The plug-ins of {plugins.package}, by name: generated from the modules by',
        "`python -m kernmlops.plugin_indexes` (make defaults); do not edit. A lookup imports",
        'only the module its name points to (kernmlops.registry.Plugins)."""',
        "",
        "INDEX: dict[str, tuple[str, str]] = {",
    ]
    for name, (module, cls) in index_of(plugins.discover()).items():
        lines.append(f"    {json.dumps(name)}: ({json.dumps(module)}, {json.dumps(cls)}),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def index_path(plugins: Plugins[Any]) -> Path:
    """Where ``plugins``' index lives: ``_index.py`` in its package."""
    return Path(importlib.import_module(plugins.package).__path__[0]) / "_index.py"
