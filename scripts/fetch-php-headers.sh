#!/usr/bin/env bash
# PHP's development headers for the versions locktrace has a layout table for
# (tests/suite/php_routes.rs compiles fixtures/php/offsets.c and mysqlnd_offsets.c against them and checks
# the tables): php8.2-dev from Debian bookworm, php8.4-dev from trixie and
# php8.5-dev from experimental, fetched with `apt-get download` through private
# apt lists (the system's lists are not touched) and unpacked to
# /tmp/e2e/php-headers/VERSION. Skips what is there. (Debian never released
# php8.3: no suite has it, so there is no 8.3 table.)
set -euo pipefail
out=${LOCKTRACE_PHP_HEADERS:-/tmp/e2e/php-headers}
for pair in 8.2:bookworm 8.4:trixie 8.5:experimental; do
    version=${pair%%:*} suite=${pair#*:}
    [ -e "$out/$version/.done" ] && continue
    work=$out/apt-$suite
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
        >"$work/sources.list"
    opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
        -o Dir::State::status=/dev/null -o APT::Architecture=amd64 -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" update -qq
    rm -f "$work"/deb/*.deb
    (cd "$work/deb" && apt-get "${opts[@]}" download "php$version-dev")
    rm -rf "$out/$version"
    dpkg -x "$work"/deb/php"$version"-dev_*.deb "$out/$version"
    touch "$out/$version/.done"
done
