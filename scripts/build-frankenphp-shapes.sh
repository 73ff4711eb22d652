#!/usr/bin/env bash
# Builds FrankenPHP in the shapes its users download (tests/suite/frankenphp_shapes.rs),
# from the kit's Go host (FrankenPHP v1.12.7, ../shared/frankenphp/go) and Go
# (/tmp/gobin-venv), after the kit's build (scripts/setup.sh --frankenphp).
#
# 1. Docker-shaped, dynamic (/tmp/e2e/php84): as the official images build PHP:
#    ZTS embed, CFLAGS=-O2 (no -g), mysqlnd built in, pdo_mysql a shared
#    extension loaded by php.ini's `extension=` line; libphp.so and pdo_mysql.so
#    `strip --strip-all`ed; the Go host linked with -ldflags "-w -s". Stock and
#    with the kit's mysqlnd-stats-atomic.patch (it applies to 8.4 as it is).
# 2. Static musl (/tmp/e2e/php84/static-8.4, and static-8.2 from the musl
#    libphp.a of build-frankenphp-static.sh): as static-php-cli links its
#    release binaries: PHP (libphp.a, pdo_mysql built in) and musl in one
#    static-pie executable whose .dynsym keeps PHP's globals (--dynamic-list of
#    `nm -g --defined-only libphp.a`), then `strip --strip-unneeded`. Go passes
#    -buildmode=pie -linkmode external; the C compiler it links with
#    (cc-static-pie beside the outputs) adds musl's rcrt1.o, -static-pie and
#    the list (plain -static drops .dynsym).
# Each shape has one folder per flavour that runs as it is (`frankenphp`, and
# its `php.ini` for PHPRC; the dynamic host finds libphp.so beside it through
# RUNPATH $ORIGIN, php.ini loads the pdo_mysql.so beside it):
#   run-{stock,patched}/           stripped: what the tests trace
#   unstripped-{stock,patched}/    the same build before strip: the truths' twin
#
# PHP's source: Debian's orig tarball. PHP 8.5.7 (experimental) and 8.4.27 (sid)
# are listed by Debian's Sources indexes, but this machine's Debian mirror answers
# 404 for their source files (apt-get source --download-only php8.5=8.5.7-1, and
# the orig tarballs themselves); the one PHP 8.4 tarball it serves is 8.4.16's,
# fetched by its pool path and checked against its sha256 below. So the shapes
# are PHP 8.4.16; 8.5 waits for a source tarball Debian's mirror serves (then:
# one more `build_dynamic php85 …` below). The layout locktrace reads is the
# same across 8.4.x (tests/suite/php_routes.rs checks the 8.4 table against 8.4.27's
# headers).
#
# Time (2 cores): PHP 8.4 configure 45 s, make 1423 s while four other builds
# shared the cores (the kit's -g 8.2 build: 2-5 min quiet), install 15 s, the
# patched make 20 s, the Go host 49 s; static 8.4 with musl: configure 38 s,
# make 434 s (load 5-8), install 16 s, patched make 12 s; each static link
# 4-53 s (163 s with a cold Go cache). Seconds once built.
#
# Idempotent: what is built is skipped (seconds); FORCE=1 rebuilds. One line
# names the log on failure. Logs: /tmp/e2e/logs/shapes-*.log; every step's time:
# /tmp/e2e/logs/shapes-build-times.txt. The kit stays read-only.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
kit=${LOCKTRACE_FRANKENPHP_KIT:-$repo/../shared/frankenphp}
E=/tmp/e2e
LOGS=$E/logs
GOVENV=/tmp/gobin-venv
mkdir -p "$LOGS"

die() { echo "build-frankenphp-shapes: $*" >&2; exit 1; }
# Runs a step with its output in a log; on failure one line names the log.
step() {
  local log=$LOGS/shapes-$1.log; shift
  local started=$SECONDS
  "$@" >"$log" 2>&1 || die "'$*' failed (log $log); fix that and rerun scripts/build-frankenphp-shapes.sh"
  echo "  [$((SECONDS - started)) s] $(basename "$log" .log): $*" >>"$LOGS/shapes-build-times.txt"
}

