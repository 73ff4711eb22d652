//! locktrace: per-lock acquisition and contention counts for a live process,
//! with eBPF. The layers, lowest first; each uses only those before it:
//!
//! - [`model`]: the report's serde types (imports nothing from the crate);
//! - [`loadgen`]: the HTTP load driver;
//! - [`probe`]: the target process, its lock functions, where probes go (pure, no root);
//! - [`trace`]: everything that needs root: preflight, attach, stop, the load and sampled runs, map reading;
//! - [`analysis`]: collected counts to the model (per request, estimates, cost),
//!   through one `builder::ReportBuilder` for `record` and the live views;
//! - [`naming`]: symbols, regions and pointer chains into the model;
//! - [`render`]: text, folded stacks and flame graphs, from the model only,
//!   every format written by one `render::write`;
//! - [`session`]: one tracing session (plan, attach, read, finish) for
//!   `record` and the live views;
//! - [`compare`]: two reports side by side, CI assertions;
//! - [`record`]: one recording, end to end; [`live`]: a session that stays
//!   attached and reports each interval;
//! - [`serve`] (Prometheus endpoint) and [`top`] (live table), on a live session;
//! - [`agent`]: live sessions on every PHP server (or selected process) of the machine, on one endpoint;
//! - [`cli`]: the command line.
//!
//! Items are `pub(crate)` unless xtask or the integration tests name them,
//! so the dead-code lint sees the rest.
pub mod model;

pub(crate) mod loadgen;
pub mod probe;
pub mod trace;

pub mod analysis;
pub mod naming;
pub mod render;

pub mod session;

pub mod compare;
pub mod live;
pub(crate) mod record;

pub mod agent;
pub(crate) mod serve;
pub(crate) mod top;

pub mod cli;
