#!/usr/bin/env bash
# The main job: build locktrace, start a bundled fixture, trace it, print its report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked --bin locktrace
mkdir -p target/fixtures
gcc -O2 -g -pthread -o target/fixtures/locks-demo fixtures/locks.c
fifo=$(mktemp -u); mkfifo "$fifo"
target/fixtures/locks-demo 4 25000 10000 < "$fifo" > target/fixtures/locks-demo.out &
fixture=$!
exec 3>"$fifo"
sleep 0.2
echo "fixture pid $fixture: 4 threads x 25000 locks of g_lock, 10000 of each thread's heap mutex"
target/release/locktrace record --pid "$fixture" --json target/demo-report.json 2> >(sed 's/^/  /' >&2) &
tracer=$!
# Start the fixture's work once the probes are live.
sleep 1.5
echo go >&3; exec 3>&-
wait "$tracer"
wait "$fixture" || true
rm -f "$fifo"
echo "JSON report: target/demo-report.json"