[ -f "$kit/build.sh" ] || die "no FrankenPHP kit at $kit; set LOCKTRACE_FRANKENPHP_KIT to its folder"
[ -x "$GOVENV/bin/python" ] || die "no Go in $GOVENV: run the kit's build first (scripts/setup.sh --frankenphp)"
GOROOT_DIR=$("$GOVENV/bin/python" -c 'import go, os; print(os.path.dirname(go.__file__))') ||
  die "the Go in $GOVENV cannot be loaded: rerun the kit's build (scripts/setup.sh --frankenphp)"
export PATH=$GOROOT_DIR/bin:$PATH
export GOPROXY=off GOTOOLCHAIN=local GOSUMDB=off GOFLAGS=-mod=mod CGO_ENABLED=1
patch_file=$kit/mysqlnd-stats-atomic.patch

# fetch TARBALL URL SHA256: Debian's orig tarball, once, checked.
fetch() {
  local tarball=$1 url=$2 sum=$3
  if [ ! -f "$tarball" ]; then
    mkdir -p "$(dirname "$tarball")"
    curl -sSf --retry 3 -o "$tarball.part" "$url" ||
      die "cannot fetch $url from Debian's mirror; put the tarball at $tarball by hand"
    mv -f "$tarball.part" "$tarball"
  fi
  echo "$sum  $tarball" | sha256sum -c --quiet - >/dev/null 2>&1 ||
    die "$tarball is not the expected file (sha256 differs); delete it and rerun"
}

# unpack TARBALL SRC: a fresh source tree.
unpack() {
  rm -rf "$2" && mkdir -p "$2"
  tar -xJf "$1" -C "$2" --strip-components=1
}

# keep DIR FILE...: copies into DIR by new inodes (a running server keeps its files).
keep() {
  local dir=$1; shift
  mkdir -p "$dir"
  for file in "$@"; do
    cp "$file" "$dir/$(basename "$file").new" && mv -f "$dir/$(basename "$file").new" "$dir/$(basename "$file")"
  done
}

# php_ini DIR: the kit's php.ini plus the shared pdo_mysql of DIR.
php_ini() {
  { cat "$kit/php.ini"; echo "extension=$1/pdo_mysql.so"; } >"$1/php.ini"
}

# 1. Docker-shaped dynamic build of the PHP in TARBALL, in OUT (tag: log names).
build_dynamic() {
  local tag=$1 tarball=$2 out=$3
  local src=$out/php-src prefix=$out/php stamp=$out/php.recipe
  local conf=(--prefix="$prefix" --enable-embed --enable-zts --disable-zend-signals
    --enable-zend-max-execution-timers --disable-all --enable-mysqlnd --enable-pdo
    --with-pdo-mysql=shared,mysqlnd --disable-cgi --disable-phpdbg)
  local recipe="CFLAGS=-O2 ${conf[*]} $(sha256sum <"$tarball") patch=$(sha256sum <"$patch_file")"
  if [ "${FORCE:-0}" = 1 ] || [ "$(cat "$stamp" 2>/dev/null)" != "$recipe" ] ||
     [ ! -f "$out/unstripped-patched/libphp.so" ]; then
    echo "build-frankenphp-shapes: building $tag, stock and patched (logs $LOGS/shapes-$tag-*.log)" >&2
    rm -rf "$prefix" "$stamp" "$out"/unstripped-* "$out"/run-*
    unpack "$tarball" "$src"
    cd "$src"
    step "$tag-configure" env CFLAGS=-O2 ./configure "${conf[@]}"
    step "$tag-make-stock" make -j2
    step "$tag-install" make install
    keep "$out/unstripped-stock" libs/libphp.so modules/pdo_mysql.so
    step "$tag-patch" patch -p1 -i "$patch_file"
    step "$tag-make-patched" make -j2
    keep "$out/unstripped-patched" libs/libphp.so modules/pdo_mysql.so
    patch -p1 -R -i "$patch_file" >/dev/null
    echo "$recipe" >"$stamp"
  fi
  # The Go host, once: libphp.so by its SONAME, beside the binary ($ORIGIN).
  local host=$out/frankenphp
  if [ "${FORCE:-0}" = 1 ] || [ ! "$host" -nt "$stamp" ] || [ ! "$host" -nt "$0" ]; then
    local config=$prefix/bin/php-config
    (export CGO_CFLAGS="$("$config" --includes) -O2" \
       CGO_LDFLAGS="-L$out/unstripped-stock -Wl,-rpath,\$ORIGIN $("$config" --ldflags) $("$config" --libs)"
     cd "$kit/go" && step "$tag-go" go build -buildvcs=false -tags nowatcher,nomercure \
       -ldflags "-w -s" -o "$host.new" .)
    mv -f "$host.new" "$host"
  fi
  for flavour in stock patched; do
    local twin=$out/unstripped-$flavour run=$out/run-$flavour
    keep "$twin" "$host"
    php_ini "$twin"
    mkdir -p "$run"
    for file in libphp.so pdo_mysql.so; do
      strip --strip-all "$twin/$file" -o "$run/$file.new" && mv -f "$run/$file.new" "$run/$file"
    done
    keep "$run" "$host"
    php_ini "$run"
  done
  readelf -dW "$out/run-stock/frankenphp" | grep 'RUNPATH.*\$ORIGIN' >/dev/null ||
    die "$host has no RUNPATH \$ORIGIN (log $LOGS/shapes-$tag-go.log)"
  ! readelf -SW "$out/run-stock/libphp.so" | grep -E '\.symtab|\.debug_' >/dev/null ||
    die "$out/run-stock/libphp.so still has symbols after strip --strip-all"
}

