"""What `kernmlops collect` tells a user whose collection lost events."""

from __future__ import annotations

from kernmlops.cli import drop_advice
from kernmlops.config import load_config
from kernmlops.hooks.base import HookStatus


def test_drop_advice_names_each_hook_and_its_own_remedy() -> None:
    cfg = load_config({"hooks": {"memory_usage": {"poll_hz": 4}}})
    hooks = {
        "process_trace": HookStatus("process_trace", attached=True),
        "quanta_runtime": HookStatus("quanta_runtime", attached=True, drops=1_234),
        "memory_usage": HookStatus("memory_usage", attached=True, drops=2),
    }
    assert drop_advice(hooks, cfg.hook_options) == [
        "quanta_runtime: 1,234 events dropped (its ring was full): raise "
        "hooks.quanta_runtime.ring_kib, or set collector.nice: -10",
        "memory_usage: 2 samples missed (the machine was too busy to read at poll_hz 4): "
        "lower hooks.memory_usage.poll_hz, or set collector.nice: -10",
    ]
    assert drop_advice({"process_trace": hooks["process_trace"]}, cfg.hook_options) == []
