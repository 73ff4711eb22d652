//! Text outputs, each reading only the model: the table with its footers
//! ([`table`]), folded stacks and flame graphs ([`stacks`]), and the shared
//! number formatting ([`format`]), gzipped pprof profiles ([`pprof`]); every
//! format chosen and written one way ([`recorder`]: [`OutputFormat`],
//! [`write`], [`Sink`]).
pub mod cpu;
pub mod fit;
pub mod footer;
pub mod format;
pub mod handoffs;
pub mod holds;
pub mod in_progress;
pub mod inproc;
pub mod kernel_locks;
pub mod lost;
pub mod output;
pub mod pprof;
pub mod recorder;
pub mod removal;
pub mod requests;
pub mod routes;
pub mod saturation;
pub mod stacks;
pub mod table;
pub mod waits;

pub use recorder::{OutputFormat, Rendered, Sink, TableOptions, write};
