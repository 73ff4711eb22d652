//! locktrace's BPF programs: count lock calls per lock address (uprobes on the
//! pthread lock functions) and futex waits/wakes per futex address (syscall
//! tracepoints), for one target process. Userspace reads the maps at the end.
//!
//! Every counter is updated with an atomic add on a hash map entry that is
//! first created with BPF_NOEXIST, so no increment is lost when two threads
//! insert the same key at once. An insert that fails because the map is full
//! is counted in `DROPS`, never silent. Counters only ever summed (lock calls
//! per caller, hits, drops) are per CPU, so no cache line is written by every
//! CPU on the lock path. Every program first checks `COUNTING`, the switch
//! userspace clears before it reads the maps.
//!
//! The modules: `maps` (every map and global, by the names userspace uses),
//! `counters` (helpers all programs share), `locks` (lock calls and
//! trylocks), `stacks` (stack keys and snapshots), `requests` (the request
//! boundary), `futex` (futex and condvar waits), `holds` (hold times and
//! holders), `handoffs` (acquisitions on another CPU than the one before), `php`
//! (routes and PHP stacks, `--php`), `inproc` (`--mode inproc`'s
//! sampled stacks), `cpu` (CPU samples of lock code), `lifetimes` (memory that
//! went away) and `kernlocks` (kernel lock contention).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod counters;
mod cpu;
mod futex;
mod handoffs;
mod holds;
mod inproc;
mod kernlocks;
mod lifetimes;
mod locks;
mod maps;
mod php;
mod requests;
mod stacks;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// The kernel lets only GPL-compatible programs call the helpers we use
// (bpf_probe_read_user, perf events); "Dual MIT/GPL" is one it accepts,
// and matches this crate's MIT OR GPL-2.0.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
