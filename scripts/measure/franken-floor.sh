#!/bin/bash
# The kernel's floor for counting every lock call on the real FrankenPHP,
# beside locktrace's all-locks mode, in the same run: the floor is a uprobe
# at each of locktrace's own probe points (read from its debug line) with no
# BPF program, counted by `perf stat` on the target (a perf counter adds
# one to a count per hit: at most what an empty BPF program costs). Every
# traced round sits between two untraced wrk rounds and is compared with
# their mean; prints each row's mean ratio with two standard errors, and
# the hits (floor) or lock calls (locktrace) per request, to show both
# counted the same calls.
# Usage: franken-floor.sh [ROUNDS] [SECONDS]   (default 8 rounds of 5 s)
source "$(dirname "$0")/franken-common.sh"
rounds=${1:-8}; secs=${2:-5}
work=$(mktemp -d)
T=/sys/kernel/tracing
[ -e $T/uprobe_events ] || mount -t tracefs nodev $T
wrk -t1 -c4 -d3s http://127.0.0.1:8091/q.php 9>&- >/dev/null

# locktrace's probe points: "MODULE OFFSET FUNCTION" a line.
RUST_LOG=locktrace=debug timeout -s INT 2 "$LT" record --pid "$pid" --json "$work/points.json" 9>&- 2>&1 >/dev/null |
  sed -n 's/.*probe point \(.*\)+\(0x[0-9a-f]*\) (\([a-z_]*\),.*/\1 \2 \3/p' > "$work/points"
[ -s "$work/points" ] || { echo "franken-floor: locktrace printed no probe points" >&2; exit 1; }
events=(); i=0
while read -r module offset function; do
  echo "p:ltfloor/p$i $module:$offset" >> $T/uprobe_events
  events+=(-e "ltfloor:p$i"); i=$((i + 1))
  echo "floor probe $i: $function at $module+$offset"
done < "$work/points"
cleanup() {
  for j in $(seq 0 $((i - 1))); do echo "-:ltfloor/p$j" >> $T/uprobe_events; done
  rm -rf "$work"; bash "$K/stop.sh" 9>&- >/dev/null
}
trap cleanup EXIT

# "REQUESTS_PER_S REQUESTS" of one wrk round.
load() {
  wrk -t1 -c4 -d"${secs}s" http://127.0.0.1:8091/q.php 9>&- |
    awk '/requests in/{n=$1} /^Requests\/sec/{print $2, n}'
}
# Prints "REQUESTS_PER_S CALLS_PER_REQUEST" of one traced round.
floor_round() {
  perf stat -x, -o "$work/stat" "${events[@]}" -p "$pid" 9>&- &
  local perf_pid=$!
  sleep 0.5
  read -r rate n < <(load)
  kill -INT $perf_pid; wait $perf_pid
  awk -F, -v rate="$rate" -v n="$n" '{hits+=$1} END{print rate, hits / n}' "$work/stat"
}
locktrace_round() {
  rm -f "$work/ready"
  "$LT" record --pid "$pid" --json "$work/all.json" --ready-file "$work/ready" 9>&- >/dev/null 2>&1 &
  local tracer=$!
  while [ ! -e "$work/ready" ]; do sleep 0.05; done
  read -r rate _ < <(load)
  kill -INT $tracer; wait $tracer
  echo "$rate $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["totals"]["per_request"]["acquisitions"])' "$work/all.json")"
}

read -r before _ < <(load)
for round in $(seq "$rounds"); do
  for config in floor locktrace; do
    read -r rate per_request < <(${config}_round)
    read -r after _ < <(load)
    ratio=$(awk -v t="$rate" -v a="$before" -v b="$after" 'BEGIN{printf "%.3f", 2 * t / (a + b)}')
    echo "round $round $config: $rate requests/s (untraced $before/$after): ${ratio}x, $per_request calls per request"
    echo "$config $ratio $per_request" >> "$work/ratios"
    before=$after
  done
done
for config in floor locktrace; do
  awk -v c=$config '$1 == c {r=$2; s+=r; ss+=r*r; n++; p+=$3}
    END{m=s/n; printf "%s: mean %.3fx ±%.3f (2 SE, %d rounds), %.1f calls per request\n", c, m, 2*sqrt((ss/n-m*m)*n/(n-1)/n), n, p/n}' "$work/ratios"
done
