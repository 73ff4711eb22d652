//! Text outputs, each reading only the model: the table with its footers
//! ([`table`]), folded stacks and flame graphs ([`stacks`]), and the shared
//! number formatting ([`format`]), gzipped pprof profiles ([`pprof`]); every
//! format chosen and written one way ([`recorder`]: [`OutputFormat`],
//! [`write`], [`Sink`]).
pub(crate) mod cpu;
pub mod fit;
pub(crate) mod footer;
pub(crate) mod format;
pub(crate) mod handoffs;
pub(crate) mod holds;
pub(crate) mod in_progress;
pub(crate) mod inproc;
pub(crate) mod kernel_locks;
pub(crate) mod lost;
pub(crate) mod output;
pub mod pprof;
pub(crate) mod recorder;
pub(crate) mod removal;
pub(crate) mod requests;
pub(crate) mod routes;
pub(crate) mod saturation;
pub(crate) mod stacks;
pub mod table;
pub(crate) mod waits;

pub use recorder::{OutputFormat, Sink, TableOptions, write};
