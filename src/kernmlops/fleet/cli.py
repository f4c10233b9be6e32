"""``kernmlops push`` and ``kernmlops fleet``: publish collections, list a dataset."""

from __future__ import annotations

import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kernmlops.clitools import CONTEXT_SETTINGS, fail, progress, reachable_path, waiting
from kernmlops.errors import KernmlopsError

if TYPE_CHECKING:
    from kernmlops.fleet.store import Dataset

URI_HELP = """\b
URI is where the dataset lives: a folder, file:///path, s3://bucket/prefix,
gs://bucket/prefix, abfs://container@account.dfs.core.windows.net/prefix,
hdfs://namenode/path (any scheme pyarrow opens, others through fsspec).
Credentials are read where each client looks, never from the command line:
for S3 AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE (~/.aws), or an
instance role; AWS_ENDPOINT_URL (or ?endpoint_override=host:port&scheme=http)
for an S3 server other than AWS, such as MinIO."""


def _say(text: str) -> None:
    click.echo(text, err=True)


@click.command(
    "push",
    epilog=URI_HELP,
    context_settings=CONTEXT_SETTINGS,
)
@click.argument("paths", nargs=-1, required=True, type=reachable_path(path_type=Path))
@click.argument("uri")
@click.option(
    "--incomplete",
    is_flag=True,
    help="also publish collections whose collector died (state running, no spool left): "
    "what was flushed, marked running in the index.",
)
@click.option("--no-progress", is_flag=True, help="no progress bar on a terminal.")
def push_command(paths: tuple[Path, ...], uri: str, incomplete: bool, no_progress: bool) -> None:
    """Publish finished collections (PATHS) to the dataset at URI.

    A PATH is a collection folder (or its manifest.json), or a folder of them (data,
    data/curated, data/curated/benchmark=faux). Each lands in
    URI/benchmark=<b>/collection_id=<id>/:
    its parts first, then its manifest, then its row of the dataset's index
    (URI/_index/), so a reader that goes by manifests or the index never sees half
    a collection. A file already there with the same size is not copied again: a
    repeated push copies nothing, an interrupted one resumes.

    A collection still being collected, or whose killed collector left rows in its
    spool (run `kernmlops recover` first), is refused with the reason; the others are
    published and the exit code is 1.

    \b
    Examples:
      kernmlops push data s3://lab-kernel-data/fleet
      kernmlops push data/curated/benchmark=gap/collection_id=4f0c file:///mnt/share/fleet
      kernmlops fleet ls s3://lab-kernel-data/fleet
    """
    from kernmlops.fleet.push import PushResult, collection_bytes, expand, push
    from kernmlops.fleet.store import open_dataset, probe

    try:
        folders = expand(paths)
        dataset = open_dataset(uri)
        # a remote store's client retries a refused connection for seconds
        with waiting(f"reaching {dataset.uri}", enabled=False if no_progress else None):
            probe(dataset)
        # bytes: a collection may be one large table; its files already there count
        # as done once the collection is
        sizes = [collection_bytes(f) for f in folders]
        finished = 0
        with progress("pushing", "bytes", total=sum(sizes), enabled=not no_progress) as steps:

            def report(outcome) -> None:
                nonlocal finished
                if isinstance(outcome, PushResult):
                    _say(outcome.line())
                else:
                    _say(f"refused: {outcome.reason}")
                finished += 1
                steps(sum(sizes[:finished]))

            results, refused = push(
                folders,
                dataset,
                incomplete=incomplete,
                on_result=report,
                on_file=lambda _, size: steps.advance(size),
            )
    except KernmlopsError as err:
        fail(err)
    done = sum(not r.already for r in results)
    _say(
        f"{done} published, {len(results) - done} already there"
        + (f", {len(refused)} refused" if refused else "")
        + f" ({dataset.uri})"
    )
    if refused:
        sys.exit(1)


@click.group("fleet", context_settings=CONTEXT_SETTINGS)
def fleet_group() -> None:
    """Look at a dataset that collections were pushed to (kernmlops push).

    \b
    The dataset is Hive-partitioned Parquet plus an index, read by any engine:
      duckdb: select * from read_parquet('URI/_index/*.parquet');
              set variable t = (select list('URI/' || path || '/quanta_runtime/*.parquet')
                from read_parquet('URI/_index/*.parquet')
                where list_contains(map_keys(rows), 'quanta_runtime'));
              select * from read_parquet(getvariable('t'), hive_partitioning=true);
      spark:  spark.read.parquet('URI/_index')
      kernmlops spark-job URI OUT    per-collection summaries and the MLLB data set

    A table is read from the folders the index names (its path), not from a glob over
    URI: a glob also reads a push under way, and fails on a collection that
    `kernmlops fleet reindex` found damaged.
    """


