//! `--mode inproc`: lock calls counted inside the target, without a trap.
//! The modules' GOT entries for the lock functions are switched to small
//! counting stubs in a mapping shared with locktrace; futex waits still
//! come from the tracepoints. See `session` for what is written into the
//! target and when, `inject` and `frame` for why a dead locktrace never
//! leaves a thread half way, and `seccomp` for the check that a seccomp
//! filter of the target lets it through.
pub(crate) mod frame;
pub(crate) mod inject;
pub mod layout;
pub(crate) mod seccomp;
pub(crate) mod session;
pub(crate) mod stubs;
