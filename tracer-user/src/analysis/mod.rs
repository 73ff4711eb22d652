//! From collected counts to the report model: the locks and totals
//! ([`build`]), sampled-mode estimates ([`estimate`]), per-request figures
//! ([`per_request`]) and what tracing cost ([`cost`]). No names here: that is
//! `naming`'s job.
pub mod build;
pub mod cost;
pub mod estimate;
pub mod per_request;
