#!/usr/bin/env bash
# The 16-core run that bench/README.md asks for ("What the next run here should
# measure"), in one command with a time budget, on a machine with Python 3.12
# and no compiler, stress-ng or network. From the root of a checkout that
# carries the bundle (bench/bundle.sh: .dev/ and bench/build/):
#
#   OUT=DIR bash bench/scale.sh
#
# DIR gets run.log, facts.txt and one results file per phase:
#   overhead.json       the storm (bench/switch_storm.c, a pair per CPU) untraced /
#                       under the count-only floor / the default hooks, interleaved
#                       rounds until the phase's deadline (the cost target wants
#                       as many as fit; STATES adds quanta_runtime's programs alone)
#   storm-tree.json     `collect -- storm` for STORM_TREE_S s: drops, RSS, end -> exit,
#                       the copier's CPU and runway
#   switch-cost.json    one storm, the floor and quanta_runtime's programs attached in
#                       turn, COST_ROUNDS rounds: the storm tasks' CPU per switch-in
#                       each adds (schedstat), the cost target's precise form
#   overhead-2cpu.json  the same storm rounds with everything on CPUs 0 and 1
# Environment: BUDGET_S (default 540: the whole run; each phase starts nothing that
# would end past its share), STORM_S (5), STORM_TREE_S (60), ROUNDS2 (2), COST_ROUNDS (20),
# STATES (off,floor,default; `programs` is the fourth), KMO_PY (the interpreter),
# LOCAL=1 (a rehearsal here: this checkout's venv and short runs; bench/rehearse.sh
# rehearses the install path too, in an Ubuntu 24.04 chroot).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV=${DEV:-$ROOT/.dev}
OUT=${OUT:-/tmp/kmo-scale}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
LOCAL=${LOCAL:-0}
T0=$(date +%s)
if [ "$LOCAL" = 1 ]; then
  BUDGET_S=${BUDGET_S:-240}; STORM_S=${STORM_S:-2}; STORM_TREE_S=${STORM_TREE_S:-6}
  PY=${KMO_PY:-$ROOT/.venv/bin/python}
else
  BUDGET_S=${BUDGET_S:-540}; STORM_S=${STORM_S:-5}; STORM_TREE_S=${STORM_TREE_S:-60}
  PY=${KMO_PY:-$( [ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || command -v python3)}
fi
ROUNDS2=${ROUNDS2:-2}
COST_ROUNDS=${COST_ROUNDS:-$( [ "$LOCAL" = 1 ] && echo 4 || echo 20 )}
STATES=${STATES:-off,floor,default}
SITE=/tmp/kmo-site

elapsed() { echo $(( $(date +%s) - T0 )); }
# step NAME LIMIT_S CMD...: run it, log its exit code and time; a failure never stops the next
step() {
  local name=$1 limit=$2 t1=$SECONDS rc; shift 2
  echo "=== [$(elapsed) s] $name (at most ${limit} s): $*"
  timeout -k 15 "$limit" "$@"; rc=$?
  echo "=== [$(elapsed) s] $name: rc=$rc in $(( SECONDS - t1 )) s"
}
left() { local s=$(( $1 - $(date +%s) )); [ "$s" -lt 10 ] && s=10; echo "$s"; }

main() {
  cd "$ROOT" || exit 1
  echo "scale run: LOCAL=$LOCAL BUDGET_S=$BUDGET_S python=$PY start=$(date -u +%FT%TZ)"
  if [ "$LOCAL" != 1 ]; then
    # the wheel and what it needs, installed as a user would (no compiler here)
    rm -rf "$SITE" /tmp/kmo-whl && mkdir -p /tmp/kmo-whl
    cp "$DEV"/whl/*.whl /tmp/kmo-whl/
    for f in "$DEV"/whl/*.whl.xz; do
      [ -e "$f" ] && xz -dc "$f" > "/tmp/kmo-whl/$(basename "${f%.xz}")"
    done
    step "pip install" 240 "$PY" -m pip install -q --no-index --no-deps --no-compile \
      --target "$SITE" /tmp/kmo-whl/*.whl
    export PYTHONPATH=$SITE
    # libbpf and libelf (and libz where the image has none) from the bundle
    export LD_LIBRARY_PATH="$DEV/lib:$DEV/lib/zlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    STORM=$DEV/bin/storm
  else
    STORM=${STORM:-$DEV/bin/storm}
  fi
  chmod +x "$STORM" 2>/dev/null
  {
    uname -a; echo "nproc: $(nproc)"; grep -m1 'model name' /proc/cpuinfo; free -g | head -2
    df -h /tmp /dev/shm; "$STORM" 2 0.2
    "$PY" -m kernmlops --version
    "$PY" -c 'import kernmlops, sys; print("kernmlops from", kernmlops.__file__)'
  } 2>&1 | tee "$OUT/facts.txt"

  # the phases' deadlines: the 2-CPU rounds last, the switch cost and the tree
  # storm before them, the all-CPU rounds get what is left
  local need2=$(( ROUNDS2 * 3 * (STORM_S + 8) + 20 ))
  local need_cost=$(( COST_ROUNDS * 3 * 14 / 10 + 20 ))
  local need_tree=$(( 2 * STORM_TREE_S + 40 ))
  local d_end=$(( T0 + BUDGET_S - 5 ))
  local d_cost=$(( d_end - need2 ))
  local d_tree=$(( d_cost - need_cost ))
  local d_all=$(( d_tree - need_tree ))
  echo "deadlines: all CPUs +$(( d_all - T0 )) s, tree storm +$(( d_tree - T0 )) s," \
    "switch cost +$(( d_cost - T0 )) s, 2 CPUs +$(( d_end - T0 )) s"

  step "storm, every CPU" "$(left $(( d_all + 40 )))" "$PY" -m bench overhead --skip-default \
    --hooks-alone none --storm "$STORM" --storm-s "$STORM_S" --storm-rounds 100 \
    --storm-states "$STATES" --deadline "$d_all" --out "$OUT/overhead.json"
  step "storm on its own tree" "$(left $(( d_tree + 20 )))" "$PY" -m bench storm-tree \
    --storm "$STORM" --seconds "$STORM_TREE_S" --rounds 1 --deadline "$d_tree" \
    --out "$OUT/storm-tree.json"
  step "switch cost" "$(left $(( d_cost + 20 )))" "$PY" -m bench switch-cost --storm "$STORM" \
    --pairs "$(nproc)" --rounds "$COST_ROUNDS" --deadline "$d_cost" --out "$OUT/switch-cost.json"
  step "storm, CPUs 0 and 1" "$(left $(( d_end + 10 )))" taskset -c 0,1 "$PY" -m bench overhead \
    --skip-default --hooks-alone none --storm "$STORM" --storm-s "$STORM_S" \
    --storm-rounds "$ROUNDS2" --storm-states off,floor,default --deadline "$d_end" \
    --out "$OUT/overhead-2cpu.json"
  echo "--- the busiest processes now (strays would show here)"
  ps -eo pid,pcpu,etimes,comm --sort=-pcpu | head -6
  echo "done in $(elapsed) s"; ls -la "$OUT"
}

main 2>&1 | tee "$OUT/run.log"
