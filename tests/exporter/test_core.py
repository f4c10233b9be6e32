"""The exporter's job filter in words: what the served HELP texts add (no BPF)."""

from __future__ import annotations

from kernmlops.exporter.config import builtin_sets
from kernmlops.exporter.core import Exporter, JobFilter


def test_scope_names_every_filter_and_nothing_without_one() -> None:
    assert Exporter([]).scope == ""  # the whole machine: the YAML's words alone
    assert JobFilter().scope() == []
    assert Exporter([], job=JobFilter(comm="python3")).scope == "threads named python3"
    assert Exporter([], process_filter_fd=7).scope == "the processes of the collection"
    both = Exporter(
        [], job=JobFilter(comm="a" * 20, cgroup="/sys.slice"), process_filter_fd=7,
        tracked="process 12 and its descendants",
    )  # fmt: skip
    assert both.scope == (
        "tasks that match each of: process 12 and its descendants; threads named "
        "aaaaaaaaaaaaaaa; tasks in cgroup /sys.slice and below"
    )  # the kernel keeps 15 characters of a name, and so does the filter


def test_builtin_sets_claim_no_job_of_their_own() -> None:
    # they count every task unless the exporter is told a job (then HELP says which);
    # biojobs' "by job" is a label (cgroup, comm), not a filter
    for name, ms in builtin_sets().items():
        for text in (ms.spec.description, *(m.help for m in ms.metrics)):
            assert "of the job" not in text and "job's" not in text, (name, text)
