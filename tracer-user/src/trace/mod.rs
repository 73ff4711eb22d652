//! Everything that needs root: preflight checks, loading and attaching the
//! BPF programs, waiting for the end (stop signals, target exit), the load
//! and sampled runs, and reading the maps.
pub mod attach;
pub mod collect;
pub mod cpu;
pub mod expire;
pub mod features;
pub mod follow;
pub mod handoffs;
pub mod inflight;
pub mod inproc;
pub mod kernel_locks;
pub mod lifetimes;
pub mod live_keys;
pub mod maps;
pub mod multi;
pub mod php;
pub mod prealloc;
pub mod preflight;
pub mod priority;
pub mod proc_connector;
pub mod proc_events;
pub mod sampled;
pub mod snapshots;
pub mod stop;
pub mod sys;
pub mod window;
