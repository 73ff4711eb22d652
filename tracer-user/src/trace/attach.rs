//! BPF loading and attaching: loads the embedded object with the target's
//! tgid and the wanted flags, attaches the lock probes at their probe points,
//! the request probe and the futex tracepoints. The one place that attaches
//! uprobes: the plain run attaches once, the sampled run once per window.
//! Dropping the [`Loaded`] detaches everything.
use std::{
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{cookie, counting, flags, names};

use super::collect;
use super::cpu::{self, CpuSampling};
use super::features::{self, KernelFeatures};
use super::multi::{self, MultiPrograms};
use super::prealloc;
use crate::probe::{
    lockfuncs::{self, LockFunction},
    request_probe::RequestProbe,
    target::Target,
    waitfuncs::{CondWaitFunction, WaitFunctions},
};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LOCKTRACE_BPF_OBJECT"));

#[cfg(test)]
/// The BPF object as built (its maps as declared).
pub(crate) fn bpf_object() -> &'static [u8] {
    BPF_OBJECT
}

pub(crate) use crate::probe::placement::Placed;

/// A function run once per request: module as the target sees it, and the
/// file offset of its probe point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestProbePoint {
    pub module: String,
    pub file_offset: u64,
}

impl From<&RequestProbe> for RequestProbePoint {
    fn from(probe: &RequestProbe) -> RequestProbePoint {
        RequestProbePoint {
            module: probe.module.clone(),
            file_offset: probe.file_offset,
        }
    }
}

/// What to load and attach.
pub struct LoadPlan<'a> {
    pub target: &'a Target,
    pub functions: &'a [Placed],
    /// Bits of `tracer_common::flags`.
    pub flags: u32,
    /// Attach the lock probes now (off in contention mode, and in sampled
    /// mode, where the sampler attaches them per window).
    pub lock_probes: bool,
    /// Attach the request probe now (see `lock_probes`).
    pub request_probe: Option<RequestProbePoint>,
    /// Condvar wait functions and Go's `runtime.futex`: what classifies waits.
    pub waits: &'a WaitFunctions,
    /// `--hold-times`: the unlock functions, probed along with the lock functions.
    pub unlock_functions: &'a [Placed],
    /// The CPU sampler's rate and lock code (None: `--no-cpu`).
    pub cpu: Option<&'a CpuSampling>,
    /// `--mode inproc` in the live views: the stubs, which start counting
    /// with the probes (`record` opens their gate with its window).
    pub inproc: Option<&'a super::inproc::session::Session>,
    /// Trace kernel lock contention (`record`; the live views do not read it).
    pub kernel_locks: bool,
    /// Snapshot every lock init call (where heap locks were created), with
    /// or without `--stacks`: `record`'s counting modes (all, inproc).
    pub creation_sites: bool,
    /// `--mode inproc --stacks`: the stubs' sample call is traced.
    pub inproc_samples: bool,
}

impl LoadPlan<'_> {
    /// True when the lock init calls are probed: for the creation sites,
    /// or with the stacks, whose snapshots name heap locks the same way.
    pub(crate) fn probes_inits(&self) -> bool {
        self.creation_sites || (self.flags & flags::STACKS != 0 && self.lock_probes)
    }
}

pub struct Loaded {
    pub ebpf: Ebpf,
    pub probe_count: usize,
    pub attach_time: Duration,
    /// Why the CPU sampler is off although it was asked for (the kernel
    /// refused it); the recording counts on without CPU per lock.
    pub cpu_off: Option<String>,
    /// The module ranges watched for unmaps (see `lifetimes`).
    pub watched: super::lifetimes::Watched,
    /// Why kernel lock contention is not traced (no lock tracepoints).
    pub kernel_locks_off: Option<String>,
}

/// A finished recording's BPF object, its probes still in. Dropping it
/// detaches them, and the kernel waits for RCU grace periods at each
/// perf-event uprobe in turn (all mode's 34 under 200 spinning threads:
/// 4.3-5.5 s; dropped from 34 threads at once 4.6 s, the waits do not
/// overlap), so the caller drops it once the report is out (issue 52).
#[must_use = "dropping it detaches the probes, which takes seconds under load"]
pub(crate) struct Attached {
    ebpf: Ebpf,
    probes: usize,
}

