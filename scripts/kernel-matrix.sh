#!/usr/bin/env bash
# The kernel matrix (issue 36): boots Debian's kernels in qemu and runs the
# real-BPF smoke tests (tracer-user/tests/kernel_smoke.rs) inside each, on the
# host's own files shared read-only over 9p. Nothing is installed on the host:
# the kernel packages are fetched with `apt-get download` (private apt lists,
# so no source is added to the host) and unpacked with `dpkg -x`.
#
#   bash scripts/kernel-matrix.sh            # 5.10, 6.1 and 6.12
#   bash scripts/kernel-matrix.sh bookworm   # one kernel, by Debian suite
#
# A kernel passes when every smoke test passes, the kernel logged no WARNING
# and /proc/sys/kernel/tainted stayed 0. Needs qemu-system-x86 and
# busybox-static (scripts/setup.sh installs them). Under TCG (no KVM) a kernel
# takes about a minute here.
#
# Under TCG the smoke set takes ~230 s per kernel here (6.1: 229 s, 7 tests).
# LOCKTRACE_MATRIX_FILTER=NAME runs the smoke tests whose name has NAME;
# LOCKTRACE_MATRIX_JOBS=N boots N kernels at a time (default 2: one a core);
# LOCKTRACE_MATRIX_ACCEL=kvm uses KVM (it hangs on our machines);
# LOCKTRACE_MATRIX_TIMEOUT=S stops a guest after S seconds (default 600;
# more on a machine busy with other work).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(bullseye bookworm trixie)
work=${LOCKTRACE_KERNEL_CACHE:-$repo/target/kernel-matrix}
mkdir -p "$work"

