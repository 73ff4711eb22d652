//! The kernel's floor for counting every lock call of a running process:
//! locktrace's own lock probe points (auto placement), attached with its
//! lock program while nothing counts, so each call pays the uprobe trap
//! and a program that checks the pid and one array slot and returns (what
//! the issue calls an empty program: bpftrace's `/pid == N/ {}`). No futex
//! tracepoint, no sampler, no request probe. What all-locks mode adds above
//! this is locktrace's counting; below it no uprobe tracer can go.
use anyhow::{Context, Result};
use aya::programs::TracePoint;
use locktrace::{
    model::{Mode, Placement},
    session,
    trace::{
        attach::{self, Loaded},
        collect,
    },
};
use tracer_common::names;

/// The probes, in the target until dropped.
pub struct FloorProbes {
    _loaded: Loaded,
}

pub fn attach(pid: u32) -> Result<FloorProbes> {
    let prepared = session::prepare(pid, Mode::All, Placement::Auto, false)?;
    let mut loaded = attach::load(&session::bench_load_plan(
        &prepared,
        session::BenchProbes::LocksNotCounting,
    ))?;
    collect::set_counting(&mut loaded.ebpf, 0)?;
    // The futex tracepoints load with every plan; the floor has none.
    for name in [names::PROGRAM_FUTEX_ENTER, names::PROGRAM_FUTEX_EXIT] {
        let program: &mut TracePoint = loaded
            .ebpf
            .program_mut(name)
            .with_context(|| format!("no BPF program {name}"))?
            .try_into()?;
        program
            .unload()
            .with_context(|| format!("detaching {name}"))?;
    }
    Ok(FloorProbes { _loaded: loaded })
}
