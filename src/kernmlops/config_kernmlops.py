"""KernMLOps' configuration form, mapped onto ours.

A KernMLOps ``overrides.yaml`` has two sections::

    benchmark_config:
      generic: {benchmark, benchmark_dir, cpus, skip_clear_page_cache, transparent_hugepages}
      <benchmark>: {...}              # that benchmark's own settings
    collector_config:
      generic: {poll_rate, output_dir, output_graphs, hooks}

:func:`translate` turns it into our form (``benchmark`` / ``collector``) with the same
strictness: an unknown key is named with its path as written and the nearest valid
key. A file that mixes both forms is refused. The README's "KernMLOps configs" table
lists the mapping.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from kernmlops.errors import ConfigError
from kernmlops.validation import key_path, unknown_key

#: top-level keys of each form
KERNMLOPS_SECTIONS = ("benchmark_config", "collector_config")
OUR_SECTIONS = ("collector", "hooks", "benchmark")

#: KernMLOps benchmarks that kernmlops does not have, and why
MISSING_BENCHMARKS = {
    "mongodb": "mongodb is not in Debian",
    "linnos": "LinnOS needs its own kernel patches and NVMe traces",
}
#: KernMLOps hooks that kernmlops does not have, and why
MISSING_HOOKS = {
    "cbmm": "it traces the CBMM kernel patches' own functions (mm_decide, "
    "mm_estimate_changes) with kprobes",
}
#: their sections' keys in KernMLOps: its defaults.yaml (which `make collect-data`
#: reads when there is no overrides.yaml) fills them in, so a file naming another
#: benchmark carries them; they are checked for typos and otherwise not used
_MISSING_BENCHMARK_KEYS = {
    "mongodb": ["operation_count", "read_proportion", "update_proportion"],
    "linnos": ["use_root", "shuffle_traces", "type", "devices"],
}


def is_kernmlops(data: dict[str, Any], source: str | None = None) -> bool:
    """True when ``data`` is in KernMLOps' form (raises ConfigError when it mixes both)."""
    theirs = [k for k in KERNMLOPS_SECTIONS if k in data]
    ours = [k for k in OUR_SECTIONS if k in data]
    if theirs and ours:
        where = f" in {source}" if source else ""
        raise ConfigError(
            f"invalid configuration{where}: it mixes KernMLOps' form ({', '.join(theirs)}) "
            f"with kernmlops' ({', '.join(ours)}); write it in one form"
        )
    return bool(theirs)


class _Translation:
    def __init__(self, source: str | None) -> None:
        self.where = f" in {source}" if source else ""
        self.out: dict[str, Any] = {}
        #: our key path -> the file's (for error messages)
        self.renames: dict[str, str] = {}

    def fail(self, message: str) -> ConfigError:
        return ConfigError(f"invalid configuration{self.where}: {message}")

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{path}: expected a mapping of keys (got {value!r:.60})")
        return value

    def keys(self, section: dict[str, Any], path: str, valid: list[str]) -> None:
        prefix = path.split(".") if path else ()
        for key in section:
            if key not in valid:
                where = key_path([*prefix, key])
                raise self.fail(f"{where}: {unknown_key(str(key), valid, prefix=prefix)}")

    def put(self, ours: str, value: Any, theirs: str) -> None:
        node = self.out
        *parents, last = ours.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        self.renames[ours] = theirs