# The smoke tests, built once on the host and run there first (the host's
# row of the table); that run compiles their fixtures, which the guests
# cannot (their view of the repository is read-only).
smoke=$(cargo test --locked -p tracer-user --features root-tests --test kernel_smoke \
    --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "kernel_smoke":
        print(m["executable"])')
[ -x "$smoke" ] || { echo "kernel-matrix: could not build the kernel_smoke test binary" >&2; exit 1; }
locktrace=$repo/target/debug/locktrace
[ -x "$locktrace" ] || { echo "kernel-matrix: $locktrace is missing (cargo build)" >&2; exit 1; }
host_log=$work/host-smoke.log
mkdir -p "$work"
started=$SECONDS
host=pass
if [ "${LOCKTRACE_MATRIX_HOST:-1}" = 0 ]; then
    # The caller ran the smoke set on this host already (scripts/test.sh).
    :
elif ! "$smoke" --test-threads=1 >"$host_log" 2>&1; then
    host=FAIL
fi
[ "${LOCKTRACE_MATRIX_HOST:-1}" = 0 ] || printf '%-10s %-28s %-4s %4ss %s\n' host "$(uname -r)" "$host" "$((SECONDS - started))" \
    "$([ $host = pass ] || echo "smoke tests failed (see $host_log)")"

fetch_kernel() { # suite -> prints the unpacked package's directory
    local suite=$1 dir=$work/$1
    if [ ! -e "$dir/unpacked/.done" ]; then
        mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/deb"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
            >"$dir/apt/sources.list"
        local opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache"
            -o Dir::State::status=/dev/null -o APT::Architecture=amd64 -o APT::Sandbox::User=root)
        apt-get "${opts[@]}" update -qq >&2
        local package
        package=$(apt-cache "${opts[@]}" depends linux-image-amd64 |
            awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
        [ -n "$package" ] || { echo "kernel-matrix: no kernel package in $suite" >&2; return 1; }
        rm -f "$dir"/deb/*.deb
        (cd "$dir/deb" && apt-get "${opts[@]}" download "$package" >&2)
        rm -rf "$dir/unpacked"
        dpkg -x "$dir"/deb/*.deb "$dir/unpacked"
        touch "$dir/unpacked/.done"
    fi
    echo "$dir/unpacked"
}

# An initramfs with busybox, the 9p and virtio modules, and an init that
# mounts the host's root and runs the smoke tests in it.
make_initramfs() { # unpacked-dir output
    local unpacked=$1 out=$2 root
    root=$(mktemp -d)
    local modules
    modules=$(ls -d "$unpacked"/lib/modules/* "$unpacked"/usr/lib/modules/* 2>/dev/null | head -1)
    local version
    version=$(basename "$modules")
    mkdir -p "$root"/{bin,proc,sys,dev,host,out,lib/modules/"$version"}
    cp /bin/busybox "$root/bin/busybox"
    for sub in kernel/fs/9p kernel/net/9p kernel/drivers/virtio kernel/fs/netfs kernel/fs/fscache; do
        [ -d "$modules/$sub" ] || continue
        mkdir -p "$root/lib/modules/$version/$sub"
        cp -r "$modules/$sub/." "$root/lib/modules/$version/$sub/"
    done
    find "$root/lib/modules" -name '*.ko.xz' -exec unxz {} +
    cp "$repo/scripts/kernel-matrix-init.sh" "$root/init"
    chmod +x "$root/init"
    (cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$out"
    rm -rf "$root"
}

run_kernel() { # suite -> 0 when it passed
    local suite=$1 unpacked
    unpacked=$(fetch_kernel "$suite")
    local vmlinuz
    vmlinuz=$(ls "$unpacked"/boot/vmlinuz-*)
    local out=$work/$suite/out
    rm -rf "$out"
    mkdir -p "$out"
    make_initramfs "$unpacked" "$work/$suite/initramfs.gz"
    # Copies of the binaries: a build on the host during the run must not
    # change what the guest runs (the init binds the copy over the path
    # the smoke tests have compiled in).
    cp "$smoke" "$out/kernel_smoke"
    cp "$locktrace" "$out/locktrace"
    # TCG unless asked: /dev/kvm exists on our machines but a KVM guest
    # hangs after the BIOS there. One TCG thread for both vCPUs: with a thread
    # per vCPU (qemu 7.2's default) a vCPU can still run a stale translation
    # of kernel text that the other one just patched (a static key flipped
    # when a tracepoint or perf event comes or goes), and 6.12 then dies with
    # "Oops: int3" in __schedule, about one boot in three here and once in CI.
    local accel=${LOCKTRACE_MATRIX_ACCEL:-tcg,thread=single}
    local started=$SECONDS
    timeout "${LOCKTRACE_MATRIX_TIMEOUT:-600}" qemu-system-x86_64 -accel "$accel" -cpu max -smp 2 -m 3072 -nic none \
        -nographic -no-reboot -kernel "$vmlinuz" -initrd "$work/$suite/initramfs.gz" \
        -append "console=ttyS0 panic=-1 oops=panic locktrace_smoke=/mnt/kernel_smoke locktrace_bin=$locktrace locktrace_repo=$repo ${LOCKTRACE_MATRIX_FILTER:+locktrace_filter=$LOCKTRACE_MATRIX_FILTER}" \
        -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$out,mount_tag=out,security_model=none" \
        >"$out/console.log" 2>&1 || true
    local seconds=$((SECONDS - started))
    local kernel
    kernel=$(cat "$out/uname" 2>/dev/null || basename "$vmlinuz")
    local verdict=pass reasons=()
    [ "$(cat "$out/smoke.rc" 2>/dev/null)" = 0 ] || { verdict=FAIL; reasons+=("smoke tests failed (see $out/smoke.log)"); }
    if grep -q -E 'WARNING:|BUG:|Oops' "$out/dmesg" 2>/dev/null; then
        verdict=FAIL
        reasons+=("the kernel logged a warning (see $out/dmesg)")
    fi
    [ "$(cat "$out/tainted" 2>/dev/null)" = 0 ] || { verdict=FAIL; reasons+=("tainted $(cat "$out/tainted" 2>/dev/null || echo unknown)"); }
    printf '%-10s %-28s %-4s %4ss %s\n' "$suite" "$kernel" "$verdict" "$seconds" "${reasons[*]:-}"
    grep -E '^test .* \.\.\. ' "$out/smoke.log" 2>/dev/null | sed 's/^/    /' || true
    # CI keeps only what is printed: show why a guest died.
    if [ "$verdict" != pass ]; then
        grep -E -A12 'Oops|BUG:|WARNING:|panic' "$out/console.log" 2>/dev/null | head -40 | sed 's/^/    console: /' || true
        tail -n 30 "$out/smoke.log" 2>/dev/null | sed 's/^/    smoke: /' || true
    fi
    [ "$verdict" = pass ]
}

failed=0
[ $host = pass ] || failed=1
# A guest runs on one host thread (TCG, thread=single): with two cores, two
# guests at a time take the time of the longer, not of both. Each kernel's
# row goes to a file; the rows are printed in the suites' order at the end.
jobs=${LOCKTRACE_MATRIX_JOBS:-2}
for suite in "${suites[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    rm -f "$work/$suite.rc" "$work/$suite.row"
    (
        rc=0
        run_kernel "$suite" || rc=1
        echo "$rc" >"$work/$suite.rc"
    ) >"$work/$suite.row" 2>&1 &
done
wait
for suite in "${suites[@]}"; do
    cat "$work/$suite.row" 2>/dev/null || true
    [ "$(cat "$work/$suite.rc" 2>/dev/null)" = 0 ] || failed=1
done
exit $failed
