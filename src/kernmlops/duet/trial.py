"""One trial in a process of its own: ``python -m kernmlops.duet.trial SPEC OUT``.

``duet run --collect`` runs each trial this way, as the benchmark of a
kernmlops collection whose process-tree filter then follows both sides.
SPEC is JSON (the config as parsed, the trial, the suite folder); the trial's
record is written to OUT as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kernmlops.duet.config import validate_duet_config
from kernmlops.duet.runner import Trial, run_trial
from kernmlops.fileio import write_atomic


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m kernmlops.duet.trial SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    suite = validate_duet_config(spec["config"], spec.get("source"))
    record = run_trial(
        Trial(**spec["trial"]),
        suite,
        Path(spec["folder"]),
        layout=spec.get("layout", "kernmlops"),
    )
    write_atomic(argv[1], json.dumps(record.as_dict()))
    return 0 if record.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
