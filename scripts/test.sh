#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, lint, then every test
# (unit and real-BPF integration tests; run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --frankenphp
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked --features tracer-user/root-tests -- -D warnings
# The BPF crate is its own workspace (nightly, bpfel-unknown-none).
(cd tracer-ebpf && cargo +nightly fmt --check && CARGO_TARGET_DIR=../target/bpf cargo +nightly clippy --release --locked -- -D warnings)
# Integration tests share 2 cores with the fixtures they trace: run two at a
# time. The real-BPF ones are one binary (tests/integration.rs), whose
# modules mix; those under `serial::` (2 s deadlines under load) run after,
# each module alone.
cargo test --workspace --locked --features tracer-user/root-tests -- --test-threads=2 --skip serial::
serial=$(ls tracer-user/tests/serial | sed -n 's/\.rs$//p')
[ -n "$serial" ] || { echo "test.sh: no modules in tracer-user/tests/serial" >&2; exit 1; }
for module in $serial; do
  cargo test -p tracer-user --locked --features root-tests --test integration -- --test-threads=2 "serial::$module::"
done
# The kernel matrix (issue 36): the smoke set inside Debian's 5.10, 6.1 and
# 6.12 under qemu, about 3 minutes a kernel (the host's row ran above).
LOCKTRACE_MATRIX_HOST=0 bash scripts/kernel-matrix.sh
