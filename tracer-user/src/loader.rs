//! BPF loading and attaching: loads the embedded object with the target's
//! tgid and the wanted flags, attaches the lock probes at their probe points
//! and the futex tracepoints. Dropping the [`Loaded`] detaches everything.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use tracer_common::cookie;

use crate::{lockfuncs::LockFunction, placement::PlacedFunction, target::Target};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LOCKTRACE_BPF_OBJECT"));

/// What to load and attach.
pub struct LoadPlan<'a> {
    pub target: &'a Target,
    pub functions: &'a [(LockFunction, PlacedFunction)],
    /// Bits of `tracer_common::flags`.
    pub flags: u32,
    /// Attach the lock probes (off in contention mode).
    pub lock_probes: bool,
    /// A function run once per request: (module as the target sees it, file offset).
    pub request_probe: Option<(String, u64)>,
    /// `--hold-times`: the unlock functions, probed along with the lock functions.
    pub unlock_functions: &'a [(LockFunction, PlacedFunction)],
}

pub struct Loaded {
    pub ebpf: Ebpf,
    pub probe_count: usize,
    pub attach_time: Duration,
}

pub fn load(plan: &LoadPlan) -> Result<Loaded> {
    let started = Instant::now();
    let tgid = plan.target.pid;
    let lock_functions: Vec<LockFunction> = plan.functions.iter().map(|(f, _)| f.clone()).collect();
    let (lock_code_start, lock_code_end) = crate::holds::lock_code_range(&lock_functions);
    let mut ebpf = EbpfLoader::new()
        .override_global("TARGET_TGID", &tgid, true)
        .override_global("FLAGS", &plan.flags, true)
        .override_global("LOCK_CODE_START", &lock_code_start, true)
        .override_global("LOCK_CODE_END", &lock_code_end, true)
        .load(BPF_OBJECT)
        .map_err(|error| anyhow!("the kernel refused locktrace's BPF programs ({error}); it needs BPF with BTF, uprobes and syscall tracepoints (Linux 5.15 or newer)"))?;
    let scope = UProbeScope::OneProcess(
        std::num::NonZeroU32::new(tgid).ok_or_else(|| anyhow!("pid 0 is not a process"))?,
    );

    let mut probe_count = 0;
    if plan.lock_probes {
        // Unlock probes first: every hold begun is then seen to end.
        probe_count +=
            crate::holds::attach_unlocks(&mut ebpf, plan.target, plan.unlock_functions, scope)?;
        let program: &mut UProbe = program(&mut ebpf, "lock_call")?.try_into()?;
        program.load().context("loading the lock probe")?;
        probe_count += attach_functions(program, plan.target, plan.functions, scope)?;
    }
    if let Some((module, offset)) = &plan.request_probe {
        let program: &mut UProbe = program(&mut ebpf, "request_boundary")?.try_into()?;
        program.load().context("loading the request probe")?;
        program
            .attach(
                UProbeAttachLocation::AbsoluteOffset(*offset),
                plan.target.host_path(module),
                scope,
            )
            .map_err(|error| {
                attach_error(plan.target, &format!("request probe in {module}"), error)
            })?;
        probe_count += 1;
    }
    if plan.flags & tracer_common::flags::FUTEX != 0 {
        for (name, event) in [
            ("futex_enter", "sys_enter_futex"),
            ("futex_exit", "sys_exit_futex"),
        ] {
            let program: &mut TracePoint = program(&mut ebpf, name)?.try_into()?;
            program.load().with_context(|| format!("loading {name}"))?;
            program.attach("syscalls", event).with_context(|| {
                format!("attaching to the syscalls:{event} tracepoint (is tracefs mounted?)")
            })?;
        }
    }
    Ok(Loaded {
        ebpf,
        probe_count,
        attach_time: started.elapsed(),
    })
}

/// Attaches `program` at every probe point of `functions`, with the cookie
/// saying which function and where its return address is; returns the count.
pub fn attach_functions(
    program: &mut UProbe,
    target: &Target,
    functions: &[(LockFunction, PlacedFunction)],
    scope: UProbeScope,
) -> Result<usize> {
    let mut count = 0;
    for (function, placed) in functions {
        let module = target.host_path(&function.module);
        for point in &placed.points {
            let attach_point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(point.file_offset),
                cookie: Some(cookie::encode(function.op, point.return_address_sp_offset)),
            };
            program
                .attach(attach_point, &module, scope)
                .map_err(|error| {
                    attach_error(
                        target,
                        &format!(
                            "{} at {:#x} in {}",
                            function.op.symbol(),
                            point.file_offset,
                            function.module
                        ),
                        error,
                    )
                })?;
            count += 1;
        }
    }
    Ok(count)
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("BPF object lacks program {name} (build is broken)"))
}

fn attach_error(target: &Target, what: &str, error: aya::programs::ProgramError) -> anyhow::Error {
    if !target.is_alive() {
        anyhow!(
            "process {} exited while locktrace was attaching",
            target.pid
        )
    } else {
        anyhow!("attaching the uprobe for {what} failed: {error}")
    }
}
