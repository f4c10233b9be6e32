"""The plug-ins of kernmlops.benchmarks, by name: generated from the modules by
`python -m kernmlops.plugin_indexes` (make defaults); do not edit. A lookup imports
only the module its name points to (kernmlops.registry.Plugins)."""

INDEX: dict[str, tuple[str, str]] = {
    "command": ("command", "CommandBenchmark"),
    "faux": ("faux", "FauxBenchmark"),
    "fio": ("fio", "FioBenchmark"),
    "gap": ("gap", "GapBenchmark"),
    "hackbench": ("hackbench", "HackbenchBenchmark"),
    "linux-build": ("linux_build", "LinuxBuildBenchmark"),
    "memcached": ("memcached", "MemcachedBenchmark"),
    "ml-training": ("ml_training", "MlTrainingBenchmark"),
    "pytorch": ("ml_training", "PytorchBenchmark"),
    "redis": ("redis", "RedisBenchmark"),
    "stress-ng": ("stress_ng", "StressNgBenchmark"),
}
