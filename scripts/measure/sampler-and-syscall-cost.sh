#!/bin/bash
# What contention mode costs a process it does not trace: a getppid() loop
# (ns per syscall by thread CPU time) and a user-mode loop (ns per
# iteration by wall clock), untraced and while `locktrace record --mode
# contention` (with and without its CPU sampler) traces a sleeping process.
# Needs root. Usage: sampler-and-syscall-cost.sh [ROUNDS]
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd); LT=${LT:-$ROOT/target/release/locktrace}
work=$(mktemp -d)
gcc -O2 -o "$work/syscall-loop" "$ROOT/scripts/measure/syscall-loop.c"
gcc -O2 -o "$work/user-loop" "$ROOT/scripts/measure/user-loop.c"
sleep 1000 & sleeper=$!
for round in $(seq 1 "${1:-2}"); do
  for args in none "--no-cpu" "" "--cpu-hz 99"; do
    tracer=
    if [ "$args" != none ]; then
      rm -f "$work/ready"
      # shellcheck disable=SC2086
      "$LT" record --pid $sleeper --mode contention $args --json "$work/report.json" --ready-file "$work/ready" >/dev/null 2>&1 &
      tracer=$!
      while [ ! -e "$work/ready" ]; do sleep 0.05; done
    fi
    echo "[${args:-cpu 999 Hz}] syscall: $("$work/syscall-loop" 3000000 3); user: $("$work/user-loop" 100000000 3)"
    if [ -n "$tracer" ]; then kill -INT "$tracer"; wait "$tracer"; fi
  done
done
kill "$sleeper"
rm -rf "$work"
