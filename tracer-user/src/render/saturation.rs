//! The table's saturation lines: locks held more than
//! [`SATURATION_NOTE_AT`] of the time, and what the queueing model says.
use std::fmt::Write;

use super::format::{self, duration};
use crate::model::{Report, SATURATION_NOTE_AT, Saturation};

/// One line per lock above the note's utilization, most utilized first.
pub(crate) fn render(report: &Report) -> String {
    let mut busy: Vec<_> = report
        .locks
        .iter()
        .filter_map(|lock| Some((lock, lock.saturation.as_ref()?)))
        .filter(|(_, saturation)| saturation.utilization > SATURATION_NOTE_AT)
        .collect();
    busy.sort_by(|a, b| b.1.utilization.total_cmp(&a.1.utilization));
    let mut out = String::new();
    for (lock, saturation) in busy {
        let _ = writeln!(
            out,
            "saturation: {} held {:.0}% of the time ({}); {}",
            format::label(lock),
            saturation.utilization * 100.0,
            saturation.model,
            consequence(saturation)
        );
    }
    out
}

/// What the utilization implies: the headroom and the model's wait.
fn consequence(saturation: &Saturation) -> String {
    let Some(wait) = saturation.predicted_wait_ns else {
        return "saturated: the waits grow as long as the load lasts".into();
    };
    let headroom = match saturation.saturating_requests_per_s {
        Some(rate) => format!("held all the time at {rate:.0} requests/s"),
        None => format!(
            "held all the time at {:.0} acquisitions/s",
            saturation.saturating_holds_per_s
        ),
    };
    format!(
        "{headroom} ({:.1}x the current rate); predicted wait {} per acquisition now (measured {})",
        1.0 / saturation.utilization,
        duration(wait.round() as u64),
        duration(saturation.measured_wait_ns.round() as u64)
    )
}
