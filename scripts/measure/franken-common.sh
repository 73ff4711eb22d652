#!/bin/bash
# Sourced by the franken-*.sh measurements: takes the machine's FrankenPHP
# lock (fd 9, closed in every child), starts the kit's stock server in
# classic mode, and sets ROOT, K (the kit), LT (locktrace) and pid.
exec 9>/tmp/franken.lock; flock 9
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
K=${LOCKTRACE_FRANKEN_KIT:-$ROOT/../shared/frankenphp}
LT=${LT:-$ROOT/target/release/locktrace}
bash "$K/use-stock.sh" 9>&- >/dev/null; bash "$K/start.sh" classic 9>&- >/dev/null
pid=$(cat /tmp/e2e/franken.pid)
