#!/bin/bash
# What a per-CPU cpu-clock sampler's timer interrupts cost the real
# FrankenPHP: perf's own sampler (no BPF) is enabled and disabled through
# its control fifo around back-to-back 1 s wrk rounds, on, off, on, off...
# so the VM's drift (its speed moves by 2x over tens of seconds) falls on
# both sides alike; prints the mean on/off ratio with two standard errors.
# locktrace's sampler is the same timers plus a ~0.5 µs program a sample.
# Usage: franken-sampler-toggle.sh [PAIRS] [HZ]   (default 50 pairs, 999 Hz)
source "$(dirname "$0")/franken-common.sh"
pairs=${1:-50}; hz=${2:-999}
work=$(mktemp -d)
wrk -t1 -c4 -d3s http://127.0.0.1:8091/q.php 9>&- >/dev/null
mkfifo "$work/ctl" "$work/ack"
perf record -e cpu-clock -c $((1000000000 / hz)) -a -D -1 --control "fifo:$work/ctl,$work/ack" -o "$work/perf.data" 9>&- >/dev/null 2>&1 &
perf_pid=$!
exec 7>"$work/ctl" 8<"$work/ack"
sleep 1
rate() { wrk -t1 -c4 -d1s http://127.0.0.1:8091/q.php 9>&- | awk '/^Requests\/sec/{print $2}'; }
for _ in $(seq "$pairs"); do
  echo enable >&7; read -r -t 2 _ <&8
  on=$(rate)
  echo disable >&7; read -r -t 2 _ <&8
  echo "$on $(rate)"
done > "$work/pairs"
kill -INT $perf_pid; wait $perf_pid
awk -v hz="$hz" '{a+=$1; b+=$2; r=$1/$2; s+=r; ss+=r*r; n++}
  END{m=s/n; printf "%d Hz: sampler on %.0f, off %.0f requests/s; mean on/off ratio %.3f ±%.3f (2 SE, %d pairs)\n", hz, a/n, b/n, m, 2*sqrt((ss/n-m*m)*n/(n-1)/n), n}' "$work/pairs"
rm -rf "$work"
bash "$K/stop.sh" 9>&- >/dev/null
