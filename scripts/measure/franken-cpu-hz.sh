#!/bin/bash
# What the CPU sampler costs FrankenPHP at each rate: franken-cpu-hz.sh ROUNDS SECONDS.
# Every round runs contention mode without the sampler and at 99, 499 and
# 999 Hz, each between two untraced wrk runs; prints traced / mean(untraced).
source "$(dirname "$0")/franken-common.sh"
url=http://127.0.0.1:8091/q.php
rps() { wrk -t1 -c4 -d"$1"s $url | awk '/Requests\/sec/{print $2}'; }
wrk -t1 -c4 -d3s $url >/dev/null
before=$(rps "$2")
for round in $(seq 1 "$1"); do
  for cpu in --no-cpu "--cpu-hz 99" "--cpu-hz 499" "--cpu-hz 999"; do
    rm -f /tmp/cpu-hz.ready
    # shellcheck disable=SC2086
    $LT record --pid "$pid" --mode contention $cpu --ready-file /tmp/cpu-hz.ready 9>&- >/dev/null 2>&1 &
    tracer=$!
    while [ ! -e /tmp/cpu-hz.ready ]; do sleep 0.1; done
    traced=$(rps "$2")
    kill -INT $tracer; wait $tracer
    after=$(rps "$2")
    echo "round $round $cpu: $(echo "$traced / (($before + $after) / 2)" | bc -l | cut -c1-5) ($traced against $before, $after)"
    before=$after
  done
done
bash "$K/stop.sh" 9>&- >/dev/null
