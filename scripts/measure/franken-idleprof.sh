#!/bin/bash
source "$(dirname "$0")/franken-common.sh"
wrk -t1 -c4 -d3s http://127.0.0.1:8091/q.php >/dev/null
rm -f /tmp/cost.ready
$LT record --pid $pid "$@" --json /tmp/cost.json --ready-file /tmp/cost.ready 9>&- > /tmp/cost.out 2>/tmp/cost.err &
tp=$!
while [ ! -e /tmp/cost.ready ]; do sleep 0.1; done
sleep 2
a=$(awk '{print $14+$15}' /proc/$tp/stat)
perf record -e cpu-clock -F 2999 --call-graph dwarf -p $tp -o /tmp/prof.data -- sleep 10 2>/dev/null >/dev/null
b=$(awk '{print $14+$15}' /proc/$tp/stat)
echo "tracer ticks in 10 s idle: $((b-a))"
kill -INT $tp; wait $tp
bash $K/stop.sh 9>&- >/dev/null
perf report -i /tmp/prof.data --children --sort sym --stdio -g none 2>/dev/null | grep -v "^#" | grep "%" | head -50
