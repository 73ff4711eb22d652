//! `compare`'s kernel locks section: each kernel lock (by name and kind,
//! the rows of one name summed: the runqueue lock of every CPU) per
//! request before and after. Kernel addresses change with every boot, so
//! unnamed rows add up per kind as `unnamed`. Shown when either side
//! traced kernel locks; a side whose kernel had no tracepoints says so.
use std::{collections::BTreeMap, fmt::Write};

use super::side::{Figures, KernelSide, Side};
use crate::{
    model::KernelLockKind,
    render::{
        fit::{Column, Width, fit},
        format::{duration, ratio},
    },
};

/// The section, or nothing when neither side traced kernel locks.
pub(super) fn render(before: &Side, after: &Side, width: Width) -> String {
    let (old, new) = (before.kernel_locks.as_ref(), after.kernel_locks.as_ref());
    if old.is_none() && new.is_none() {
        return String::new();
    }
    let mut out = String::from("\nkernel locks (per request, before -> after):\n");
    for (side, which) in [(old, "before"), (new, "after")] {
        match side {
            None => {
                let _ = writeln!(
                    out,
                    "  {which}: not traced (a report from before kernel locks)"
                );
            }
            Some(KernelSide {
                unavailable: Some(reason),
                ..
            }) => {
                let _ = writeln!(out, "  {which}: unavailable: {reason}");
            }
            Some(_) => {}
        }
    }
    let empty = BTreeMap::new();
    let old_locks = old.map_or(&empty, |side| &side.locks);
    let new_locks = new.map_or(&empty, |side| &side.locks);
    let mut keys: Vec<&(String, KernelLockKind)> =
        old_locks.keys().chain(new_locks.keys()).collect();
    keys.sort();
    keys.dedup();
    // Most wait first, by the larger side.
    let wait = |key: &(String, KernelLockKind)| {
        let of = |side: &Side, locks: &BTreeMap<_, (u64, u64)>| {
            locks.get(key).map_or(0.0, |&(_, ns)| side.per_request(ns))
        };
        of(before, old_locks).max(of(after, new_locks))
    };
    keys.sort_by(|a, b| wait(b).total_cmp(&wait(a)).then_with(|| a.cmp(b)));
    if keys.is_empty() {
        out.push_str("  no kernel lock contention on either side\n");
        return out;
    }
    let rows: Vec<Vec<String>> = keys
        .into_iter()
        .map(|key| row(before, after, key, (old_locks.get(key), new_locks.get(key))))
        .collect();
    let columns = [
        Column::name("kernel lock"),
        Column::number("contentions before", 100),
        Column::number("contentions after", 100),
        Column::number("wait before", 90),
        Column::number("wait after", 90),
        Column::number("change", 80),
    ];
    let table = fit(&columns, &rows, width);
    out.push_str(&table.text);
    out.push_str(&table.note(width).unwrap_or_default());
    out
}

/// `mmap_lock (rwsem write)`, contentions and wait per request on both
/// sides (`-`: not on that side), and the wait's change.
fn row(
    before: &Side,
    after: &Side,
    (name, kind): &(String, KernelLockKind),
    (old, new): (Option<&Figures>, Option<&Figures>),
) -> Vec<String> {
    let contentions = |side: &Side, figures: Option<&Figures>| {
        figures.map_or("-".to_string(), |&(n, _)| ratio(side.per_request(n)))
    };
    let wait =
        |side: &Side, figures: Option<&(u64, u64)>| figures.map(|&(_, ns)| side.per_request(ns));
    let shown = |ns: Option<f64>| ns.map_or("-".to_string(), |ns| duration(ns.round() as u64));
    let change = match (wait(before, old), wait(after, new)) {
        (Some(b), Some(a)) if b > 0.0 => format!("{:+.0}%", (a - b) / b * 100.0),
        (Some(_), None) => "gone".into(),
        (None, Some(_)) => "new".into(),
        _ => String::new(),
    };
    vec![
        format!("{name} ({})", kind.word()),
        contentions(before, old),
        contentions(after, new),
        shown(wait(before, old)),
        shown(wait(after, new)),
        change,
    ]
}
