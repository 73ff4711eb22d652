#!/bin/bash
# sampled run with per-window debug: samp.sh SECONDS extra-args
source "$(dirname "$0")/franken-common.sh"
wrk -t1 -c4 -d3s http://127.0.0.1:8091/q.php >/dev/null
rm -f /tmp/samp.ready
RUST_LOG=locktrace=debug $LT record --pid $pid --mode sampled --sample 0.1 --request-probe libphp-franken-stock.so:php_request_startup "${@:2}" --json /tmp/samp.json --ready-file /tmp/samp.ready 9>&- > /tmp/samp.out 2>/tmp/samp.err &
tp=$!
while [ ! -e /tmp/samp.ready ]; do sleep 0.1; done
wrk -t1 -c4 -d${1}s http://127.0.0.1:8091/q.php | grep Requests
kill -INT $tp; wait $tp
bash $K/stop.sh 9>&- >/dev/null
grep -E "LOCK_access|requests" /tmp/samp.out | head -3
grep "window closed" /tmp/samp.err | sed 's/.*counted \([0-9.]*\)ms, \([0-9]*\) lock calls, \([0-9]*\) requests/\1 \2 \3/' > /tmp/samp.windows
# lock calls (all locks) per request, over every window and without the first
awk '{c+=$2; r+=$3} NR==1{fc=$2; fr=$3} END {print "calls per request:", c/r, "without the first window:", (c-fc)/(r-fr)}' /tmp/samp.windows
