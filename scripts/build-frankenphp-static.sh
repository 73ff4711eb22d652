#!/usr/bin/env bash
# Builds the real FrankenPHP as its release binaries are shaped: one static musl
# executable with PHP linked in (tests/suite/frankenphp_static.rs). Runs after the kit's
# build.sh (scripts/setup.sh --frankenphp), from what it left: PHP 8.2.32's tarball
# in /tmp/e2e/src, Go in /tmp/gobin-venv, the kit's Go host and patch.
#   PHP:  the kit's configure line plus CC=musl-gcc --enable-embed=static (libphp.a)
#         --without-valgrind --disable-mysqlnd-compression-support (musl has no
#         valgrind or zlib headers); built stock, then with the kit's patch.
#   Go:   CC=musl-gcc, -linkmode external -extldflags -static, the kit's tags.
# Outputs: /tmp/e2e/static/frankenphp-static-{stock,patched}. Idempotent: what is
# built is skipped (seconds); FORCE=1 rebuilds. Logs: /tmp/e2e/logs/static-*.log.
# The kit stays read-only: nothing is written inside it.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
kit=${LOCKTRACE_FRANKENPHP_KIT:-$repo/../shared/frankenphp}
E=/tmp/e2e
OUT=$E/static
SRC=$OUT/php-src
PREFIX=$OUT/php
LOGS=$E/logs
TARBALL=$E/src/php8.2_8.2.32.orig.tar.xz
GOVENV=/tmp/gobin-venv
mkdir -p "$OUT" "$LOGS"
built=0

die() { echo "build-frankenphp-static: $*" >&2; exit 1; }
# Runs a step with its output in a log; on failure one line names the log.
step() {
  local log=$LOGS/static-$1.log; shift
  local started=$SECONDS
  "$@" >"$log" 2>&1 || die "'$*' failed (log $log); fix that and rerun scripts/build-frankenphp-static.sh"
  echo "  [$((SECONDS - started)) s] $*" >>"$LOGS/static-build-times.txt"
}

[ -f "$kit/build.sh" ] || die "no FrankenPHP kit at $kit; set LOCKTRACE_FRANKENPHP_KIT to its folder"
[ -f "$TARBALL" ] || die "$TARBALL is missing: run the kit's build first (scripts/setup.sh --frankenphp)"
[ -x "$GOVENV/bin/python" ] || die "no Go in $GOVENV: run the kit's build first (scripts/setup.sh --frankenphp)"
command -v musl-gcc >/dev/null || die "musl-gcc is missing: apt-get install musl-tools"

# Everything that decides the build; a change rebuilds.
CONF=(--prefix="$PREFIX" --enable-embed=static --enable-zts --disable-zend-signals
      --enable-zend-max-execution-timers --disable-all --enable-mysqlnd --with-mysqli=mysqlnd
      --enable-pdo --with-pdo-mysql=mysqlnd --disable-cgi --disable-phpdbg
      --without-valgrind --disable-mysqlnd-compression-support)
recipe="CC=musl-gcc CFLAGS=-O2 -g ${CONF[*]} patch=$(sha256sum <"$kit/mysqlnd-stats-atomic.patch")"
stamp=$OUT/php.recipe

# 1. PHP twice, as static archives: lib-stock/libphp.a and lib-patched/libphp.a.
if [ "${FORCE:-0}" = 1 ] || [ "$(cat "$stamp" 2>/dev/null)" != "$recipe" ] ||
   [ ! -f "$OUT/lib-stock/libphp.a" ] || [ ! -f "$OUT/lib-patched/libphp.a" ]; then
  echo "build-frankenphp-static: building PHP with musl, stock and patched (about 12 minutes; logs $LOGS/static-*.log)" >&2
  rm -rf "$SRC" "$PREFIX" "$OUT/lib-stock" "$OUT/lib-patched" "$stamp"
  mkdir -p "$SRC" "$OUT/lib-stock" "$OUT/lib-patched"
  tar -xJf "$TARBALL" -C "$SRC" --strip-components=1
  cd "$SRC"
  step php-configure env CC=musl-gcc CFLAGS="-O2 -g" ./configure "${CONF[@]}"
  step php-make-stock make -j2
  step php-install make install
  cp libs/libphp.a "$OUT/lib-stock/libphp.a"
  step php-patch patch -p1 -i "$kit/mysqlnd-stats-atomic.patch"
  step php-make-patched make -j2
  cp libs/libphp.a "$OUT/lib-patched/libphp.a"
  # The installed headers are stock; so is the tree again.
  patch -p1 -R -i "$kit/mysqlnd-stats-atomic.patch" >/dev/null
  echo "$recipe" >"$stamp"
  built=1
fi

# 2. The kit's Go host, linked static against each libphp.a.
GOROOT_DIR=$("$GOVENV/bin/python" -c 'import go, os; print(os.path.dirname(go.__file__))') ||
  die "the Go in $GOVENV cannot be loaded: rerun the kit's build (scripts/setup.sh --frankenphp)"
export PATH=$GOROOT_DIR/bin:$PATH
export GOPROXY=off GOTOOLCHAIN=local GOSUMDB=off GOFLAGS=-mod=mod CGO_ENABLED=1 CC=musl-gcc
export CGO_CFLAGS="$("$PREFIX/bin/php-config" --includes) -O2 -g"
php_libs=$("$PREFIX/bin/php-config" --libs)
for flavour in stock patched; do
  binary=$OUT/frankenphp-static-$flavour
  archive=$OUT/lib-$flavour/libphp.a
  if [ "${FORCE:-0}" != 1 ] && [ "$binary" -nt "$archive" ] && [ "$binary" -nt "$0" ]; then
    continue
  fi
  export CGO_LDFLAGS="-L$OUT/lib-$flavour $php_libs"
  (cd "$kit/go" && step "go-$flavour" go build -buildvcs=false -tags nowatcher,nomercure \
     -ldflags "-linkmode external -extldflags -static" -o "$binary.new" .)
  mv -f "$binary.new" "$binary" # a new inode: a running server keeps its file
  built=1
done

# 3. Static: no program interpreter, no shared libraries.
for flavour in stock patched; do
  binary=$OUT/frankenphp-static-$flavour
  if readelf -lW "$binary" | grep -q 'INTERP' || readelf -dW "$binary" | grep -q NEEDED; then
    die "$binary is not static (readelf -ld shows an interpreter or shared libraries); see $LOGS/static-go-$flavour.log"
  fi
done
[ "$built" = 0 ] || echo "build-frankenphp-static: built $OUT/frankenphp-static-{stock,patched}" >&2
