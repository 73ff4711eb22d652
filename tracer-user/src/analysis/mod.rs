//! From collected counts to the report model: the locks and totals
//! ([`build`]), sampled-mode estimates ([`estimate`]), per-request figures
//! ([`per_request`]), what tracing cost ([`cost`]) and which futex waits
//! are lock contention ([`waits`]), the CPU lock code cost ([`cpu`]), rows of
//! several addresses merged into one ([`group`]). No names here: that is
//! `naming`'s job. [`builder`] is the one entry point: `record` and the
//! live views build their reports through it.
pub(crate) mod build;
pub(crate) mod builder;
pub mod cost;
pub(crate) mod cpu;
pub(crate) mod estimate;
pub(crate) mod group;
pub(crate) mod handoffs;
pub(crate) mod holds;
pub(crate) mod in_progress;
pub(crate) mod inproc;
pub(crate) mod kernel_locks;
pub(crate) mod per_request;
pub(crate) mod removal;
pub(crate) mod routes;
pub(crate) mod saturation;
pub(crate) mod sites;
pub(crate) mod waits;
pub(crate) mod window;
