//! What to probe, worked out without root: the target process and its
//! memory map, its lock functions, where each probe goes, and the
//! request-boundary function, and what tells waiting for work apart from
//! lock contention (condvar wait functions, Go's `runtime.futex`). Pure functions of files and /proc, unit-testable.
pub(crate) mod btf;
pub mod gopclntab;
pub mod got;
pub(crate) mod kallsyms;
pub(crate) mod libc_code;
pub mod lockfuncs;
pub mod memory;
pub mod modules;
pub(crate) mod php;
pub(crate) mod placement;
pub mod request_auto;
pub(crate) mod request_probe;
pub(crate) mod shrink_guard;
pub mod target;
pub mod topology;
pub(crate) mod waitfuncs;
