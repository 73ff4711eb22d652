//! Types shared by the BPF programs (`tracer-ebpf`) and userspace (`tracer-user`):
//! map keys and values, the probe cookie layout, and the failure counters.
//! Every type is `#[repr(C)]` and plain data so both sides agree on its bytes.
#![no_std]

pub mod cookie;
pub mod counting;
pub mod cpu_sample;
pub mod drop_reason;
pub mod flags;
pub mod handoff_class;
pub mod histogram;
pub mod inproc_sample;
pub mod kernel_caps;
pub mod kernel_lock;
pub mod lifetime;
pub mod names;
pub mod php;
pub mod requests;
pub mod stack_kind;
pub mod wait_class;

mod counts;
mod cpu;
mod holds;
mod kernel_lock_maps;
mod limits;
mod ops;
mod stacks;

pub use counts::*;
pub use cpu::*;
pub use holds::*;
pub use kernel_lock_maps::*;
pub use limits::*;
pub use ops::*;
pub use stacks::*;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C) plain integers without padding.
    unsafe impl aya::Pod for super::LockCounts {}
    unsafe impl aya::Pod for super::Unmapped {}
    unsafe impl aya::Pod for super::FutexCounts {}
    unsafe impl aya::Pod for super::FutexWait {}
    unsafe impl aya::Pod for super::CondWait {}
    unsafe impl aya::Pod for super::CallerKey {}
    unsafe impl aya::Pod for super::StackKey {}
    unsafe impl aya::Pod for super::HeldKey {}
    unsafe impl aya::Pod for super::Held {}
    unsafe impl aya::Pod for super::Holder {}
    unsafe impl aya::Pod for super::HoldCounts {}
    unsafe impl aya::Pod for super::HolderKey {}
    unsafe impl aya::Pod for super::HolderHolds {}
    unsafe impl aya::Pod for super::WaitHolderKey {}
    unsafe impl aya::Pod for super::WaitTime {}
    unsafe impl aya::Pod for super::CodeRange {}
    unsafe impl aya::Pod for super::CpuSamples {}
    unsafe impl aya::Pod for super::HandoffCounts {}
    unsafe impl aya::Pod for super::CpuPlace {}
    unsafe impl aya::Pod for super::KernelLockKey {}
    unsafe impl aya::Pod for super::KernelLockCounts {}
    unsafe impl aya::Pod for super::KernelLockSite {}
    unsafe impl aya::Pod for super::php::PhpOffsets {}
    unsafe impl aya::Pod for super::php::RouteText {}
    unsafe impl aya::Pod for super::php::RouteLockKey {}
    unsafe impl aya::Pod for super::php::RouteLockCounts {}
}