impl Attached {
    pub(crate) fn new(loaded: Loaded) -> Attached {
        Attached {
            ebpf: loaded.ebpf,
            probes: loaded.probe_count,
        }
    }

    /// Detaches every probe and unloads the programs (seconds under load).
    pub(crate) fn detach(self) {
        let started = Instant::now();
        drop(self.ebpf);
        log::debug!(
            "detached {} probes in {} ms",
            self.probes,
            started.elapsed().as_millis()
        );
    }
}

/// Where an attach's time goes (`RUST_LOG=debug`): the times since its start.
fn log_stages(tgid: u32, [object, programs, probes]: [Duration; 3], all: Duration) {
    log::debug!(
        "pid {tgid}: BPF object loaded after {} ms, programs after {} ms, probes attached after {} ms, tracepoints after {} ms",
        object.as_millis(),
        programs.as_millis(),
        probes.as_millis(),
        all.as_millis()
    );
}

/// The BPF object as this kernel takes it: maps preallocated before Linux
/// 6.1, and without compare-exchange where the kernel lacks it.
fn object_for_this_kernel() -> Result<std::borrow::Cow<'static, [u8]>> {
    let object = if prealloc::run_time_allocation_allowed() {
        std::borrow::Cow::Borrowed(BPF_OBJECT)
    } else {
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "locktrace: this kernel (before Linux 6.1) warns about BPF maps allocated at run time: preallocating them (more kernel memory while tracing)\n"
            ),
        );
        std::borrow::Cow::Owned(prealloc::preallocated(BPF_OBJECT)?)
    };
    Ok(if KernelFeatures::get().compare_exchange {
        object
    } else {
        std::borrow::Cow::Owned(features::without_compare_exchange(&object)?)
    })
}

/// Loads the object, loads the uprobe programs, attaches what the plan says now.
pub fn load(plan: &LoadPlan) -> Result<Loaded> {
    let started = Instant::now();
    let tgid = plan.target.pid;
    let (go_start, go_end) = plan.waits.go_futex.unwrap_or((0, 0));
    let lock_functions: Vec<LockFunction> = plan.functions.iter().map(|(f, _)| f.clone()).collect();
    let lock_code = lockfuncs::lock_code_ranges(&lock_functions);
    let ranges = lock_code.len() as u32;
    let flags = plan.flags
        | if plan.waits.go_futex.is_some() {
            flags::GO_RUNTIME
        } else {
            0
        };
    let lock_code_ranges = plan.cpu.map_or(0, |cpu| cpu.lock_code.len() as u32);
    let object = object_for_this_kernel()?;
    let mut ebpf = EbpfLoader::new()
        .override_global(names::GLOBAL_TARGET_TGID, &tgid, true)
        .override_global(names::GLOBAL_FLAGS, &flags, true)
        .override_global(names::GLOBAL_GO_FUTEX_START, &go_start, true)
        .override_global(names::GLOBAL_GO_FUTEX_END, &go_end, true)
        .override_global(names::GLOBAL_LOCK_CODE_RANGES, &ranges, true)
        .override_global(names::GLOBAL_CPU_LOCK_CODE_RANGES, &lock_code_ranges, true)
        .override_global(
            names::GLOBAL_KERNEL_CAPS,
            &KernelFeatures::get().caps(),
            true,
        )
        .override_global(
            names::GLOBAL_FREE_PID_OFFSET,
            &super::kernel_locks::free_pid_offset().unwrap_or(0),
            true,
        )
        // The snapshot ring takes 32 MiB of kernel memory only for --stacks.
        .map_max_entries(names::MAP_SNAPSHOTS, snapshot_ring_bytes(plan))
        .load(&object)
        .map_err(|error| features::refused(&error))?;
    let object_loaded = started.elapsed();
    fill_tables(&mut ebpf, plan.flags, &lock_code)?;
    // Sampled mode: lock calls count only inside the sampler's windows.
    let counting = if plan.flags & flags::SAMPLED != 0 {
        counting::WAITS
    } else {
        counting::WAITS | counting::LOCK_CALLS
    };
    collect::set_counting(&mut ebpf, counting)?;
    // Before the lock probes: an unmap must split the keys from the first call.
    let mut watched = super::lifetimes::Watched::default();
    watched.update(
        &mut ebpf,
        super::lifetimes::module_ranges(&plan.target.maps),
    )?;
    super::lifetimes::attach(&mut ebpf)?;
    for name in [
        names::PROGRAM_LOCK_CALL,
        names::PROGRAM_REQUEST_BOUNDARY,
        names::PROGRAM_UNLOCK_CALL,
        names::PROGRAM_BREAKPOINT_ANCHOR,
    ] {
        uprobe(&mut ebpf, name)?
            .load()
            .with_context(|| format!("loading the BPF program {name}"))?;
    }
    let programs_loaded = started.elapsed();
    let probe_count = attach_user_probes(&mut ebpf, plan)?;
    let probes_attached = started.elapsed();
    let kernel_locks_off = attach_tracepoints(&mut ebpf, plan.kernel_locks)?;
    if plan.inproc_samples {
        attach_inproc_samples(&mut ebpf)?;
    }
    let stages = [object_loaded, programs_loaded, probes_attached];
    log_stages(tgid, stages, started.elapsed());
    // Last: the samples then see every probe that will count in place.
    let cpu_off = plan
        .cpu
        .and_then(|sampling| cpu::attach_sampler(&mut ebpf, sampling).err())
        .map(|error| {
            // A sampler on some CPUs only would misstate the CPU per lock.
            cpu::detach_sampler(&mut ebpf);
            format!("{error:#}")
        });
    Ok(Loaded {
        ebpf,
        probe_count,
        attach_time: started.elapsed(),
        cpu_off,
        watched,
        kernel_locks_off,
    })
}

