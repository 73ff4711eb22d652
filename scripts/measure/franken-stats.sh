#!/bin/bash
# bpf_stats of the tracer's programs under load: stats.sh MODEARGS...
source "$(dirname "$0")/franken-common.sh"
wrk -t1 -c4 -d3s http://127.0.0.1:8091/q.php >/dev/null
sysctl -q kernel.bpf_stats_enabled=1
rm -f /tmp/cost.ready
$LT record --pid $pid "$@" --json /tmp/cost.json --ready-file /tmp/cost.ready 9>&- > /tmp/cost.out 2>/tmp/cost.err &
tp=$!
while [ ! -e /tmp/cost.ready ]; do sleep 0.1; done
c0=$(ps -o time= -p $tp)
wrk -t1 -c4 -d15s http://127.0.0.1:8091/q.php | grep Requests
for f in /proc/$tp/fdinfo/*; do
  if grep -q prog_type $f 2>/dev/null; then
    awk '/prog_type|prog_tag|run_time_ns|run_cnt|prog_id/{printf "%s %s ", $1, $2} END{print ""}' $f
  fi
done | awk '{for(i=1;i<NF;i+=2)v[$i]=$(i+1); if (v["run_cnt:"]>0) printf "type %s id %s tag %s runs %d ns/run %.0f total_ms %.1f\n", v["prog_type:"], v["prog_id:"], v["prog_tag:"], v["run_cnt:"], v["run_time_ns:"]/v["run_cnt:"], v["run_time_ns:"]/1e6}' | sort -u
for t in /proc/$tp/task/*; do echo "$(cat $t/comm) $(awk "{print \$14+\$15}" $t/stat)"; done
kill -INT $tp; wait $tp
sysctl -q kernel.bpf_stats_enabled=0
grep -E "^cpu:|requests" /tmp/cost.out | head -4
bash $K/stop.sh 9>&- >/dev/null