# The C compiler Go links the static shape with: musl-gcc, and at link time
# static-pie by hand (musl-gcc's specs know no -static-pie; plain -static
# drops .dynsym): musl's rcrt1.o, GCC's crtbeginS/crtendS, no interpreter,
# PHP's globals exported by the list in $LIST.
write_static_cc() {
  local cc=$1 list=$2 musl=/usr/lib/x86_64-linux-musl gcc_dir
  gcc_dir=$(dirname "$(gcc -print-file-name=crtbeginS.o)")
  cat >"$cc" <<EOF
#!/bin/sh
case " \$* " in *" -c "*|*" -E "*|*" -S "*|*" -dumpversion "*) exec musl-gcc "\$@" ;; esac
exec musl-gcc -fPIE -static-pie -nostartfiles $musl/rcrt1.o $musl/crti.o $gcc_dir/crtbeginS.o "\$@" \\
  -Wl,-static -Wl,-pie -Wl,--no-dynamic-linker -Wl,-z,text -Wl,--dynamic-list=$list \\
  $gcc_dir/crtendS.o $musl/crtn.o
EOF
  chmod +x "$cc"
}

# 2. Static musl build of the PHP in TARBALL, in OUT, linked as static-php-cli
#    links its release binaries.
build_static() {
  local tag=$1 tarball=$2 out=$3
  local src=$out/php-src prefix=$out/php stamp=$out/php.recipe
  command -v musl-gcc >/dev/null || die "musl-gcc is missing: apt-get install musl-tools"
  local conf=(--prefix="$prefix" --enable-embed=static --enable-zts --disable-zend-signals
    --enable-zend-max-execution-timers --disable-all --enable-mysqlnd --enable-pdo
    --with-pdo-mysql=mysqlnd --disable-cgi --disable-phpdbg
    --without-valgrind --disable-mysqlnd-compression-support)
  local recipe="CC=musl-gcc CFLAGS=-O2 -fPIE ${conf[*]} $(sha256sum <"$tarball") patch=$(sha256sum <"$patch_file")"
  if [ "${FORCE:-0}" = 1 ] || [ "$(cat "$stamp" 2>/dev/null)" != "$recipe" ] ||
     [ ! -f "$out/lib-patched/libphp.a" ]; then
    echo "build-frankenphp-shapes: building $tag with musl, stock and patched (logs $LOGS/shapes-$tag-*.log)" >&2
    rm -rf "$prefix" "$stamp" "$out"/lib-* "$out"/run-* "$out"/unstripped-*
    unpack "$tarball" "$src"
    cd "$src"
    step "$tag-configure" env CC=musl-gcc CFLAGS="-O2 -fPIE" ./configure "${conf[@]}"
    step "$tag-make-stock" make -j2
    step "$tag-install" make install
    keep "$out/lib-stock" libs/libphp.a
    step "$tag-patch" patch -p1 -i "$patch_file"
    step "$tag-make-patched" make -j2
    keep "$out/lib-patched" libs/libphp.a
    patch -p1 -R -i "$patch_file" >/dev/null
    echo "$recipe" >"$stamp"
  fi
  link_static "$tag" "$out" "$prefix" "$out"
}

