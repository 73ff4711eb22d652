#!/bin/bash
# Naming cost on a big library with DWARF (issue 10: at most 1 s on a 28 MB
# libphp with DWARF). No libphp with DWARF is packaged; Debian's
# libpython3.11-dbg is the same kind of thing: a C interpreter built as a
# 25 MB shared library that carries its full DWARF. A small program embeds
# it and runs 4 Python threads on a lock (the GIL is a global mutex inside
# `_PyRuntime`, named from DWARF); locktrace (release build) records it and
# the report's `naming` block says what naming cost.
#
# usage: scripts/naming-cost.sh   (root; apt-get install python3.11-dbg first)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v x86_64-linux-gnu-python3.11d-config >/dev/null || {
    echo "naming-cost: needs Debian's python3.11-dbg: apt-get install -y python3.11-dbg" >&2
    exit 1
}
cargo build --release -p tracer-user -q
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/embed.c" <<'C'
#include <Python.h>
int main(int argc, char **argv) {
    (void)argc;
    Py_Initialize();
    FILE *script = fopen(argv[1], "r");
    int rc = script ? PyRun_SimpleFile(script, argv[1]) : 1;
    Py_Finalize();
    return rc;
}
C
cat > "$work/threads.py" <<'PY'
import sys, threading, time
sys.stdin.readline()
lock = threading.Lock()
count = [0]
def work():
    for _ in range(20000):
        with lock:
            count[0] += 1
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(30)
PY
# shellcheck disable=SC2046
gcc -O2 -o "$work/embed" "$work/embed.c" $(x86_64-linux-gnu-python3.11d-config --embed --cflags --ldflags)
library=$(ldd "$work/embed" | awk '/libpython/ {print $3}')
echo "library: $library ($(stat -Lc %s "$library") bytes, .debug_info $(readelf -SW "$library" | awk '$2 == ".debug_info" {print strtonum("0x" $6)}') bytes)"
mkfifo "$work/go"
"$work/embed" "$work/threads.py" < "$work/go" > /dev/null &
target=$!
exec 9> "$work/go"
sleep 1
target/release/locktrace record --pid "$target" --duration 4 --json "$work/report.json" > /dev/null 2> "$work/stderr" &
tracer=$!
sleep 1.5
echo go >&9
wait "$tracer"
exec 9>&-
kill "$target"
python3 - "$work/report.json" <<'PY'
import json, sys
naming = json.load(open(sys.argv[1]))["naming"]
print(f"naming at the end: {naming['elapsed_ms']:.0f} ms")
for line in naming.get("debug_info", []):
    print("DWARF read:", line)
live = naming.get("live")
if live:
    print(f"during the recording: {live['searches']} searches, {live['elapsed_ms']:.0f} ms in all, longest search {live['max_search_ms']:.0f} ms")
PY