@fleet_group.command("ls", epilog=URI_HELP)
@click.argument("uri")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per collection on stdout.")
def ls_command(uri: str, as_json: bool) -> None:
    """List the collections published at URI, from its index: one line each with
    benchmark, id, host, kernel, CPU, start, state, rows and tables (--json: every
    column of the index).

    \b
    Examples:
      kernmlops fleet ls s3://lab-kernel-data/fleet
      kernmlops fleet ls /mnt/share/fleet --json | jq -r 'select(.state != "completed") | .path'
    """
    import json

    from kernmlops.fleet.index import (
        INDEX_DIR,
        damaged_advice,
        index_rows,
        read_damaged,
        read_index,
        unindexed,
    )
    from kernmlops.fleet.store import PublishError, describe_error, open_dataset

    # a damaged index file is one collection's row: the others are listed, the damaged
    # named after them (where a terminal shows them last), and the exit code says so;
    # so are the collections reindex found damaged (no row: named in _damaged/)
    damaged: list[tuple[str, str]] = []
    not_read: list[tuple[str, str]] = []
    try:
        dataset = open_dataset(uri)
        try:
            table = read_index(
                dataset,
                on_damaged=lambda where, why: damaged.append((where, why)),
                on_not_read=not_read.extend,
            )
            broken = read_damaged(dataset)
        except OSError as err:
            raise PublishError(f"cannot read {dataset.uri}: {describe_error(err)}") from None
    except KernmlopsError as err:
        fail(err)
    rows = index_rows(table)
    if as_json:
        # one write: a thousand echo calls cost more than the rows' JSON
        lines = [
            json.dumps(dict(row, rows=dict(row["rows"] or [])), default=_json_value) for row in rows
        ]
        if lines:
            click.echo("\n".join(lines))
    elif rows:
        click.echo(f"{len(rows)} collections at {dataset.uri}")
        click.echo("\n".join(_columns(LS_COLUMNS, [_ls_cells(row) for row in rows])))
    if not rows and not damaged:
        try:
            found = unindexed(dataset, damaged=[b.path for b in broken])
        except OSError as err:
            fail(PublishError(f"cannot read {dataset.uri}: {describe_error(err)}"))
        if found.collections:
            # collections an index does not name (copied without it, or a collector's
            # own folder): not listed, so said, with the commands that list them
            _say(f"warning: {not_indexed(dataset, found.collections)}")
            sys.exit(1)
        partial = (
            f" ({found.partial} collection folder(s) without a manifest: a push under way, "
            "or an interrupted one, which running it again resumes)"
            if found.partial
            else ""
        )
        if not as_json:
            _say(f"no collections published at {dataset.uri}{partial}")
    for where, why in damaged:
        _say(f"warning: {where}: {damaged_advice(dataset, why)}; its collection is not listed")
    for b in broken:
        where = dataset.where(b.path) if b.path else b.collection_id
        _say(
            f"warning: {where}: damaged ({b.reason}), left out of the index: push it "
            "again from its source, or delete it and run `kernmlops fleet reindex "
            f"{shlex.quote(dataset.uri)}`"
        )
    if not_read:
        # reindex reads and removes plain files only: these stay until someone removes them
        names = ", ".join(f"{name} ({what})" for name, what in not_read)
        _say(
            f"warning: {dataset.where(INDEX_DIR)}: not read, not a plain file: {names}; "
            "their rows, if any, are not listed (reindex leaves them: remove them)"
        )
    if damaged or broken or not_read:
        sys.exit(1)


