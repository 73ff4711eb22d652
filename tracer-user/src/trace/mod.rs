//! Everything that needs root: preflight checks, loading and attaching the
//! BPF programs, waiting for the end (stop signals, target exit), the load
//! and sampled runs, and reading the maps.
pub mod attach;
pub(crate) mod batch;
pub mod collect;
pub(crate) mod cpu;
pub(crate) mod expire;
pub(crate) mod features;
pub(crate) mod follow;
pub(crate) mod handoffs;
pub(crate) mod inflight;
pub mod inproc;
pub(crate) mod kernel_locks;
pub(crate) mod lifetimes;
pub(crate) mod live_keys;
pub(crate) mod maps;
pub mod multi;
pub(crate) mod php;
pub(crate) mod prealloc;
pub(crate) mod preflight;
pub(crate) mod priority;
pub(crate) mod proc_connector;
pub(crate) mod proc_events;
pub(crate) mod sampled;
pub(crate) mod snapshots;
pub(crate) mod stop;
pub(crate) mod sys;
pub(crate) mod window;
