//! The one report builder of `record` and the live views (`top`, `serve`):
//! the header from the target ([`RecordInfo::of`]), the counts to locks,
//! totals, hold times ([`ReportBuilder::counts`]), the probes' cost
//! ([`Probes::overhead`]), and for a whole recording what recording
//! measured besides: estimate, target CPU, kernel limits, coverage,
//! requests and bounds ([`ReportBuilder::recording`]). Names are the
//! callers' (a layer up).
use crate::{
    analysis::{self, build::RecordInfo},
    model::{
        Collected, Coverage, Estimate, Mode, Overhead, Placement, PlacementFallback, Report,
        Requests, SampledRun, StopReason, TargetInfo,
    },
    probe::{lockfuncs::LockFunction, placement::Placed, target::Target},
};

impl RecordInfo {
    /// The header of a report on `target`.
    pub(crate) fn of(
        target: &Target,
        mode: Mode,
        placement: Option<Placement>,
        duration_s: f64,
        stopped_by: StopReason,
    ) -> RecordInfo {
        RecordInfo {
            target: TargetInfo {
                pid: target.pid,
                exe: target.exe.clone(),
                cmdline: target.cmdline.clone(),
            },
            duration_s,
            mode,
            placement,
            stopped_by,
        }
    }
}

/// The probes whose hits the tracing cost is made of.
#[derive(Clone, Copy)]
pub(crate) struct Probes<'a> {
    pub mode: Mode,
    /// The lock functions' probe points (not hit in contention mode).
    pub placed: &'a [Placed],
    /// The request probe's kind, if there is one (emulated or single-stepped).
    pub request_probe_emulated: Option<bool>,
    pub attach_ms: u64,
}

impl Probes<'_> {
    /// What the probes cost, on the counts of `collected`.
    pub(crate) fn overhead(&self, collected: &Collected) -> Overhead {
        analysis::cost::measure(
            collected,
            self.counted(),
            self.request_probe_emulated,
            self.attach_ms,
        )
    }

    /// The lock probes that count: none in contention mode.
    pub(crate) fn counted(&self) -> &[Placed] {
        match self.mode {
            Mode::Contention => &[],
            // Inproc: the functions no stub counts (`record` keeps only those).
            Mode::All | Mode::Sampled | Mode::Inproc => self.placed,
        }
    }
}

/// What a whole recording measured besides the counts.
pub(crate) struct Measured<'a> {
    pub probes: Probes<'a>,
    /// `--hold-times`: the unlock functions' probe points.
    pub unlocks: &'a [Placed],
    /// Sampled mode: the sampler's run and its rate.
    pub sampled: Option<(&'a SampledRun, f64)>,
    /// The target's CPU time over the window.
    pub target_cpu_ns: Option<u64>,
    /// Why the CPU sampler was off although asked for.
    pub cpu_off: Option<String>,
    pub placement_fallbacks: Vec<PlacementFallback>,
    pub kernel_limits: Vec<String>,
    pub coverage: Coverage,
}

/// Builds reports from collected counts and the lock functions probed.
pub(crate) struct ReportBuilder<'a> {
    pub info: RecordInfo,
    pub functions: &'a [LockFunction],
}

impl ReportBuilder<'_> {
    /// The locks, totals, waits in progress and CPU per lock of the counts,
    /// with hold times when recorded: what every view starts from.
    pub(crate) fn counts(&self, collected: &Collected) -> Report {
        let mut report = analysis::build::build(self.info.clone(), collected, self.functions);
        analysis::holds::apply(&mut report, collected);
        analysis::handoffs::apply(&mut report, collected, analysis::cost::handoff_cost_ns());
        report
    }

    /// A whole recording's report (before naming): the counts, scaled in
    /// sampled mode, with what recording measured. `requests` gives the
    /// request figures once the locks are built (the count may depend on
    /// the counts: a request probe's hits).
    pub(crate) fn recording(
        &self,
        collected: &mut Collected,
        measured: Measured,
        requests: impl FnOnce(&Report, &Collected) -> Option<Requests>,
    ) -> Report {
        let (overhead, estimate) = cost_and_estimate(&measured, collected);
        let mut report = self.counts(collected);
        report.placement_fallbacks = measured.placement_fallbacks;
        report.estimate = estimate;
        add_target_cpu(
            &mut report,
            collected,
            measured.target_cpu_ns,
            overhead.estimated_added_ns,
        );
        report.kernel_limits = measured.kernel_limits;
        add_kernel_locks(&mut report, collected);
        if let Some(cpu) = &mut report.cpu {
            cpu.sampler_off = measured.cpu_off;
        }
        report.overhead = Some(overhead);
        report.coverage = Some(measured.coverage);
        if let Some(requests) = requests(&report, collected) {
            analysis::per_request::apply(&mut report, requests);
        }
        analysis::estimate::bound(&mut report);
        analysis::saturation::apply(&mut report);
        analysis::removal::apply(&mut report, analysis::cost::unit_costs());
        report
    }
}

/// The probes' cost, and in sampled mode the estimate the counts are then
/// scaled by (the cost is measured on the counts as counted).
fn cost_and_estimate(
    measured: &Measured,
    collected: &mut Collected,
) -> (Overhead, Option<Estimate>) {
    let mut overhead = measured.probes.overhead(collected);
    let estimate: Option<Estimate> = measured.sampled.map(|(run, rate)| {
        let cost_per_hit = analysis::cost::lock_cost_per_hit(collected, measured.probes.placed);
        let mut estimate = analysis::estimate::of_run(run, rate, cost_per_hit);
        analysis::estimate::scale_by_requests(
            &mut estimate,
            collected.requests,
            collected.requests_whole_recording,
        );
        estimate
    });
    analysis::cost::add_unlock_overhead(&mut overhead, collected.unlock_hits, measured.unlocks);
    if let Some(estimate) = &estimate {
        analysis::estimate::scale(collected, estimate);
    }
    (overhead, estimate)
}

/// The target's CPU time and the tracer's share of it, added to the CPU
/// per lock (or a CPU section of its own when the sampler was off).
fn add_target_cpu(
    report: &mut Report,
    collected: &Collected,
    target_cpu_ns: Option<u64>,
    estimated_added_ns: u64,
) {
    if let Some(cpu) = &mut report.cpu {
        cpu.target_ns = target_cpu_ns;
        cpu.unsampled_ns = target_cpu_ns.map(|target| {
            target.saturating_sub(cpu.samples * crate::model::sample_period_ns(cpu.sample_hz))
        });
        // The probes' estimated cost (uprobe traps included) or what the
        // sampler could not see (the BPF programs, tracepoints included).
        cpu.tracer_ns = estimated_added_ns.max(cpu.unsampled_ns.unwrap_or(0));
    } else {
        report.cpu = Some(analysis::cpu::report(
            collected,
            &report.locks,
            target_cpu_ns,
            estimated_added_ns,
            0,
        ));
    }
}

/// The kernel locks section, named with the kernel's symbols (read only
/// when there is contention to name).
fn add_kernel_locks(report: &mut Report, collected: &Collected) {
    let contended = collected
        .kernel_locks
        .as_ref()
        .is_some_and(|traced| !traced.counts.is_empty());
    let symbols = if contended {
        crate::probe::kallsyms::Kallsyms::read()
    } else {
        crate::probe::kallsyms::Kallsyms::default()
    };
    analysis::kernel_locks::apply(report, collected, &symbols);
}
