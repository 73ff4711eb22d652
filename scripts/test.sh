#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, lint, then every test
# (unit and real-BPF integration tests; run as root).
#
# The integration tests leave most of the CPU idle (they wait on servers,
# fixtures and deadlines: 75-95 % idle in 10 s samples), so what only needs
# CPU runs beside them, niced (15 for the kits, 19 for the rest), so that a
# test's own processes always come first:
# - the kits (the real FrankenPHP, mod_php, the static and Docker-shaped
#   builds: 25-30 minutes on a fresh machine, seconds once built in /tmp/e2e)
#   build while lint and the tests that do not need them run; the tests in
#   KIT_TESTS run after. Those others run with LOCKTRACE_KITS_PENDING set,
#   and the tests' kit helpers refuse it, so a test that needs a kit and is
#   not listed fails on every machine, not only on a fresh one;
# - tests/dist.rs, whose release build is ~4 minutes of compiling.
# The kernel matrix runs last, alone (see there).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target /tmp/e2e/logs

# The path of an integration test binary of tracer-user, built if needed.
test_binary() {
    cargo test --locked -p tracer-user --features root-tests --test "$1" --no-run --message-format=json |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}

# Integration test binaries that need the kits (/tmp/e2e).
KIT_TESTS=(agent apache_php frankenphp_real frankenphp_shapes frankenphp_static frankenphp_stripped php_routes)

bash scripts/setup.sh
kits_log=/tmp/e2e/logs/setup-kits.log
# nice 15: before the other background work (nice 19), after any test.
# Each background job runs in a process group of its own (setsid), so that
# stopping it stops its children too (make, cargo, the fixtures).
setsid nice -n 15 bash scripts/setup.sh --frankenphp >"$kits_log" 2>&1 &
kits=$!
# A background job left running when this script fails would outlive it.
background=("$kits")
trap 'for pid in "${background[@]}"; do kill -- "-$pid" 2>/dev/null || true; done' EXIT

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked --features tracer-user/root-tests -- -D warnings
# The BPF crate is its own workspace (nightly, bpfel-unknown-none).
(cd tracer-ebpf && cargo +nightly fmt --check && CARGO_TARGET_DIR=../target/bpf cargo +nightly clippy --release --locked -- -D warnings)

# Every integration test binary but the kits' (the list is checked: a name
# in KIT_TESTS that is no test binary stops here).
others=$(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
kit = set(sys.argv[1:])
tests = {t["name"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tracer-user"
         for t in p["targets"] if "test" in t["kind"]}
unknown = kit - tests
if unknown:
    sys.exit("scripts/test.sh: KIT_TESTS names no test binary: " + " ".join(sorted(unknown)))
print(" ".join("--test " + t for t in sorted(tests - kit - {"dist"})))
' "${KIT_TESTS[@]}")

# Integration tests share 2 cores with the fixtures they trace: two at a time.
export LOCKTRACE_KITS_PENDING=1
# tests/dist.rs (its own release build, ~4 minutes of compiling) beside the
# others, its binary run as cargo runs it (from the package's folder).
# kernel_smoke among the others is the kernel matrix's host row; it also
# compiles the fixtures the matrix's guests run.
dist_test=$(test_binary dist)
dist_log=target/dist-test.log
(cd tracer-user && exec setsid nice -n 19 "$dist_test" --test-threads=1) >"$dist_log" 2>&1 &
dist=$!
background+=("$dist")
# shellcheck disable=SC2086 # $others is a list of arguments
cargo test --workspace --locked --features tracer-user/root-tests --lib --bins $others -- --test-threads=2
unset LOCKTRACE_KITS_PENDING

if ! wait "$kits"; then
    tail -n 20 "$kits_log" >&2
    echo "test.sh: building the kits failed (log: $kits_log; by hand: bash scripts/setup.sh --frankenphp)" >&2
    exit 1
fi
cat "$kits_log" >&2
cargo test --locked -p tracer-user --features root-tests $(printf -- '--test %s ' "${KIT_TESTS[@]}") -- --test-threads=2

if ! wait "$dist"; then
    cat "$dist_log"
    echo "test.sh: tests/dist.rs failed (above; log: $dist_log)" >&2
    exit 1
fi
cat "$dist_log"
# The kernel matrix (issue 36): the smoke set inside Debian's 5.10, 6.1 and
# 6.12 under qemu, one guest a core (the host's row ran above). Not beside
# the tests: a TCG guest needs its whole core (at nice 19 beside them two
# guests of three failed their smoke tests' deadlines).
LOCKTRACE_MATRIX_HOST=0 bash scripts/kernel-matrix.sh
