#!/bin/bash
# Cost of the kernel lock tracepoints (issue 50) on an uncontended workload,
# A/B in alternating rounds: fixtures/map_worker.c with one mapping thread
# and no faulter (mmap, touch, munmap: the mmap_lock is never contended, so
# lock:contention_begin never fires for it) under `locktrace record --mode
# contention --no-cpu` with the kernel lock programs attached (on) and left
# out (off: the LOCKTRACE_TEST_KERNEL_WITHOUT=lock_events switch), and
# untraced. The fixture times its own work (wall clock). Prints each run,
# then the medians, and the contentions the "on" runs counted. As root.
#
# usage: scripts/kernel-locks-ab.sh ROUNDS MAP_ROUNDS LOCKTRACE_BINARY
# e.g.:  scripts/kernel-locks-ab.sh 7 20000 target/release/locktrace
set -eu
ROUNDS=${1:?rounds}; MAP_ROUNDS=${2:?map rounds}; LOCKTRACE=${3:?locktrace binary}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
FIXTURE=$WORK/map_worker
gcc -O2 -g -pthread -o "$FIXTURE" "$ROOT"/fixtures/map_worker.c

# One run ($1: untraced, on, off): prints the work's ns (and, on, its contentions).
run() {
  coproc FIX { exec "$FIXTURE" "$MAP_ROUNDS" 1 0; }
  read -r _ <&"${FIX[0]}"   # "ready"
  local pid=$FIX_PID tracer=""
  if [ "$1" != untraced ]; then
    rm -f "$WORK"/ready "$WORK"/r.json
    if [ "$1" = off ]; then export LOCKTRACE_TEST_KERNEL_WITHOUT=lock_events; fi
    "$LOCKTRACE" record --pid "$pid" --mode contention --no-cpu --json "$WORK"/r.json \
      --ready-file "$WORK"/ready > /dev/null 2>&1 &
    tracer=$!
    unset LOCKTRACE_TEST_KERNEL_WITHOUT
    until [ -e "$WORK"/ready ]; do sleep 0.05; done
  fi
  echo go >&"${FIX[1]}"
  local line ns=""
  while read -r line <&"${FIX[0]}"; do
    case $line in work_ns*) ns=${line#work_ns }; ;; done) break ;; esac
  done
  if [ -n "$tracer" ]; then kill -INT "$tracer"; wait "$tracer" || true; fi
  exec {FIX[1]}>&-
  wait "$pid" || true
  local contentions=""
  if [ "$1" = on ]; then
    contentions=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kernel_locks"]["contentions"])' "$WORK"/r.json)
  fi
  echo "$1 $ns $contentions"
}

for _ in $(seq "$ROUNDS"); do
  for kind in untraced off on; do run "$kind"; done
done | tee "$WORK"/runs
echo "medians (ms of work):"
for kind in untraced off on; do
  awk -v k="$kind" '$1 == k { print $2 }' "$WORK"/runs | sort -n |
    awk -v k="$kind" '{ v[NR] = $1 } END { printf "  %-8s %.1f\n", k, v[int((NR + 1) / 2)] / 1e6 }'
done
awk '$1 == "on" { c += $3 } END { printf "contentions counted in the on runs: %d\n", c }' "$WORK"/runs