/// The futex syscall tracepoints, and the kernel lock ones when asked for;
/// returns why the kernel lock ones are not in (no such tracepoints, or
/// not asked for).
fn attach_tracepoints(ebpf: &mut Ebpf, kernel_locks: bool) -> Result<Option<String>> {
    for (name, event) in [
        (names::PROGRAM_FUTEX_ENTER, "sys_enter_futex"),
        (names::PROGRAM_FUTEX_EXIT, "sys_exit_futex"),
    ] {
        let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
        program.load().with_context(|| format!("loading {name}"))?;
        program.attach("syscalls", event).with_context(|| {
            format!("attaching to the syscalls:{event} tracepoint (is tracefs mounted?)")
        })?;
    }
    attach_futex_waitv(ebpf)?;
    Ok(if kernel_locks {
        super::kernel_locks::attach(ebpf).err()
    } else {
        Some(super::kernel_locks::NOT_ASKED.to_string())
    })
}

/// The stubs' sample call (`getppid`, see `inproc::stubs`).
fn attach_inproc_samples(ebpf: &mut Ebpf) -> Result<()> {
    let name = names::PROGRAM_INPROC_SAMPLE;
    let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
    program.load().with_context(|| format!("loading {name}"))?;
    program
        .attach("syscalls", "sys_enter_getppid")
        .context("attaching to the syscalls:sys_enter_getppid tracepoint (is tracefs mounted?)")?;
    Ok(())
}

/// The tables userspace fills before the probes: the lock functions' code
/// ranges, and the CPUs' places when handoffs are counted.
fn fill_tables(
    ebpf: &mut Ebpf,
    plan_flags: u32,
    lock_code: &[tracer_common::CodeRange],
) -> Result<()> {
    cpu::store_code_ranges(ebpf, names::MAP_LOCK_CODE, lock_code)?;
    super::handoffs::store_places_if(ebpf, plan_flags)
}

fn snapshot_ring_bytes(plan: &LoadPlan) -> u32 {
    if plan.flags & flags::STACKS != 0 {
        tracer_common::SNAPSHOT_RING_BYTES
    } else if plan.probes_inits() {
        tracer_common::INIT_SNAPSHOT_RING_BYTES
    } else {
        page_size()
    }
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).unwrap_or(4096)
}

