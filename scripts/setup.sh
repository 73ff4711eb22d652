#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: nightly rust-src, a bpf-linker built
# against the nightly's own LLVM, and the Debian packages the tests use.
# When everything is present this costs well under 5 s.
#   --frankenphp   also build the real FrankenPHP kit the tests run (scripts/test.sh
#                  passes it; about 8 minutes the first time, cached in /tmp/e2e and
#                  /tmp/gobin-venv afterwards), then its static musl variant
#                  (scripts/build-frankenphp-static.sh, about 12 more minutes once),
#                  and mod_php for Apache (scripts/build-modphp.sh, about 5 minutes once),
#                  and PHP 8.2's, 8.4's and 8.5's headers (scripts/fetch-php-headers.sh),
#                  then the shapes users download (scripts/build-frankenphp-shapes.sh:
#                  PHP 8.4 as the Docker images build it, stripped, and static musl
#                  8.2 and 8.4 linked as the release binaries are; two PHP builds of
#                  5-25 minutes each once, by the machine's load).
#                  The kit is $LOCKTRACE_FRANKENPHP_KIT, else shared/frankenphp
#                  beside the repository.
set -euo pipefail

FRANKENPHP=0
for arg in "$@"; do
  case "$arg" in
    --frankenphp) FRANKENPHP=1 ;;
    *) echo "setup: unknown option $arg (known: --frankenphp)" >&2; exit 2 ;;
  esac
done

NIGHTLY=${LOCKTRACE_NIGHTLY:-nightly}
NIGHTLY_DATE=2026-05-19
BPF_LINKER_VERSION=0.13.0
APT_PACKAGES=(gcc musl-tools libc6-dev apache2 apache2-dev mariadb-server sysbench bpftrace libc6-dbg binutils util-linux golang-go prometheus tmux qemu-system-x86 busybox-static xz-utils python3 python3.11-dev debuginfod)

die() { echo "setup: $*" >&2; exit 1; }

# 1. The nightly that compiles the BPF crate, pinned by date.
nightly_version=$(rustc +"$NIGHTLY" --version 2>/dev/null) ||
  die "no '$NIGHTLY' toolchain; install it with: rustup toolchain install nightly-$NIGHTLY_DATE (and set LOCKTRACE_NIGHTLY)"
case "$nightly_version" in
  *"$NIGHTLY_DATE"*) ;;
  *) die "toolchain '$NIGHTLY' is '$nightly_version', expected the $NIGHTLY_DATE nightly; set LOCKTRACE_NIGHTLY to a toolchain of that date" ;;
esac
sysroot=$(rustc +"$NIGHTLY" --print sysroot)

# 2. rust-src for -Z build-std=core.
if [ ! -d "$sysroot/lib/rustlib/src/rust/library/core" ]; then
  echo "setup: adding rust-src to $NIGHTLY" >&2
  rustup component add rust-src --toolchain "$NIGHTLY" ||
    die "could not add rust-src; run by hand: rustup component add rust-src --toolchain $NIGHTLY"
fi

# 3. bpf-linker linked against the nightly's own libLLVM, so bitcode versions match.
llvm_lib=$(ls "$sysroot"/lib/libLLVM.so.*-rust-* 2>/dev/null | head -1)
[ -n "$llvm_lib" ] || die "no libLLVM.so in $sysroot/lib; the nightly is incomplete"
if ! { command -v bpf-linker >/dev/null && bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; }; then
  prefix=${LOCKTRACE_CACHE:-$HOME/.cache/locktrace}/llvm-prefix
  mkdir -p "$prefix/lib"
  ln -sf "$llvm_lib" "$prefix/lib/libLLVM.so"
  ln -sf "$llvm_lib" "$prefix/lib/$(basename "$llvm_lib")"
  echo "setup: building bpf-linker $BPF_LINKER_VERSION against $(basename "$llvm_lib") (about 4 minutes, once)" >&2
  LLVM_PREFIX="$prefix" LD_LIBRARY_PATH="$sysroot/lib" cargo +stable install bpf-linker \
    --version "$BPF_LINKER_VERSION" --locked --no-default-features --features llvm-22 ||
    die "building bpf-linker failed; by hand: LLVM_PREFIX=$prefix cargo install bpf-linker --version $BPF_LINKER_VERSION --no-default-features --features llvm-22"
fi

# 4. Debian packages (compilers for fixtures, servers the tests trace, bpftrace for the bench).
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
    die "apt-get could not install ${missing[*]}; install them by hand: apt-get update && apt-get install ${missing[*]}"
fi

# 5. tracefs for the syscall tracepoints.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null ||
    die "tracefs is not mounted and could not be mounted; run: mount -t tracefs nodev /sys/kernel/tracing"
fi

# 6. The real FrankenPHP (tests/suite/frankenphp_real.rs): the kit's build.sh skips what
#    it has built, so this costs seconds once the outputs are in /tmp/e2e.
if [ "$FRANKENPHP" = 1 ]; then
  repo=$(cd "$(dirname "$0")/.." && pwd)
  kit=${LOCKTRACE_FRANKENPHP_KIT:-$repo/../shared/frankenphp}
  [ -f "$kit/build.sh" ] ||
    die "no FrankenPHP kit at $kit (no build.sh); put shared/frankenphp beside the repository or set LOCKTRACE_FRANKENPHP_KIT"
  mkdir -p /tmp/e2e/logs
  log=/tmp/e2e/logs/setup-frankenphp.log
  [ -x /tmp/e2e/frankenphp-e2e ] || echo "setup: building the real FrankenPHP from $kit (about 8 minutes, once; log $log)" >&2
  SMOKE=0 bash "$kit/build.sh" >"$log" 2>&1 ||
    die "building the FrankenPHP kit failed (see $log); by hand: SMOKE=0 bash $kit/build.sh"
  # mod_php for Apache's event MPM (tests/suite/apache_php.rs): the same ZTS PHP built
  # with --with-apxs2 from the tarball the kit fetched; about 5 minutes once.
  [ -f /tmp/e2e/modphp/libphp.so ] || echo "setup: building mod_php (about 5 minutes, once; logs /tmp/e2e/logs/modphp-*)" >&2
  bash "$repo/scripts/build-modphp.sh" >/tmp/e2e/logs/setup-modphp.log 2>&1 ||
    die "building mod_php failed (see /tmp/e2e/logs/setup-modphp.log); by hand: bash $repo/scripts/build-modphp.sh"
  # PHP 8.2's and 8.4's headers from Debian (tests/suite/php_routes.rs checks the
  # layout tables against them); two small downloads, once.
  bash "$repo/scripts/fetch-php-headers.sh" >/tmp/e2e/logs/setup-php-headers.log 2>&1 ||
    die "fetching PHP's headers failed (see /tmp/e2e/logs/setup-php-headers.log); by hand: bash $repo/scripts/fetch-php-headers.sh"
  # The release shape (tests/suite/frankenphp_static.rs): one static musl executable
  # with PHP inside, from the kit's outputs; about 12 minutes once, then under a second.
  LOCKTRACE_FRANKENPHP_KIT=$kit bash "$repo/scripts/build-frankenphp-static.sh"
  # The shapes users download (tests/suite/frankenphp_shapes.rs): PHP 8.4 built as
  # the official Docker images build it, stripped; once, then seconds.
  LOCKTRACE_FRANKENPHP_KIT=$kit bash "$repo/scripts/build-frankenphp-shapes.sh"
fi