def _json_value(value: object) -> str:
    """A timestamp as ISO 8601 in UTC, to the second (2026-11-29T22:52:03Z: the form jq's
    fromdateiso8601 and every ISO reader take); anything else as its str."""
    if isinstance(value, datetime):
        utc = value.astimezone(UTC) if value.tzinfo else value  # the index's are UTC
        return utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def not_indexed(dataset: Dataset, count: int) -> str:
    """The line for ``count`` collections under a dataset's root with no index."""
    uri = shlex.quote(dataset.uri)
    push = (
        f", or `kernmlops push {uri} DEST` publishes them to a dataset (local collections)"
        if dataset.local
        else ""
    )
    return (
        f"{dataset.uri}: no collections published (no index), but {count} collection(s) "
        f"with a manifest are here: `kernmlops fleet reindex {uri}` indexes them where they "
        f"are{push}"
    )


#: ``fleet ls``'s columns, and whether each is aligned right
LS_COLUMNS = (
    ("benchmark", False), ("collection_id", False), ("host", False), ("kernel", False),
    ("cpu", False), ("started", False), ("state", False), ("rows", True), ("tables", True),
)  # fmt: skip


def _ls_cells(row: dict[str, Any]) -> list[str]:
    started = row["started_at"]
    cpu = row["cpu_model"] or "-"
    return [
        row["benchmark"],
        row["collection_id"],
        row["host"] or "-",
        row["kernel"] or "-",
        f"{cpu} x{row['logical_cpus']}" if row["logical_cpus"] else cpu,
        started.strftime("%Y-%m-%d %H:%M:%S") if started else "-",
        row["state"] or "-",
        f"{row['total_rows']:,}" if row["total_rows"] is not None else "-",
        str(len(row["rows"] or [])),
    ]


def _columns(heads: tuple[tuple[str, bool], ...], cells: list[list[str]]) -> list[str]:
    """Lines of aligned columns, a header first (as ``ps`` or ``kubectl get``): plain text
    costs microseconds a row where a rich table measured every cell (2 s for 1,000 rows),
    and it is what grep, awk and a pager read."""
    widths = [max(len(h), *(len(r[k]) for r in cells)) for k, (h, _) in enumerate(heads)]
    lines = []
    for line in ([h for h, _ in heads], *cells):
        text = "  ".join(
            cell.rjust(w) if right else cell.ljust(w)
            for cell, w, (_, right) in zip(line, widths, heads, strict=True)
        )
        lines.append(text.rstrip())
    return lines


@fleet_group.command("reindex", epilog=URI_HELP)
@click.argument("uri")
@click.option("--no-progress", is_flag=True, help="no progress bar on a terminal.")
@click.option(
    "--pages",
    is_flag=True,
    help="read every page of every part and check it against its checksum (the whole "
    "dataset is read), not each part's footer alone: finds a part damaged inside.",
)
def reindex_command(uri: str, no_progress: bool, pages: bool) -> None:
    """Rebuild the index of the dataset at URI from its collections' manifests and
    parts: for a dataset copied by other means, or after collections were deleted.
    Each part's footer is read (push already checked every page on the way in);
    --pages reads every page of every part against its checksum too, which reads
    the whole dataset.

    A collection whose manifest or a part is damaged is named and left out: its
    row, if any, is removed (the index lists whole collections: its readers skip
    it), and `fleet ls` names it until it is pushed again. The others are indexed
    and the exit code is 1.

    \b
    Example:
      kernmlops fleet reindex /mnt/share/fleet
      kernmlops fleet reindex --pages s3://bucket/fleet
    """
    from kernmlops.fleet.index import reindex
    from kernmlops.fleet.store import PublishError, describe_error, open_dataset

    try:
        dataset = open_dataset(uri)
        try:
            with progress("reindexing", "collections", enabled=not no_progress) as steps:
                done = reindex(dataset, progress=steps, pages=pages)
        except OSError as err:
            raise PublishError(f"cannot reindex {dataset.uri}: {describe_error(err)}") from None
    except KernmlopsError as err:
        fail(err)
    for where, why in done.skipped:
        _say(f"warning: {where}: not indexed, damaged (its row, if any, removed): {why}")
    _say(
        f"{done.written} collections indexed"
        + (f", {len(done.skipped)} damaged and skipped" if done.skipped else "")
        + f", {done.removed} stale rows removed ({dataset.uri})"
    )
    if done.skipped:
        sys.exit(1)


def publish_target(uri: str) -> Dataset:
    """``collect --publish URI``: the dataset, opened and reached before collecting.

    Raises:
        PublishError: the URI is bad or the dataset cannot be reached.
    """
    from kernmlops.fleet.store import open_dataset, probe

    dataset = open_dataset(uri)
    with waiting(f"reaching {dataset.uri}"):
        probe(dataset)
    return dataset