/// Attaches the plan's uprobes, all bound to the target's probe task (see
/// `scope`): at load, and again on a live thread when the main thread left
/// with `pthread_exit` (the old ones then never fire: the kernel's filter
/// follows the exited task). Returns how many probes were attached.
pub(crate) fn attach_user_probes(ebpf: &mut Ebpf, plan: &LoadPlan) -> Result<usize> {
    attach_user_probes_but(ebpf, plan, false)
}

/// [`attach_user_probes`]; when `lock_calls_elsewhere` (uprobe-multi links
/// count the lock calls), empty anchor probes take the lock-call points.
pub(crate) fn attach_user_probes_but(
    ebpf: &mut Ebpf,
    plan: &LoadPlan,
    lock_calls_elsewhere: bool,
) -> Result<usize> {
    let mut probe_count = 0;
    // The stubs (`--mode inproc`) count from here, as the probes do.
    if let Some(session) = plan.inproc {
        session.set_counting(true);
    }
    if plan.lock_probes {
        // Unlock probes first: every hold begun is then seen to end.
        probe_count += attach_points(
            ebpf,
            names::PROGRAM_UNLOCK_CALL,
            plan.target,
            plan.unlock_functions,
        )?
        .len();
        let program = if lock_calls_elsewhere {
            names::PROGRAM_BREAKPOINT_ANCHOR
        } else {
            names::PROGRAM_LOCK_CALL
        };
        probe_count += attach_points(ebpf, program, plan.target, plan.functions)?.len();
    }
    if let Some(point) = &plan.request_probe {
        attach_request_probe(ebpf, plan.target, point)?;
        probe_count += 1;
    }
    // Return probes of the lock functions that may fail: always in (sampled
    // mode moves only the entry probes), so every counted call's result is seen.
    probe_count += attach_try_lock_returns(ebpf, plan.target, plan.functions)?;
    // Condvar waits and futex syscalls: always traced.
    probe_count += attach_cond_wait_probes(ebpf, plan.target, plan.waits)?;
    // Where locks are created: their snapshots name heap locks.
    if plan.probes_inits() {
        let entries = function_entries(&plan.waits.lock_inits);
        probe_count += attach_at_entries(
            ebpf,
            names::PROGRAM_LOCK_INIT,
            "entry",
            plan.target,
            &entries,
        )?;
    }
    Ok(probe_count)
}

/// `futex_waitv` (Linux 5.16+) waits: traced where the syscall exists; a
/// kernel without it has no such waits to miss.
fn attach_futex_waitv(ebpf: &mut Ebpf) -> Result<()> {
    if !super::preflight::has_syscall_tracepoint("sys_enter_futex_waitv") {
        return Ok(());
    }
    for (name, event) in [
        (names::PROGRAM_FUTEX_WAITV_ENTER, "sys_enter_futex_waitv"),
        (names::PROGRAM_FUTEX_WAITV_EXIT, "sys_exit_futex_waitv"),
    ] {
        let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
        program.load().with_context(|| format!("loading {name}"))?;
        program
            .attach("syscalls", event)
            .with_context(|| format!("attaching to the syscalls:{event} tracepoint"))?;
    }
    Ok(())
}

/// Why an attach failed: the target is gone (a normal end), or a real error.
#[derive(Debug)]
pub enum AttachError {
    TargetExited,
    Failed(anyhow::Error),
}

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachError::TargetExited => {
                f.write_str("the target exited while locktrace was attaching")
            }
            // The whole chain here, and no `source`: anyhow's `{:#}` prints it once.
            AttachError::Failed(error) => write!(f, "{error:#}"),
        }
    }
}

/// Callers branch on [`AttachError::TargetExited`]; elsewhere `?` makes it an `anyhow::Error`.
impl std::error::Error for AttachError {}

/// Attaches `lock_call` at every probe point of every lock function.
pub fn attach_lock_probes(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[Placed],
) -> Result<Vec<UProbeLinkId>, AttachError> {
    attach_points(ebpf, names::PROGRAM_LOCK_CALL, target, functions)
}

