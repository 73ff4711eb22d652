//! The real-BPF integration tests, one binary (issue 48; blazesym's
//! `tests/integration.rs` is the model). Each former test file is a module
//! under `tests/suite/` or `tests/serial/` (a layers test checks that every
//! file there is declared here), and the harness runs two tests at a time
//! across all of them instead of one binary after another. Needs root
//! (`root-tests`).
//!
//! One module, as root: `cargo test -p tracer-user --features root-tests
//! --test integration -- --test-threads=2 inproc::`.
mod common;

/// The tests that mix freely, two at a time.
mod suite {
    mod apache;
    mod apache_php;
    mod cpu;
    mod creation_sites;
    mod debuginfod;
    mod dist;
    mod foundation;
    mod frankenphp;
    mod frankenphp_real;
    mod frankenphp_shapes;
    mod frankenphp_static;
    mod frankenphp_stripped;
    mod handoffs;
    mod holds;
    mod hostile;
    mod hostile_locks;
    mod hostile_maps;
    mod in_progress;
    mod inproc;
    mod inproc_seccomp;
    mod kernel_locks;
    mod lifetimes;
    mod live;
    mod mariadb;
    mod modes;
    mod naming;
    mod php_routes;
    mod placement;
    mod pprof;
    mod python_gil;
    mod requests;
    mod saturation;
    mod schema;
    mod stacks;
    mod stripped;
    mod waits;
}

/// Tests that must not share the machine with the rest: deadlines of 2 s
/// under load (the agent's re-attach, `attach_load`'s report after
/// SIGTERM).
/// `scripts/test.sh` runs the others with `--skip serial::`, then each of
/// these modules alone (`serial::agent::`, ...), two of its tests at a time
/// as before.
mod serial {
    mod agent;
    mod attach_load;
}
