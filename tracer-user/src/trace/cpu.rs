//! The CPU side of tracing: the target's CPU clock (the kernel's scheduler
//! accounting of the whole process, exited threads included), and the
//! sampler, a perf event program on a software cpu-clock event per CPU.
use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf,
    maps::Array,
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use nix::{sys::time::TimeValLike, time::ClockId, unistd::Pid};
use tracer_common::{CodeRange, names};

/// Default samples per CPU second. The timer interrupts, not the program,
/// are the cost, and they land on every CPU, busy or idle: at 999 Hz they
/// cost the real FrankenPHP 1-4 % of its throughput (perf's own sampler
/// toggled every other second, docs/benchmarks.md), at 99 Hz nothing
/// measurable. 99 Hz gives a CPU figure a third as tight (its bound is
/// stated); `--cpu-hz 999` when that is worth the cost.
pub(crate) const DEFAULT_CPU_HZ: u64 = 99;
/// Most `--cpu-hz`: beyond this the timer interrupts cost more than they tell.
pub(crate) const MAX_CPU_HZ: u64 = 20_000;

/// What the sampler needs: its rate and where the lock code is.
#[derive(Debug, Clone)]
pub struct CpuSampling {
    pub hz: u64,
    pub lock_code: Vec<CodeRange>,
}

/// The target's process CPU clock (`clock_getcpuclockid`): user + system
/// time of all its threads, the exited ones included, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TargetClock {
    clock: ClockId,
    /// The last reading, kept for when the target has exited by the end.
    last_ns: Option<u64>,
}

impl TargetClock {
    pub(crate) fn open(pid: u32) -> Option<TargetClock> {
        let clock = ClockId::pid_cpu_clock_id(Pid::from_raw(pid as i32)).ok()?;
        Some(TargetClock {
            clock,
            last_ns: None,
        })
    }

    /// Reads the clock now (None once the target is gone); remembers it.
    pub(crate) fn read(&mut self) -> Option<u64> {
        let now = self.clock.now().ok()?.num_nanoseconds().max(0) as u64;
        self.last_ns = Some(now);
        Some(now)
    }

    /// The latest reading: now if the target lives, else the last one taken.
    pub(crate) fn latest(&mut self) -> Option<u64> {
        self.read().or(self.last_ns)
    }
}

/// Fills the lock-code ranges, loads `cpu_sample` and attaches it to a
/// cpu-clock event on every online CPU, one sample per `1e9 / hz` ns of CPU.
/// Takes the CPU sampler off every CPU it was attached to.
pub(crate) fn detach_sampler(ebpf: &mut Ebpf) {
    let program: Option<&mut PerfEvent> = ebpf
        .program_mut(names::PROGRAM_CPU_SAMPLE)
        .and_then(|program| program.try_into().ok());
    if let Some(program) = program {
        let _ = program.unload();
    }
}

/// Fills a lock-code map, `LOCK_CODE` or `CPU_LOCK_CODE` (`[start, end)`
/// each: `[u64; 2]` and [`CodeRange`] are the same 16 bytes), with the
/// ranges `probe::lockfuncs::code_ranges` made for it.
pub(crate) fn store_code_ranges(ebpf: &mut Ebpf, map: &str, ranges: &[CodeRange]) -> Result<()> {
    let mut array: Array<_, CodeRange> = Array::try_from(
        ebpf.map_mut(map)
            .ok_or_else(|| anyhow!("BPF object lacks map {map}"))?,
    )?;
    for (index, range) in ranges.iter().enumerate() {
        array
            .set(index as u32, *range, 0)
            .with_context(|| format!("filling the lock-code ranges of {map}"))?;
    }
    Ok(())
}

/// Set in the environment, the sampler is refused as an old kernel would
/// (the tests' stand-in for Linux 5.10, where the kernel refuses it).
pub(crate) const REFUSE_FOR_A_TEST: &str = "LOCKTRACE_TEST_REFUSE_CPU_SAMPLER";

pub(crate) fn attach_sampler(ebpf: &mut Ebpf, sampling: &CpuSampling) -> Result<()> {
    if std::env::var_os(REFUSE_FOR_A_TEST).is_some() {
        anyhow::bail!("refused for a test ({REFUSE_FOR_A_TEST} is set)");
    }
    store_code_ranges(ebpf, names::MAP_CPU_LOCK_CODE, &sampling.lock_code)?;
    let program: &mut PerfEvent = ebpf
        .program_mut(names::PROGRAM_CPU_SAMPLE)
        .ok_or_else(|| anyhow!("BPF object lacks program {}", names::PROGRAM_CPU_SAMPLE))?
        .try_into()?;
    program
        .load()
        .context("the kernel refused the CPU sampler (a perf event BPF program)")?;
    let cpus = aya::util::online_cpus()
        .map_err(|(_, error)| anyhow!("reading the online CPUs: {error}"))?;
    let period_ns = crate::model::sample_period_ns(sampling.hz);
    for cpu in cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(period_ns),
                false,
            )
            .map_err(|error| {
                anyhow!(
                    "attaching the CPU sampler on CPU {cpu} failed ({error}); record with --no-cpu to go without CPU per lock"
                )
            })?;
    }
    Ok(())
}