/// Attaches `program` at every probe point of every function, each with the
/// cookie that says which function it is and where the return address is.
fn attach_points(
    ebpf: &mut Ebpf,
    program: &str,
    target: &Target,
    functions: &[Placed],
) -> Result<Vec<UProbeLinkId>, AttachError> {
    let scope = scope(target).map_err(AttachError::Failed)?;
    let with_cookies = KernelFeatures::get().attach_cookies;
    let mut by_address = Vec::new();
    let uprobe = uprobe(ebpf, program).map_err(AttachError::Failed)?;
    let mut links = Vec::new();
    for (function, placed) in functions {
        let module = target.host_path(&function.module);
        for point in &placed.points {
            let cookie = cookie::encode(function.op, point.return_address_sp_offset);
            if !with_cookies {
                for address in target.code_addresses(&function.module, point.file_offset) {
                    by_address.push((address, cookie));
                }
            }
            let attach_point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(point.file_offset),
                cookie: with_cookies.then_some(cookie),
            };
            let link = match uprobe.attach(attach_point, &module, scope) {
                Ok(link) => link,
                Err(error) => {
                    // The links made so far would go on counting after the
                    // error, and twice if the caller attaches again.
                    for made in links.drain(..) {
                        let _ = uprobe.detach(made);
                    }
                    let what = format!(
                        "{} at {:#x} in {}",
                        function.op.symbol(),
                        point.file_offset,
                        function.module
                    );
                    return Err(attach_error(target, &what, error));
                }
            };
            // Says where each probe went, so another tool can probe the same points.
            log::debug!(
                "probe point {}+{:#x} ({}, {})",
                function.module,
                point.file_offset,
                function.op.symbol(),
                if point.emulated {
                    "emulated"
                } else {
                    "single-stepped"
                }
            );
            links.push(link);
        }
    }
    if program == names::PROGRAM_LOCK_CALL {
        store_probe_cookies(ebpf, &by_address).map_err(AttachError::Failed)?;
    }
    Ok(links)
}

/// Kernels without attach cookies: each probe point's cookie under its
/// address in the target, where `lock_call` looks it up.
fn store_probe_cookies(ebpf: &mut Ebpf, by_address: &[(u64, u64)]) -> Result<()> {
    if by_address.is_empty() {
        return Ok(());
    }
    let map = ebpf.map_mut(names::MAP_PROBE_COOKIES).ok_or_else(|| {
        anyhow!(
            "BPF object lacks map {} (build is broken)",
            names::MAP_PROBE_COOKIES
        )
    })?;
    let mut cookies: aya::maps::HashMap<_, u64, u64> = aya::maps::HashMap::try_from(map)?;
    for &(address, cookie) in by_address {
        cookies.insert(address, cookie, 0).with_context(|| {
            format!(
                "storing the probe point at {address:#x} (this kernel has no attach cookies; at most {} probe points)",
                tracer_common::MAX_PROBE_POINTS
            )
        })?;
    }
    Ok(())
}

/// Loads the lock program again for uprobe-multi links, counting into
/// `ebpf`'s maps (sampled mode's request probe stays in all along, as a
/// perf-event uprobe).
pub fn load_multi(ebpf: &Ebpf) -> Result<MultiPrograms> {
    // Cookies are how uprobe-multi links tell their points apart; a kernel
    // with these links has them (6.6+), so this only holds in the tests.
    if !KernelFeatures::get().attach_cookies {
        anyhow::bail!("uprobe-multi links need attach cookies, which this kernel lacks");
    }
    MultiPrograms::load(BPF_OBJECT, ebpf, &[names::PROGRAM_LOCK_CALL])
}

/// Attaches `lock_call` at every probe point with one uprobe-multi link per
/// module, scoped to `pid` (the target, or locktrace itself for a canary).
pub fn attach_lock_probes_multi(
    programs: &MultiPrograms,
    target: &Target,
    functions: &[Placed],
    pid: u32,
) -> Result<Vec<OwnedFd>, AttachError> {
    let program = programs
        .fd(names::PROGRAM_LOCK_CALL)
        .map_err(AttachError::Failed)?;
    // Module → (offsets, cookies), in the order the functions come.
    let mut modules: Vec<(&str, Vec<u64>, Vec<u64>)> = Vec::new();
    for (function, placed) in functions {
        let at = match modules.iter().position(|(m, ..)| *m == function.module) {
            Some(at) => at,
            None => {
                modules.push((&function.module, Vec::new(), Vec::new()));
                modules.len() - 1
            }
        };
        for point in &placed.points {
            modules[at].1.push(point.file_offset);
            modules[at]
                .2
                .push(cookie::encode(function.op, point.return_address_sp_offset));
        }
    }
    modules
        .into_iter()
        .filter(|(_, offsets, _)| !offsets.is_empty())
        .map(|(module, offsets, cookies)| {
            multi::attach(program, &target.host_path(module), &offsets, &cookies, pid).map_err(
                |error| {
                    if target.is_alive() {
                        AttachError::Failed(error)
                    } else {
                        AttachError::TargetExited
                    }
                },
            )
        })
        .collect()
}

