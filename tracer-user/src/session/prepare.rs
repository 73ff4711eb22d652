//! What the probe layer works out before anything is attached: the target,
//! its lock functions and their probe points, for `record` and the live
//! views alike.
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::{
    model::{Mode, Placement, diagnostics::note},
    naming::{self, php::PhpRuntime},
    probe::{
        btf,
        lockfuncs::{self, LockFunction, LockFunctionsMissing},
        placement,
        target::Target,
        waitfuncs::{self, WaitFunctions},
    },
    trace::{attach::Placed, preflight},
};

/// What the probe layer worked out before anything is attached.
pub struct Prepared {
    pub target: Target,
    pub functions: Vec<lockfuncs::LockFunction>,
    pub placed: Vec<Placed>,
    /// What classifies futex waits (condvar functions, Go's runtime.futex).
    pub waits: WaitFunctions,
    /// `--hold-times`: the unlock functions and their probe points (else empty).
    pub unlocks: Vec<Placed>,
    /// Runtime ranges of the lock functions and libc's lock slow paths, for the CPU sampler.
    pub lock_code: Vec<tracer_common::CodeRange>,
}

impl Prepared {
    /// The same, with lock probes only for `ops` (`--mode inproc`: the
    /// functions the stubs do not count).
    pub(crate) fn probing_only(self, ops: &[tracer_common::LockOp]) -> Prepared {
        Prepared {
            placed: self
                .placed
                .into_iter()
                .filter(|(function, _)| ops.contains(&function.op))
                .collect(),
            ..self
        }
    }
}

/// PHP's engine in `target` and the kernel's thread-pointer offset; an
/// error (one line, what to do) when either is missing (`--php`).
pub fn php_runtime(target: &Target) -> Result<PhpRuntime> {
    let mut runtime = naming::php::resolve(target)?;
    runtime.offsets.task_fsbase = btf::task_fsbase_offset()
        .map_err(|error| anyhow::anyhow!("--php needs the kernel's BTF: {error}"))?;
    Ok(runtime)
}

/// Preflight checks, the target, its lock functions and their probe points.
pub fn prepare(pid: u32, mode: Mode, placement: Placement, hold_times: bool) -> Result<Prepared> {
    preflight::check_privileges()?;
    let target = Target::open(pid)?;
    if let Some(thread) = target.given_thread {
        note(format_args!(
            "locktrace: {thread} is a thread of process {}; tracing the process",
            target.pid
        ));
    }
    preflight::check_uprobes()?;
    preflight::ensure_tracefs()?;
    let (target, functions) = with_lock_functions(target, mode)?;
    let placed = placement::place_all(&functions, placement, |module| {
        target.module_file(module).ok()
    });
    let waits = waitfuncs::find(&target);
    let unlocks = if hold_times {
        let found = lockfuncs::find_unlocks(&target)?;
        placement::place_all(&found, placement, |module| target.module_file(module).ok())
    } else {
        Vec::new()
    };
    let lock_code = naming::lock_code::ranges(&target, &functions);
    Ok(Prepared {
        target,
        functions,
        placed,
        waits,
        unlocks,
        lock_code,
    })
}

/// How long a target still in its dynamic loader is waited for.
const STILL_STARTING_WAIT: Duration = Duration::from_secs(10);

/// The target and its lock functions. A process still in its dynamic
/// loader (its libraries not mapped yet) is looked at again every 100 ms
/// for up to [`STILL_STARTING_WAIT`]; contention mode needs no lock
/// functions (futex-only programs too).
fn with_lock_functions(mut target: Target, mode: Mode) -> Result<(Target, Vec<LockFunction>)> {
    let pid = target.pid;
    let deadline = Instant::now() + STILL_STARTING_WAIT;
    let mut said = false;
    loop {
        let error = match lockfuncs::find(&target) {
            Ok(found) => return Ok((target, found)),
            Err(_) if mode == Mode::Contention => return Ok((target, Vec::new())),
            Err(error) => error,
        };
        let starting = matches!(
            error.downcast_ref::<LockFunctionsMissing>(),
            Some(LockFunctionsMissing::StillStarting { .. })
        );
        if !starting || Instant::now() >= deadline {
            return Err(error);
        }
        if !said {
            note(format_args!(
                "locktrace: process {pid} is still starting (in its dynamic loader); waiting up to {} s for its libraries",
                STILL_STARTING_WAIT.as_secs()
            ));
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
        target = Target::open(pid)?;
    }
}
