#!/usr/bin/env bash
# Builds mod_php for Apache (tests/suite/apache_php.rs): the same thread-safe PHP 8.2.32 as the
# FrankenPHP kit's libphp (Debian's release tarball, no Debian patches, CFLAGS="-O2 -g", the
# kit's configure line) with --with-apxs2 instead of --enable-embed, so Apache's threaded
# (event) MPM can load it. Output: /tmp/e2e/modphp/libphp.so (a new inode each build; nothing
# is installed into the system's Apache: no `make install`, no `apxs -i`).
# Idempotent: skips when the module exists (FORCE=1 rebuilds). About 4 minutes on 2 cores.
# The tarball is the one the kit's build-php.sh fetched (scripts/setup.sh --frankenphp runs
# the kit's build first). Logs and timings: /tmp/e2e/logs/modphp-*.
set -euo pipefail
E=/tmp/e2e
TARBALL=$E/src/php8.2_8.2.32.orig.tar.xz
SRC=$E/modphp-src
OUT=$E/modphp
APXS=/usr/bin/apxs2
mkdir -p "$E/logs" "$OUT"
if [ "${FORCE:-0}" != 1 ] && [ -f "$OUT/libphp.so" ]; then
  echo "build-modphp: already built ($OUT/libphp.so)"
  exit 0
fi
[ -f "$TARBALL" ] || { echo "build-modphp: $TARBALL missing: the FrankenPHP kit's build.sh fetches it (scripts/setup.sh --frankenphp)" >&2; exit 1; }
[ -x "$APXS" ] || { echo "build-modphp: $APXS missing: apt-get install apache2-dev (scripts/setup.sh)" >&2; exit 1; }
t() {
  local s
  s=$(date +%s)
  "$@"
  echo "  [$(($(date +%s) - s)) s] $*" | tee -a "$E/logs/modphp-build-times.txt"
}
started=$(date +%s)
rm -rf "$SRC" && mkdir -p "$SRC"
tar -xJf "$TARBALL" -C "$SRC" --strip-components=1
cd "$SRC"
# The kit's configure line (build-php.sh) with --with-apxs2 for --enable-embed; the prefix is
# never installed into. configure's "built for Apache's current non-threaded MPM" warning only
# means `apache2 -V` could not tell (it runs without Debian's envvars); ZTS is checked below.
CONF=(--prefix="$OUT/prefix" --with-apxs2="$APXS" --enable-zts --disable-zend-signals
      --enable-zend-max-execution-timers --disable-all --enable-mysqlnd --with-mysqli=mysqlnd
      --enable-pdo --with-pdo-mysql=mysqlnd --disable-cgi --disable-phpdbg)
echo "CFLAGS=\"-O2 -g\" ./configure ${CONF[*]}" > "$E/logs/modphp-configure-line.txt"
t env CFLAGS="-O2 -g" ./configure "${CONF[@]}" > "$E/logs/modphp-configure.log" 2>&1 ||
  { echo "build-modphp: configure failed, see $E/logs/modphp-configure.log" >&2; exit 1; }
t make -j"$(nproc)" > "$E/logs/modphp-make.log" 2>&1 ||
  { echo "build-modphp: make failed, see $E/logs/modphp-make.log" >&2; exit 1; }
grep -q '^#define ZTS 1' main/php_config.h || { echo "build-modphp: not a ZTS build" >&2; exit 1; }
[ -f libs/libphp.so ] || { echo "build-modphp: make built no libs/libphp.so" >&2; exit 1; }
# New inode: never rewrite a .so a running apache2 has mapped.
cp libs/libphp.so "$OUT/libphp.so.new" && mv -f "$OUT/libphp.so.new" "$OUT/libphp.so"
echo "  [$(($(date +%s) - started)) s] build-modphp.sh in all" | tee -a "$E/logs/modphp-build-times.txt"
ls -la "$OUT/libphp.so"
