#!/bin/bash
# untraced noise: N rounds of S s wrk, with /proc/stat busy and steal per round
source "$(dirname "$0")/franken-common.sh"
for i in $(seq 1 ${1:-8}); do
  read -r _ u n s idle io irq sirq st _ < /proc/stat
  r=$(wrk -t1 -c4 -d${2:-10}s http://127.0.0.1:8091/q.php | awk '/Requests\/sec/{print $2}')
  read -r _ u2 n2 s2 idle2 io2 irq2 sirq2 st2 _ < /proc/stat
  busy=$(( (u2+n2+s2+irq2+sirq2) - (u+n+s+irq+sirq) )); steal=$((st2-st)); idl=$((idle2+io2-idle-io))
  echo "round $i rps $r busy $busy idle $idl steal $steal cpu_us_per_req $(echo "$busy*10000/($r*${2:-10})" | bc -l | cut -c1-7)"
done
bash $K/stop.sh 9>&- >/dev/null