/// Attaches `request_boundary` at the request-probe point.
pub(crate) fn attach_request_probe(
    ebpf: &mut Ebpf,
    target: &Target,
    point: &RequestProbePoint,
) -> Result<UProbeLinkId, AttachError> {
    let scope = scope(target).map_err(AttachError::Failed)?;
    let program = uprobe(ebpf, names::PROGRAM_REQUEST_BOUNDARY).map_err(AttachError::Failed)?;
    program
        .attach(
            UProbeAttachLocation::AbsoluteOffset(point.file_offset),
            target.host_path(&point.module),
            scope,
        )
        .map_err(|error| attach_error(target, &format!("request probe in {}", point.module), error))
}

/// Attaches `try_lock_exit` to the return of every lock function that may
/// fail (trylock, timed and clock variants). Returns how many.
fn attach_try_lock_returns(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[Placed],
) -> Result<usize> {
    let entries: Vec<FunctionEntry> = functions
        .iter()
        .map(|(function, _)| function)
        .filter(|function| function.op.may_fail())
        .map(|function| {
            (
                function.op.symbol(),
                function.module.as_str(),
                function.file_offset,
            )
        })
        .collect();
    attach_at_entries(
        ebpf,
        names::PROGRAM_TRY_LOCK_EXIT,
        "return",
        target,
        &entries,
    )
}

/// Attaches the entry and return probes of every condvar wait function.
/// Returns how many probes were attached.
fn attach_cond_wait_probes(
    ebpf: &mut Ebpf,
    target: &Target,
    waits: &WaitFunctions,
) -> Result<usize> {
    let entries = function_entries(&waits.cond_waits);
    let mut attached = 0;
    for (name, which) in [
        (names::PROGRAM_COND_WAIT_ENTER, "entry"),
        (names::PROGRAM_COND_WAIT_EXIT, "return"),
    ] {
        attached += attach_at_entries(ebpf, name, which, target, &entries)?;
    }
    Ok(attached)
}

/// A function by (symbol, module as the target sees it, entry's file offset).
type FunctionEntry<'a> = (&'a str, &'a str, u64);

/// The entries of functions found by `waitfuncs` (condvar waits, lock inits).
fn function_entries(functions: &[CondWaitFunction]) -> Vec<FunctionEntry<'_>> {
    functions
        .iter()
        .map(|f| (f.symbol.as_str(), f.module.as_str(), f.file_offset))
        .collect()
}

/// Loads the uprobe `program` and attaches it (an entry or a return probe,
/// `which`) at the entry of each function. Returns how many.
fn attach_at_entries(
    ebpf: &mut Ebpf,
    program: &str,
    which: &str,
    target: &Target,
    entries: &[FunctionEntry],
) -> Result<usize> {
    if entries.is_empty() {
        return Ok(0);
    }
    let scope = scope(target)?;
    let loaded = uprobe(ebpf, program)?;
    // Loaded once: attached again when the probes move to a live thread.
    if loaded.fd().is_err() {
        loaded
            .load()
            .map_err(|error| anyhow!("loading {program}: {error}"))?;
    }
    for &(symbol, module, file_offset) in entries {
        loaded
            .attach(
                UProbeAttachLocation::AbsoluteOffset(file_offset),
                target.host_path(module),
                scope,
            )
            .map_err(|error| {
                anyhow!("attaching the {which} probe of {symbol} in {module} failed: {error}")
            })?;
    }
    Ok(entries.len())
}

