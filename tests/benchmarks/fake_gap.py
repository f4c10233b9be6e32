"""A stand-in for a built GAP (gapbs) folder: shell scripts that take GAP's
arguments and print GAP's output format, for tests where the real suite cannot
be fetched.

- ``converter -g S -k K [-w] -b OUT`` writes a one-line "graph" to OUT and
  appends its arguments to ``converter.log``.
- each kernel (``bfs``, ``pr``, ...) ``-f GRAPH -n N [-v] [-x CODE]`` reads the
  graph (failing like GAP when it is missing), burns a little CPU per trial,
  prints trial ``i`` as ``i`` milliseconds (so tests can predict every value),
  appends ``<kernel> <graph>`` to ``kernel.log`` and exits with CODE (default 0).
"""

from __future__ import annotations

from pathlib import Path

KERNELS = ("pr", "bfs", "cc", "bc", "sssp", "tc")

CONVERTER = r"""#!/bin/sh
args="$*"
scale= degree=16 weighted=0 out=
while [ $# -gt 0 ]; do
  case "$1" in
    -g) scale=$2; shift 2 ;;
    -k) degree=$2; shift 2 ;;
    -w) weighted=1; shift ;;
    -b) out=$2; shift 2 ;;
    *) echo "converter: unknown option $1" >&2; exit 1 ;;
  esac
done
if [ -z "$scale" ] || [ -z "$out" ]; then echo "converter: need -g and -b" >&2; exit 1; fi
echo "$args" >> "$(dirname "$0")/converter.log"
nodes=$((1 << scale))
edges=$((nodes * degree / 2))
echo "fakegraph $nodes $edges $weighted $degree" > "$out"
printf '%-21s%3.5f\n' "Generate Time:" 0.01234
printf '%-21s%3.5f\n' "Build Time:" 0.00456
echo "Graph has $nodes nodes and $edges undirected edges for degree: $degree"
"""

KERNEL = r"""#!/bin/sh
graph= trials=16 verify=0 code=0
while [ $# -gt 0 ]; do
  case "$1" in
    -f) graph=$2; shift 2 ;;
    -n) trials=$2; shift 2 ;;
    -v) verify=1; shift ;;
    -x) code=$2; shift 2 ;;
    *) echo "$(basename "$0"): unknown option $1" >&2; exit 1 ;;
  esac
done
if [ ! -f "$graph" ]; then echo "Couldn't open file $graph" >&2; exit 255; fi
read -r magic nodes edges weighted degree < "$graph"
if [ "$magic" != fakegraph ]; then echo "not a graph: $graph" >&2; exit 255; fi
echo "$(basename "$0") $graph" >> "$(dirname "$0")/kernel.log"
printf '%-21s%3.5f\n' "Read Time:" 0.00321
echo "Graph has $nodes nodes and $edges undirected edges for degree: $degree"
i=1
while [ "$i" -le "$trials" ]; do
  j=0
  while [ "$j" -lt 20000 ]; do j=$((j + 1)); done
  printf '%-21s0.%05d\n' "Trial Time:" "$((i * 100))"
  if [ "$verify" = 1 ]; then
    printf '%-21s%s\n' "Verification:" PASS
    printf '%-21s%3.5f\n' "Verification Time:" 0.00777
  fi
  i=$((i + 1))
done
# mean of 1..n milliseconds = (n + 1) / 2 ms, printed with five decimals
printf '%-21s0.%05d\n' "Average Time:" "$(((trials + 1) * 50))"
exit "$code"
"""


def make_fake_gap(folder: Path, kernels: tuple[str, ...] = KERNELS) -> Path:
    """Write the fake suite into ``folder`` (created) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {"converter": CONVERTER, **dict.fromkeys(kernels, KERNEL)}
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder


def log_lines(folder: Path, name: str) -> list[str]:
    """Lines of the fake's converter.log or kernel.log (none if never run)."""
    path = folder / name
    return path.read_text().splitlines() if path.exists() else []
