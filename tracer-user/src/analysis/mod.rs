//! From collected counts to the report model: the locks and totals
//! ([`build`]), sampled-mode estimates ([`estimate`]), per-request figures
//! ([`per_request`]), what tracing cost ([`cost`]) and which futex waits
//! are lock contention ([`waits`]), the CPU lock code cost ([`cpu`]), rows of
//! several addresses merged into one ([`group`]). No names here: that is
//! `naming`'s job. [`builder`] is the one entry point: `record` and the
//! live views build their reports through it.
pub mod build;
pub mod builder;
pub mod cost;
pub mod cpu;
pub mod estimate;
pub mod group;
pub mod handoffs;
pub mod holds;
pub mod in_progress;
pub mod inproc;
pub mod kernel_locks;
pub mod per_request;
pub mod removal;
pub mod routes;
pub mod saturation;
pub mod sites;
pub mod waits;
pub mod window;
