"""Hooks by name. A new hook is bpf/<name>.bpf.c, hooks/<name>.py and its
tests: the Hook subclasses of every module here are registered (``_index.py``
names them, so a run imports only the hooks it uses; ``make defaults`` updates it)."""

from __future__ import annotations

from kernmlops.errors import ConfigError
from kernmlops.hooks.base import Hook, HookContext, HookOptions, HookStatus
from kernmlops.registry import Plugins

REGISTRY: Plugins[Hook] = Plugins("kernmlops.hooks", Hook, skip=frozenset({"base", "bpf"}))
#: What `collect` runs unless told otherwise: cheap on any workload. Heavier
#: hooks (every syscall, every fault, stacks) are opt-in: --hooks or collector.hooks.
DEFAULT_HOOKS: tuple[str, ...] = ("process_trace", "quanta_runtime", "memory_usage", "system_info")


def get_hook(name: str) -> type[Hook]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown hook {name!r}; known: {', '.join(REGISTRY)}") from None


__all__ = ["DEFAULT_HOOKS", "REGISTRY", "Hook", "HookContext", "HookOptions", "HookStatus"]
