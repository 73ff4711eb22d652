#!/bin/bash
# What contention mode's futex programs cost a futex call: futex-loop.c
# (a wait that returns at once, then a wake with no waiter; ns per call by
# the thread's CPU time) untraced and traced by `locktrace record --mode
# contention --no-cpu`, in alternating rounds; with the programs' own run
# time per call from kernel.bpf_stats_enabled. Needs root.
# Usage: futex-cost.sh [ROUNDS] [CALLS]
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd); LT=${LT:-$ROOT/target/release/locktrace}
source "$ROOT/scripts/measure/prog-stats.sh"
work=$(mktemp -d)
gcc -O2 -o "$work/futex-loop" "$ROOT/scripts/measure/futex-loop.c"
calls=${2:-1000000}
for round in $(seq 1 "${1:-3}"); do
  echo "untraced: $("$work/futex-loop" "$calls" 3)"
  rm -f "$work/ready" "$work/go" "$work/end"
  "$work/futex-loop" "$calls" 3 "$work/go" "$work/end" > "$work/loop.out" &
  loop=$!
  sysctl -q kernel.bpf_stats_enabled=1
  "$LT" record --pid $loop --mode contention --no-cpu --request-probe none --json "$work/report.json" --ready-file "$work/ready" >/dev/null 2>"$work/tracer.err" &
  tracer=$!
  while [ ! -e "$work/ready" ]; do sleep 0.05; done
  touch "$work/go"
  # The loop has printed and waits: the tracer still holds its programs.
  while [ ! -s "$work/loop.out" ]; do sleep 0.05; done
  echo "traced:   $(cat "$work/loop.out")"
  prog_stats $tracer
  sysctl -q kernel.bpf_stats_enabled=0
  touch "$work/end"; wait $loop
  kill -INT $tracer; wait $tracer || true
done
rm -rf "$work"
