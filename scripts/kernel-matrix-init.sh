#!/bin/busybox sh
# The kernel matrix's init (scripts/kernel-matrix.sh puts it in the
# initramfs): load 9p, mount the host's root read-only, run the smoke tests in
# it with the guest's own /proc, /sys, /dev and /tmp, and leave the results,
# the kernel log and the taint flags in the host's output directory.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
ip link set lo up
depmod
for module in virtio_pci 9pnet_virtio 9p; do modprobe "$module"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out /out
for dir in proc sys dev; do mount --move /$dir /host/$dir; done
# A checkout under /tmp or /run (a CI clone may be) would be hidden by the
# guest's own tmpfs there: keep it, and put it back on top.
repo=$(sed -n 's/.*locktrace_repo=\([^ ]*\).*/\1/p' /host/proc/cmdline)
mkdir -p /keep
case "$repo" in /tmp/* | /run/*) mount --bind "/host$repo" /keep ;; *) repo= ;; esac
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
if [ -n "$repo" ]; then
    mkdir -p "/host$repo"
    mount --bind /keep "/host$repo"
fi
mount -t tracefs tracefs /host/sys/kernel/tracing
mount -t devpts devpts /host/dev/pts 2>/dev/null
mount --bind /out /host/mnt
locktrace=$(sed -n 's/.*locktrace_bin=\([^ ]*\).*/\1/p' /host/proc/cmdline)
mount --bind /host/mnt/locktrace "/host$locktrace"
smoke=$(sed -n 's/.*locktrace_smoke=\([^ ]*\).*/\1/p' /host/proc/cmdline)
# An optional test-name filter, for running one smoke test by hand.
filter=$(sed -n 's/.*locktrace_filter=\([^ ]*\).*/\1/p' /host/proc/cmdline)
uname -r >/host/mnt/uname
chroot /host /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp LOCKTRACE_IN_KERNEL_MATRIX=1 \
    "$smoke" --test-threads=1 $filter >/host/mnt/smoke.log 2>&1
echo $? >/host/mnt/smoke.rc
dmesg >/host/mnt/dmesg
cat /host/proc/sys/kernel/tainted >/host/mnt/tainted
sync
poweroff -f
