"""Hooks by name. A new hook is bpf/<name>.bpf.c, hooks/<name>.py and its
tests: every module here is imported and its Hook subclasses are registered."""

from __future__ import annotations

from kernmlops.errors import ConfigError
from kernmlops.hooks.base import Hook, HookContext, HookOptions, HookStatus
from kernmlops.registry import discover

REGISTRY: dict[str, type[Hook]] = discover("kernmlops.hooks", Hook, skip=frozenset({"base", "bpf"}))
#: What `collect` runs unless told otherwise: cheap on any workload. Heavier
#: hooks (every syscall, every fault, stacks) are opt-in: --hooks or collector.hooks.
DEFAULT_HOOKS: tuple[str, ...] = ("process_trace", "quanta_runtime", "memory_usage", "system_info")


def get_hook(name: str) -> type[Hook]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown hook {name!r}; known: {', '.join(REGISTRY)}") from None


__all__ = ["DEFAULT_HOOKS", "REGISTRY", "Hook", "HookContext", "HookOptions", "HookStatus"]
