//! What to probe, worked out without root: the target process and its
//! memory map, its lock functions, where each probe goes, and the
//! request-boundary function, and what tells waiting for work apart from
//! lock contention (condvar wait functions, Go's `runtime.futex`). Pure functions of files and /proc, unit-testable.
pub mod btf;
pub mod gopclntab;
pub mod got;
pub mod kallsyms;
pub mod libc_code;
pub mod lockfuncs;
pub mod memory;
pub mod modules;
pub mod php;
pub mod placement;
pub mod request_auto;
pub mod request_probe;
pub mod shrink_guard;
pub mod target;
pub mod topology;
pub mod waitfuncs;