def _benchmark_name(name: Any, path: str, t: _Translation) -> str:
    """Our registry name of a KernMLOps benchmark name (linux_build -> linux-build)."""
    from kernmlops.benchmarks import REGISTRY

    if not isinstance(name, str):
        raise t.fail(f"{path}: expected a benchmark name (got {name!r:.60})")
    if name in MISSING_BENCHMARKS:
        raise t.fail(
            f"{path}: KernMLOps' {name} benchmark is not in kernmlops "
            f"({MISSING_BENCHMARKS[name]}); known: {', '.join(REGISTRY)}"
        )
    by_key = {n.replace("-", "_"): n for n in REGISTRY}
    found = by_key.get(name.replace("-", "_"))
    if found is None:
        near = difflib.get_close_matches(name, [*REGISTRY, *by_key], n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise t.fail(f"{path}: unknown benchmark {name!r}{hint} (known: {', '.join(REGISTRY)})")
    return found


def _number(value: Any, path: str, t: _Translation, *, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo < value <= hi:
        raise t.fail(
            f"{path}: expected a number of seconds > {lo:g} and <= {hi:g} (got {value!r:.60})"
        )
    return float(value)


def _bool(value: Any, path: str, t: _Translation) -> bool:
    if not isinstance(value, bool):
        raise t.fail(f"{path}: expected true or false (got {value!r:.60})")
    return value


#: KernMLOps' keys of one benchmark's section that ours names differently: key ->
#: (our key, conversion); keys not listed are ours already (the section takes both)
_BENCHMARK_KEYS: dict[str, dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "gap": {
        "gap_benchmark": ("kernel", lambda v: v),
        "gap_benchmark_size": ("scale", lambda v: v),
    },
}


def _stress_ng(section: dict[str, Any], path: str, t: _Translation) -> dict[str, Any]:
    """KernMLOps runs ``stress-ng <args>``, ``args`` being the whole command line
    (its stressors and usually ``--timeout``): our ``custom`` scenario with those
    as ``extra_args``, which come last, so a ``--timeout`` among them wins."""
    section = dict(section)
    binary = section.pop("stress_ng_benchmark", "stress-ng")
    if binary != "stress-ng":
        raise t.fail(f"{path}.stress_ng_benchmark: expected 'stress-ng' (got {binary!r:.60})")
    if "args" in section:
        args = section.pop("args")
        if not isinstance(args, list):
            raise t.fail(f"{path}.args: expected a list of arguments (got {args!r:.60})")
        t.put("benchmark.stress_ng.scenario", "custom", f"{path}.args")
        t.put("benchmark.stress_ng.extra_args", [str(a) for a in args], f"{path}.args")
    return section


def benchmark_dir_keys(benchmark_dir: object) -> dict[str, str]:
    """Our keys of KernMLOps' benchmark folder (its config's ``benchmark_dir``, its
    ``collect data -d``): KernMLOps keeps each benchmark's install under
    ``<benchmark_dir>/<name>``, where ours name each benchmark's own folder."""
    base = str(benchmark_dir).rstrip("/")  # "/" is "": /gap
    return {
        "benchmark.gap.source_dir": f"{base}/gap",
        "benchmark.linux_build.source_dir": f"{base}/linux_kernel",
    }


def _generic_benchmark(gen: dict[str, Any], t: _Translation) -> None:
    path = "benchmark_config.generic"
    t.keys(
        gen,
        path,
        ["benchmark", "benchmark_dir", "cpus", "skip_clear_page_cache", "transparent_hugepages"],
    )
    if "benchmark" in gen:
        name = _benchmark_name(gen["benchmark"], f"{path}.benchmark", t)
        t.put("benchmark.name", name, f"{path}.benchmark")
    if gen.get("benchmark_dir"):
        for key, folder in benchmark_dir_keys(gen["benchmark_dir"]).items():
            t.put(key, folder, f"{path}.benchmark_dir")
    if "cpus" in gen:
        t.put("benchmark.cpus", gen["cpus"], f"{path}.cpus")
    if "skip_clear_page_cache" in gen:
        skip = _bool(gen["skip_clear_page_cache"], f"{path}.skip_clear_page_cache", t)
        t.put("benchmark.drop_page_cache", not skip, f"{path}.skip_clear_page_cache")
    if "transparent_hugepages" in gen:
        t.put(
            "benchmark.transparent_hugepages",
            gen["transparent_hugepages"],
            f"{path}.transparent_hugepages",
        )


def _generic_collector(gen: dict[str, Any], t: _Translation) -> None:
    path = "collector_config.generic"
    t.keys(gen, path, ["poll_rate", "output_dir", "output_graphs", "hooks"])
    if "poll_rate" in gen:
        # KernMLOps polls its hooks every poll_rate seconds: our drain period
        seconds = _number(gen["poll_rate"], f"{path}.poll_rate", t, lo=0, hi=1)
        t.put("collector.poll_interval_ms", max(1, round(seconds * 1000)), f"{path}.poll_rate")
    if "output_dir" in gen:
        t.put("collector.output_dir", gen["output_dir"], f"{path}.output_dir")
    if "output_graphs" in gen:
        t.put("collector.output_graphs", gen["output_graphs"], f"{path}.output_graphs")
    if "hooks" in gen:
        hooks = gen["hooks"]
        for name in hooks if isinstance(hooks, list) else ():
            if isinstance(name, str) and name in MISSING_HOOKS:
                raise t.fail(
                    f"{path}.hooks: KernMLOps' {name} hook is not in kernmlops "
                    f"({MISSING_HOOKS[name]})"
                )
        t.put("collector.hooks", hooks, f"{path}.hooks")


def translate(
    data: dict[str, Any], source: str | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Our form of a KernMLOps-form mapping, and our key paths -> the file's own (for
    error messages). Raises ConfigError naming the file's key."""
    from kernmlops.benchmarks import REGISTRY

    t = _Translation(source)
    t.keys(data, "", list(KERNMLOPS_SECTIONS))
    bench = t.mapping(data.get("benchmark_config"), "benchmark_config")
    collector = t.mapping(data.get("collector_config"), "collector_config")
    names = {n.replace("-", "_"): n for n in REGISTRY}
    t.keys(bench, "benchmark_config", ["generic", *names, *MISSING_BENCHMARKS])
    t.keys(collector, "collector_config", ["generic"])
    _generic_benchmark(t.mapping(bench.get("generic"), "benchmark_config.generic"), t)
    _generic_collector(t.mapping(collector.get("generic"), "collector_config.generic"), t)
    for key, section in bench.items():
        if key == "generic":
            continue
        path = f"benchmark_config.{key}"
        if key in MISSING_BENCHMARKS:
            # settings of a benchmark this run does not use (choosing it fails above)
            t.keys(t.mapping(section, path), path, _MISSING_BENCHMARK_KEYS[key])
            continue
        section = t.mapping(section, path)
        if key == "stress_ng":
            section = _stress_ng(section, path, t)
        renamed = _BENCHMARK_KEYS.get(key, {})
        for name, value in section.items():
            ours, convert = renamed.get(name, (name, lambda v: v))
            t.put(f"benchmark.{key}.{ours}", convert(value), f"{path}.{name}")
        t.renames.setdefault(f"benchmark.{key}", path)
    return t.out, t.renames
