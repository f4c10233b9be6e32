"""`kernmlops doctor`: the capability matrix and which hooks can run."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kernmlops.ebpf.build import build
from kernmlops.ebpf.probe import needs_met, probe_all, tool_versions
from kernmlops.hooks import REGISTRY


def run_doctor(console: Console) -> int:
    """Print what this machine allows; exit status 1 if no BPF hook can run."""
    build()
    features = probe_all()
    table = Table(title="this machine", title_justify="left")
    table.add_column("feature")
    table.add_column("ok")
    table.add_column("detail")
    for f in features.values():
        table.add_row(f.name, "[green]yes[/]" if f.ok else "[red]no[/]", f.detail)
    for tool, ver in tool_versions().items():
        table.add_row(tool, "[green]yes[/]" if ver else "[red]no[/]", ver or "not found")
    console.print(table)

    hooks = Table(title="hooks", title_justify="left")
    hooks.add_column("hook")
    hooks.add_column("runs")
    hooks.add_column("needs / reason")
    runnable = 0
    for name, cls in REGISTRY.items():
        ok, why = needs_met(cls.needs, features)
        runnable += ok and bool(cls.needs)
        hooks.add_row(name, "[green]yes[/]" if ok else "[red]no[/]", why or ", ".join(cls.needs))
    console.print(hooks)

    from kernmlops.ebpf.variants import hook_variants

    variants = Table(title="program variants (the first that loads is used)", title_justify="left")
    variants.add_column("hook")
    variants.add_column("variant")
    variants.add_column("loads here")
    variants.add_column("detail")
    for hv in hook_variants(features):
        if hv.error:
            variants.add_row(hv.hook, "-", "[red]no[/]", hv.error)
            continue
        for kind in hv.kinds:
            mark = " (used)" if kind.selected else ""
            ok = "[green]yes[/]" if kind.loads else "[red]no[/]"
            variants.add_row(hv.hook, kind.kind + mark, ok, kind.detail)
    console.print(variants)
    return 0 if runnable else 1