/// The links of `program`, taken out so they can be dropped (detached) elsewhere.
pub fn take_links(
    ebpf: &mut Ebpf,
    program: &str,
    links: Vec<UProbeLinkId>,
) -> Result<Vec<aya::programs::uprobe::UProbeLink>> {
    let program = uprobe(ebpf, program)?;
    Ok(links
        .into_iter()
        .filter_map(|id| program.take_link(id).ok())
        .collect())
}

/// A lock probe on the first probe point, scoped to locktrace's own
/// process: the programs count only the target's threads, so it never
/// counts. Timing its detach tells the sampler how long detaching takes
/// right now, without losing a window to finding out.
pub(crate) fn attach_canary(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[Placed],
) -> Result<Option<aya::programs::uprobe::UProbeLink>> {
    let Some((function, point)) = functions
        .iter()
        .find_map(|(function, placed)| Some((function, placed.points.first()?)))
    else {
        return Ok(None);
    };
    let own = UProbeScope::OneProcess(
        std::num::NonZeroU32::new(std::process::id()).ok_or_else(|| anyhow!("own pid is 0"))?,
    );
    let program = uprobe(ebpf, names::PROGRAM_LOCK_CALL)?;
    // Its cookie, where the kernel has none, is the target's (never counts here).
    let attach_point = UProbeAttachPoint {
        location: UProbeAttachLocation::AbsoluteOffset(point.file_offset),
        cookie: KernelFeatures::get()
            .attach_cookies
            .then(|| cookie::encode(function.op, point.return_address_sp_offset)),
    };
    let link = program.attach(attach_point, target.host_path(&function.module), own)?;
    Ok(Some(program.take_link(link)?))
}

/// The task the kernel's filter follows: every thread sharing its memory
/// is counted (the main thread, or a live one once it left).
fn scope(target: &Target) -> Result<UProbeScope> {
    Ok(UProbeScope::OneProcess(
        std::num::NonZeroU32::new(target.probe_task())
            .ok_or_else(|| anyhow!("pid 0 is not a process"))?,
    ))
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    Ok(program(ebpf, name)?.try_into()?)
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("BPF object lacks program {name} (build is broken)"))
}

fn attach_error(target: &Target, what: &str, error: aya::programs::ProgramError) -> AttachError {
    if !target.is_alive() {
        AttachError::TargetExited
    } else {
        // aya's message ("`perf_event_open` failed") keeps the errno in its source.
        let mut reason = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
        AttachError::Failed(anyhow!("attaching the uprobe for {what} failed: {reason}"))
    }
}

#[cfg(test)]
mod object_names {
    use std::collections::BTreeSet;

    use object::{Object, ObjectSection, ObjectSymbol};
    use tracer_common::names;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    /// Userspace finds programs and maps by the names in `tracer_common::names`:
    /// every one must be in the embedded object, and every program and map of
    /// the object must be named there (a new map cannot be forgotten).
    #[test]
    fn every_program_and_map_name_is_in_the_embedded_object() {
        let parsed =
            aya_obj::Object::parse(super::bpf_object()).expect("the embedded object parses");
        let programs: BTreeSet<String> = parsed.programs.keys().cloned().collect();
        assert_eq!(programs, set(names::PROGRAMS));
        let maps: BTreeSet<String> = parsed
            .maps
            .keys()
            .filter(|name| !name.starts_with('.'))
            .cloned()
            .collect();
        let mut expected = set(names::MAPS);
        expected.extend(set(names::BPF_ONLY_MAPS));
        assert_eq!(maps, expected);
    }

    /// The globals userspace sets before load are data symbols of the object.
    #[test]
    fn every_global_is_a_data_symbol_of_the_embedded_object() {
        let file = object::File::parse(super::bpf_object()).expect("the embedded object parses");
        let data_symbols: BTreeSet<String> = file
            .symbols()
            .filter(|symbol| {
                symbol
                    .section_index()
                    .and_then(|index| file.section_by_index(index).ok())
                    .and_then(|section| section.name().ok().map(|name| name.starts_with('.')))
                    .unwrap_or(false)
            })
            .filter_map(|symbol| symbol.name().ok().map(str::to_string))
            .collect();
        for global in names::GLOBALS {
            assert!(
                data_symbols.contains(*global),
                "no global {global} in the object"
            );
        }
    }
}
