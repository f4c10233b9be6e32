"""Heavy libraries (numpy, polars, pyarrow) imported on first use.

A collection must attach its probes before it pays for the libraries that only
decode and write rows: importing polars, pyarrow and numpy takes longer than
loading and attaching every default program. A module that needs one writes::

    if TYPE_CHECKING:
        import polars as pl
    else:
        pl = lazy_import("polars")

and uses ``pl`` as usual. The first attribute read imports the real module with
a normal ``import`` (thread-safe under the import lock, unlike
``importlib.util.LazyLoader`` on Python 3.11) and copies its names into the
stand-in, so later reads cost what a module attribute costs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import sys
import threading
from types import ModuleType
from typing import Any, ClassVar

__all__ = ["keep_out", "lazy_import", "preload"]


class _LazyModule(ModuleType):
    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__name__)
        # Public names only: the stand-in keeps its own dunders (and the real
        # module's __getattr__, if any, is reached through getattr below).
        # Copy first: dict.copy() runs without letting another thread in, while
        # a thread importing a submodule (preload's pyarrow.parquet) adds it to
        # the parent's dict and would break iterating the live one.
        names = vars(module).copy()
        self.__dict__.update((k, v) for k, v in names.items() if not k.startswith("__"))
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def imported(name: str) -> bool:
    """Whether module ``name`` is in and done: one still being imported by another
    thread (the preload) is in sys.modules already, and using it waits for that
    import behind a thread a storm may keep off the CPU."""
    module = sys.modules.get(name)
    return module is not None and not getattr(module.__spec__, "_initializing", False)


def lazy_import(name: str) -> Any:
    """A stand-in for module ``name`` that imports it on first attribute access."""
    return _LazyModule(name)


def preload(*names: str) -> threading.Event:
    """Import ``names`` in a background thread; the event is set once they are in
    (or failed: the error comes again at the first real use). A collection
    starts this when its probes are attached and meanwhile only spills its
    rings, so the import never stalls the draining."""
    done = threading.Event()

    def run() -> None:
        try:
            for name in names:
                with contextlib.suppress(ImportError):
                    importlib.import_module(name)
        finally:
            done.set()

    threading.Thread(target=run, name="kernmlops-preload", daemon=True).start()
    return done


class _KeptOut(importlib.abc.MetaPathFinder):
    """Refuses the modules keep_out names, as a missing module is refused. (A None in
    sys.modules is not enough: Cython's import, pyarrow's pandas shim among them,
    takes that None as the module.)"""

    names: ClassVar[set[str]] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in self.names or fullname in self.names:
            raise ModuleNotFoundError(f"{fullname} is kept out of this process", name=fullname)
        return None


def keep_out(*names: str) -> None:
    """Modules this process will not load: importing one later raises ImportError,
    as if it were not installed (an optional part a library falls back from). Those
    already imported stay. For a command's own process only: a notebook that
    imports kernmlops keeps every module it has."""
    _KeptOut.names.update(n for n in names if n not in sys.modules)
    if not any(isinstance(f, _KeptOut) for f in sys.meta_path):
        sys.meta_path.insert(0, _KeptOut())
