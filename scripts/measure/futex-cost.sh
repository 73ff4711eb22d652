#!/bin/bash
# What contention mode's futex programs cost a futex call: futex-loop.c
# (a wait that returns at once, then a wake with no waiter; ns per call by
# the thread's CPU time) untraced and traced by `locktrace record --mode
# contention --no-cpu`, in alternating rounds; with the programs' own run
# time per call from kernel.bpf_stats_enabled. Needs root.
# Usage: futex-cost.sh [ROUNDS] [CALLS]
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd); LT=${LT:-$ROOT/target/release/locktrace}
work=$(mktemp -d)
gcc -O2 -o "$work/futex-loop" "$ROOT/scripts/measure/futex-loop.c"
calls=${2:-1000000}
for round in $(seq 1 "${1:-3}"); do
  echo "untraced: $("$work/futex-loop" "$calls" 3)"
  rm -f "$work/ready" "$work/go"
  "$work/futex-loop" "$calls" 3 "$work/go" > "$work/loop.out" &
  loop=$!
  sysctl -q kernel.bpf_stats_enabled=1
  "$LT" record --pid $loop --mode contention --no-cpu --request-probe none --json "$work/report.json" --ready-file "$work/ready" >/dev/null 2>"$work/tracer.err" &
  tracer=$!
  while [ ! -e "$work/ready" ]; do sleep 0.05; done
  touch "$work/go"
  wait $loop
  stats=$(for f in /proc/$tracer/fdinfo/*; do
    grep -q prog_type "$f" 2>/dev/null && awk '/run_time_ns|run_cnt/{printf "%s %s ", $1, $2} END{print ""}' "$f"
  done | awk '{for(i=1;i<NF;i+=2)v[$i]=$(i+1); if (v["run_cnt:"]>0) printf "%.0f ns/run (%d runs) ", v["run_time_ns:"]/v["run_cnt:"], v["run_cnt:"]}')
  sysctl -q kernel.bpf_stats_enabled=0
  echo "traced:   $(cat "$work/loop.out")  programs: $stats"
  kill -INT $tracer; wait $tracer || true
done
rm -rf "$work"
