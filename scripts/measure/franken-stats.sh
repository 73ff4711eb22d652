#!/bin/bash
# bpf_stats of the tracer's programs under load: stats.sh MODEARGS...
source "$(dirname "$0")/franken-common.sh"
source "$(dirname "$0")/prog-stats.sh"
wrk -t1 -c4 -d3s http://127.0.0.1:8091/q.php >/dev/null
sysctl -q kernel.bpf_stats_enabled=1
rm -f /tmp/cost.ready
$LT record --pid $pid "$@" --json /tmp/cost.json --ready-file /tmp/cost.ready 9>&- > /tmp/cost.out 2>/tmp/cost.err &
tp=$!
while [ ! -e /tmp/cost.ready ]; do sleep 0.1; done
c0=$(ps -o time= -p $tp)
wrk -t1 -c4 -d15s http://127.0.0.1:8091/q.php | grep Requests
prog_stats $tp
for t in /proc/$tp/task/*; do echo "$(cat $t/comm) $(awk "{print \$14+\$15}" $t/stat)"; done
kill -INT $tp; wait $tp
sysctl -q kernel.bpf_stats_enabled=0
grep -E "^cpu:|requests" /tmp/cost.out | head -4
bash $K/stop.sh 9>&- >/dev/null
