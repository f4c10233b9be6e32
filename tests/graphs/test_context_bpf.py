"""The tests of test_context.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.graphs.test_context import _as_unprivileged


@pytest.mark.bpf
def test_a_collection_that_recorded_no_rows_is_said_so_not_as_damage() -> None:
    """A real collection of a hook that saw nothing (block_io of a sleeping process for
    a second: no I/O; an exec'd command may read its binary from disk): graph and
    report, as root and as another user, say it recorded no rows in one line and exit 1,
    writing nothing; read_collection raises the same."""
    from kernmlops.data import read_collection
    from kernmlops.errors import CollectionError, EmptyCollectionError

    top = Path(tempfile.mkdtemp(prefix="kmo-empty-"))
    asleep = subprocess.Popen(["sleep", "120"])
    try:
        top.chmod(0o755)  # nobody reaches the collection (and reads it)
        collect = [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-b", "faux",
                   "-o", str(top / "data"), "--hooks", "block_io", "--tgid", str(asleep.pid),
                   "-d", "1"]  # fmt: skip
        proc = subprocess.run(collect, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (c,) = (top / "data" / "curated").glob("benchmark=faux/collection_id=*")
        for path in [top, *top.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        manifest = json.loads((c / "manifest.json").read_text())
        assert manifest["state"] == "duration"
        assert manifest["hooks"]["block_io"]["rows"] == {"block_io": 0}
        assert not [p for p in c.iterdir() if p.is_dir()]  # no table folder: no part
        events = manifest["hooks"]["block_io"]["events"]
        plural = "" if events == 1 else "s"
        said = (
            f"error: {c}: the collection recorded no rows (duration after "
            f"{manifest['duration_s']:.1f} s; block_io: {events:,} event{plural})"
        )
        with pytest.raises(EmptyCollectionError) as info:
            read_collection(c)
        assert isinstance(info.value, CollectionError)
        assert f"error: {info.value}" == said
        out = top / "out"
        out.mkdir(mode=0o777)
        out.chmod(0o777)
        for argv in (["graph", str(c), "-o", str(out / "g")],
                     ["report", str(c), "-o", str(out / "r.html")]):  # fmt: skip
            for wrap in (list, _as_unprivileged):
                run = wrap([sys.executable, "-m", "kernmlops", *argv])
                proc = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd="/")
                assert proc.returncode == 1, proc.stderr[-3000:]
                assert proc.stderr.splitlines() == [said]
                assert not re.search(r"Parquet|damage", proc.stderr)
                assert list(out.iterdir()) == []
    finally:
        asleep.kill()
        asleep.wait()
        shutil.rmtree(top)