def publish_collection(path: Path, dataset: Dataset, *, show: bool | None = None) -> int:
    """``collect --publish``: push the finished collection; 0, or the error's exit code
    (the error is printed; the collection stays where it was written). ``show`` False:
    no progress (``--no-progress``)."""
    from kernmlops.fleet.push import collection_bytes, push_collection

    try:
        total = collection_bytes(path)
        with progress("publishing", "bytes", total=total, enabled=show) as steps:
            result = push_collection(path, dataset, on_file=lambda _, size: steps.advance(size))
    except KernmlopsError as err:
        click.echo(f"error: not published: {err} (the collection is kept in {path})", err=True)
        return err.exit_code
    _say(f"published {result.line()}")
    return 0


def _local_dataset_checked(dataset: str) -> None:
    """Fail, in one line, where ``dataset`` is a local folder (a path, or ``file://``)
    that is not there or holds no index: said at once, not after Spark started (a
    missing folder was 'no _index/ (is it a dataset ...)', 15 s of JVM log later).
    Other schemes are Spark's to open."""
    from urllib.parse import unquote, urlsplit

    from kernmlops.errors import ConfigError
    from kernmlops.fleet.index import INDEX_DIR

    scheme = urlsplit(dataset).scheme.lower()
    if scheme not in ("", "file"):
        return
    if not scheme and (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
        return  # a bare path is on Hadoop's default filesystem (HDFS), not here
    folder = Path(unquote(urlsplit(dataset).path) if scheme else dataset)
    if not folder.is_dir():
        why = "not a folder" if folder.exists() else "no such folder"
        fail(ConfigError(f"{dataset}: {why} (DATASET is the folder kernmlops push wrote)"))
    if not (folder / INDEX_DIR).is_dir():
        fail(
            ConfigError(f"{dataset}: no {INDEX_DIR}/ (is it a dataset that kernmlops push wrote?)")
        )


@click.command("spark-job", context_settings=CONTEXT_SETTINGS)
@click.argument("dataset")
@click.argument("out")
@click.option(
    "--master",
    metavar="URL",
    help="the Spark cluster, e.g. spark://head:7077 (default: local[*], this machine).",
)
def spark_job_command(dataset: str, out: str, master: str | None) -> None:
    """Summarise every published collection of DATASET with Spark; write to OUT.

    \b
    Three Parquet tables under OUT:
      collections     one row per collection: host, kernel, CPU, benchmark,
                      switches/s, faults, block I/O latency (mean, p50, p99)
      quanta_by_comm  per collection and command: quanta, run time and queue
                      time (count, mean, p50, p99)
      mllb            MLLB's features and label from every lb collect collection

    Only the collections DATASET's index lists are read (a collection that
    `kernmlops fleet reindex` found damaged has no row). A file Spark cannot read
    is one error line naming it and what to do.

    DATASET and OUT are paths Spark opens: a folder, file://, hdfs://, or s3a://
    (with hadoop-aws on Spark's class path). On a cluster without this command,
    submit the job itself: spark-submit --master URL
    $(python -m kernmlops.fleet.spark_job --path) DATASET OUT.
    Needs pyspark and Java 17 (make interop).

    \b
    Examples:
      kernmlops spark-job /mnt/share/fleet summaries/
      kernmlops spark-job s3a://lab-kernel-data/fleet s3a://lab-kernel-data/summaries \\
          --master spark://head:7077
    """
    import importlib.util

    from kernmlops.errors import ConfigError

    _local_dataset_checked(dataset)  # before Spark takes its 15 s to start
    if importlib.util.find_spec("pyspark") is None:
        fail(ConfigError("spark-job needs pyspark (pip install 'kernmlops[interop]')"))
    from kernmlops.fleet.spark_job import OUTPUTS, JobError, run, start

    try:
        spark = start(master or "local[*]")
    except JobError as err:
        fail(err)
    try:
        written = run(spark, dataset, out)
    except FileNotFoundError as err:
        fail(ConfigError(str(err)))
    except JobError as err:
        fail(err)
    finally:
        spark.stop()
    for name in OUTPUTS:
        n = written.get(name)
        done = f"{n:,} rows -> {out.rstrip('/')}/{name}" if n is not None else "no input"
        _say(f"{name}: {done}")