# link_static TAG ARCHIVES PREFIX OUT: the kit's Go host linked static-pie
# against ARCHIVES/lib-{stock,patched}/libphp.a (PHP installed in PREFIX),
# as static-php-cli links it; the unstripped twin, and the shipped binary
# `strip --strip-unneeded`ed.
link_static() {
  local tag=$1 archives=$2 prefix=$3 out=$4
  mkdir -p "$out"
  # static-php-cli's list: every global symbol libphp.a defines.
  local list=$out/dynamic-list.txt cc=$out/cc-static-pie
  { echo "{"; nm -g --defined-only "$archives/lib-stock/libphp.a" | awk 'NF == 3 { print "  " $3 ";" }' | sort -u; echo "};"; } >"$list"
  write_static_cc "$cc" "$list"
  local config=$prefix/bin/php-config
  for flavour in stock patched; do
    local twin=$out/unstripped-$flavour run=$out/run-$flavour archive=$archives/lib-$flavour/libphp.a
    mkdir -p "$twin" "$run"
    if [ "${FORCE:-0}" = 1 ] || [ ! "$twin/frankenphp" -nt "$archive" ] || [ ! "$twin/frankenphp" -nt "$0" ]; then
      (export CC=$cc CGO_CFLAGS="$("$config" --includes) -O2" \
         CGO_LDFLAGS="-L$archives/lib-$flavour $("$config" --libs)"
       cd "$kit/go" && step "$tag-go-$flavour" go build -buildvcs=false -buildmode=pie \
         -tags nowatcher,nomercure -ldflags "-linkmode external" -o "$twin/frankenphp.new" .)
      mv -f "$twin/frankenphp.new" "$twin/frankenphp"
    fi
    strip --strip-unneeded "$twin/frankenphp" -o "$run/frankenphp.new" && mv -f "$run/frankenphp.new" "$run/frankenphp"
    cp "$kit/php.ini" "$twin/php.ini" && cp "$kit/php.ini" "$run/php.ini"
    local binary=$run/frankenphp
    if readelf -lW "$binary" | grep INTERP >/dev/null || readelf -dW "$binary" | grep NEEDED >/dev/null; then
      die "$binary is not static (readelf -ld shows an interpreter or shared libraries; log $LOGS/shapes-$tag-go-$flavour.log)"
    fi
    readelf --dyn-syms -W "$binary" | grep -w mysqlnd_global_stats >/dev/null ||
      die "$binary has no mysqlnd_global_stats in .dynsym (log $LOGS/shapes-$tag-go-$flavour.log)"
  done
}

# ONLY=php84|static82|static84 builds one shape (by hand); the default (all)
# is php84 and static82, what the tests trace: static84 costs CI a PHP build
# (about 4 minutes on 2 idle cores) for what static82 and php84 already cover.
only=${ONLY:-all}
if [ "$only" = all ] || [ "$only" = php84 ]; then
  php84=$E/php84/src/php8.4_8.4.16.orig.tar.xz
  fetch "$php84" http://deb.debian.org/debian/pool/main/p/php8.4/php8.4_8.4.16.orig.tar.xz \
    f66f8f48db34e9e29f7bfd6901178e9cf4a1b163e6e497716dfcb8f88bcfae30
  build_dynamic php84 "$php84" "$E/php84"
fi
# The static shape, from the musl libphp.a that build-frankenphp-static.sh
# made of PHP 8.2.32 (stock and patched), relinked as static-php-cli links.
if [ "$only" = all ] || [ "$only" = static82 ]; then
  [ -f "$E/static/lib-patched/libphp.a" ] ||
    die "$E/static/lib-patched/libphp.a is missing: run scripts/build-frankenphp-static.sh first"
  link_static static82 "$E/static" "$E/static/php" "$E/php84/static-8.2"
fi
# PHP 8.4 built with musl (CFLAGS=-O2 -fPIE, no -g), linked the same way.
if [ "$only" = static84 ]; then
  build_static static84 "$E/php84/src/php8.4_8.4.16.orig.tar.xz" "$E/php84/static-8.4"
fi
echo "build-frankenphp-shapes: done" >&2
