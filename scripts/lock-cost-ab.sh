#!/bin/bash
# Cost of one lock probe hit, A/B: the kernel's floor (an empty bpftrace
# program) and each given locktrace binary, in alternating rounds, on
# fixtures/bench/calib.c with a `nopl` first instruction (an emulated probe).
# The fixture times itself by its thread's CPU time, so other load on the
# machine does not count. Prints ns per call of each run, then the medians
# and the cost per hit over the untraced loop (~2 ns). As root.
#
# usage: scripts/lock-cost-ab.sh ROUNDS SECONDS LOCKTRACE_BINARY...
# e.g.:  scripts/lock-cost-ab.sh 5 3 /tmp/before/locktrace target/release/locktrace
set -eu
ROUNDS=${1:?rounds}; SECONDS_PER_RUN=${2:?seconds}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS SECONDS LOCKTRACE_BINARY..." >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
CALIB=$WORK/calib-nopl
gcc -O2 -pthread -DCLASS_NOPL -o "$CALIB" "$ROOT"/fixtures/bench/calib.c

# One run: starts the fixture, the tracer ($1: floor or a binary), prints ns/call.
run() {
  coproc FIX { exec "$CALIB" "$SECONDS_PER_RUN"; }
  read -r _ <&"${FIX[0]}"; read -r _ <&"${FIX[0]}"   # "mutex …", "ready"
  local pid=$FIX_PID tracer
  if [ "$1" = floor ]; then
    bpftrace -e "uprobe:$CALIB:pthread_mutex_lock /pid == $pid/ { } BEGIN { printf(\"go\\n\"); }" \
      > "$WORK"/bt.out 2>&1 &
    tracer=$!
    until grep -q go "$WORK"/bt.out; do sleep 0.05; done
  else
    rm -f "$WORK"/ready
    "$1" record --pid "$pid" --placement entry --ready-file "$WORK"/ready \
      --json "$WORK"/out.json > /dev/null 2>&1 &
    tracer=$!
    until [ -e "$WORK"/ready ]; do sleep 0.05; done
  fi
  echo go >&"${FIX[1]}"
  local line
  read -r line <&"${FIX[0]}"; read -r line <&"${FIX[0]}"   # "locks N", "ns_per_lock X"
  [ "$1" = floor ] && kill -TERM "$tracer"   # only the bpftrace we started
  wait "$tracer" || true
  echo "${line#ns_per_lock }"
}

NAMES=(floor "$@")
declare -A RESULTS
for round in $(seq "$ROUNDS"); do
  for name in "${NAMES[@]}"; do
    ns=$(run "$name")
    echo "round $round: $name: $ns ns/call"
    RESULTS[$name]="${RESULTS[$name]:-} $ns"
  done
done
echo
for name in "${NAMES[@]}"; do
  echo "${RESULTS[$name]}" | tr ' ' '\n' | grep . | sort -n |
    awk -v name="$name" '{ v[NR] = $1 } END {
      m = v[int((NR + 1) / 2)]
      printf "%s: median %.1f ns/call (min %.1f, max %.1f, %d runs)\n", name, m, v[1], v[NR], NR }'
done
