//! The comparison as text: the table of both sides' per-request figures,
//! the time, CPU and predicted-saving lines, and the call paths that changed.
use std::{collections::BTreeSet, fmt::Write};

use super::{
    identity::LockIdentity,
    side::{Group, Side},
};
use crate::render::{
    fit::{Column, Width, fit},
    format::{duration, ratio},
};

pub(super) fn render(before: &Side, after: &Side, width: Width) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "locktrace compare: before {} ({} requests), after {} ({} requests); per request",
        before.path.display(),
        before.requests,
        after.path.display(),
        after.requests
    );
    let mut identities: Vec<&LockIdentity> =
        before.groups.keys().chain(after.groups.keys()).collect();
    identities.sort();
    identities.dedup();
    // Biggest first, by the larger of the two sides.
    identities.sort_by(|a, b| {
        let size = |id: &LockIdentity| {
            let b = before
                .groups
                .get(id)
                .map_or(0.0, |g| before.per_request(g.acquisitions));
            let a = after
                .groups
                .get(id)
                .map_or(0.0, |g| after.per_request(g.acquisitions));
            a.max(b)
        };
        size(b).total_cmp(&size(a)).then_with(|| a.cmp(b))
    });
    let columns = [
        Column::name("lock"),
        Column::number("locks", 40),
        Column::number("before", 100),
        Column::number("after", 100),
        Column::number("change", 80),
        Column::number("contended before", 30),
        Column::number("contended after", 30),
        Column::label("status", 90),
    ];
    let rows: Vec<Vec<String>> = identities
        .into_iter()
        .map(|identity| compare_row(before, after, identity))
        .collect();
    let table = fit(&columns, &rows, width);
    out.push_str(&table.text);
    out.push_str(&table.note(width).unwrap_or_default());
    out.push_str(&render_cpu_changes(before, after, width));
    out.push_str(&render_time_changes(
        before,
        after,
        "held per request",
        |g| g.hold_ns,
        width,
    ));
    out.push_str(&render_time_changes(
        before,
        after,
        "handoff cost per request",
        |g| g.handoff_cost_ns,
        width,
    ));
    out.push_str(&render_time_changes(
        before,
        after,
        "kernel lock wait per request",
        |g| g.kernel_wait_ns,
        width,
    ));
    let total = |side: &Side| {
        let value = ratio(
            side.per_request(
                side.groups
                    .values()
                    .map(|g| g.acquisitions)
                    .fold(0u64, u64::saturating_add),
            ),
        );
        match side.sampled_windows {
            _ if !side.counts_acquisitions() => "not counted".to_string(),
            Some(_) => format!("~{value}"),
            None => value,
        }
    };
    let _ = writeln!(
        out,
        "all locks: {} -> {} acquisitions per request",
        total(before),
        total(after)
    );
    out
}

/// Locks and call paths the stack section shows at most (`--paths-of`
/// sets the locks).
pub(super) const PATH_LOCKS: usize = 3;
pub(super) const PATHS_PER_LOCK: usize = 5;

/// `--stacks` on both sides: the call paths of the locks whose
/// acquisitions per request changed most, each path's lock calls per
/// request before and after (the paths that changed most first).
pub(super) fn render_path_changes(before: &Side, after: &Side, path_locks: usize) -> String {
    let mut locks: Vec<(&LockIdentity, &Group, &Group)> = before
        .groups
        .iter()
        .filter_map(|(identity, old)| {
            let new = after.groups.get(identity)?;
            (!old.paths.is_empty() && !new.paths.is_empty()).then_some((identity, old, new))
        })
        .collect();
    if locks.is_empty() || path_locks == 0 {
        return String::new();
    }
    let per_request = |side: &Side, group: &Group| side.per_request(group.acquisitions);
    // Biggest change first, then the bigger lock.
    let rank = |(_, old, new): &(&LockIdentity, &Group, &Group)| {
        let (b, a) = (per_request(before, old), per_request(after, new));
        ((a - b).abs(), a.max(b))
    };
    locks.sort_by(|x, y| {
        let ((dx, sx), (dy, sy)) = (rank(x), rank(y));
        dy.total_cmp(&dx)
            .then(sy.total_cmp(&sx))
            .then_with(|| x.0.cmp(y.0))
    });
    let mut out = format!(
        "\ncall paths (lock calls per request, outermost;…;innermost):\n{:>10} {:>10} {:>10}  path\n",
        "before", "after", "change"
    );
    for (identity, old, new) in locks.iter().take(path_locks) {
        let _ = writeln!(
            out,
            "{identity}: {} -> {} per request",
            ratio(per_request(before, old)),
            ratio(per_request(after, new))
        );
        out.push_str(&path_lines(before, old, after, new));
    }
    if locks.len() > path_locks {
        let _ = writeln!(
            out,
            "{} with stacks on both sides (--paths-of N)",
            more(locks.len() - path_locks, "lock")
        );
    }
    out
}

/// `… 1 more path`, `… 2 more paths`.
pub(super) fn more(count: usize, noun: &str) -> String {
    match count {
        1 => format!("… 1 more {noun}"),
        _ => format!("… {count} more {noun}s"),
    }
}

/// One lock's call paths, those that changed most first, at most
/// [`PATHS_PER_LOCK`]; a path on one side only is marked.
pub(super) fn path_lines(before: &Side, old: &Group, after: &Side, new: &Group) -> String {
    let mut paths: Vec<(&String, Option<f64>, Option<f64>)> = old
        .paths
        .keys()
        .chain(new.paths.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|path| {
            let b = old.paths.get(path).map(|&n| before.per_request(n));
            let a = new.paths.get(path).map(|&n| after.per_request(n));
            (path, b, a)
        })
        .collect();
    let size = |b: Option<f64>, a: Option<f64>| {
        let (b, a) = (b.unwrap_or(0.0), a.unwrap_or(0.0));
        ((a - b).abs(), a.max(b))
    };
    paths.sort_by(|x, y| {
        let ((dx, sx), (dy, sy)) = (size(x.1, x.2), size(y.1, y.2));
        dy.total_cmp(&dx)
            .then(sy.total_cmp(&sx))
            .then_with(|| x.0.cmp(y.0))
    });
    let mut out = String::new();
    let shown = |v: Option<f64>| v.map_or("-".to_string(), ratio);
    for (path, b, a) in paths.iter().take(PATHS_PER_LOCK) {
        let change = b.unwrap_or(0.0);
        let change = a.unwrap_or(0.0) - change;
        let mark = match (b, a) {
            (None, Some(_)) => "(appeared) ",
            (Some(_), None) => "(disappeared) ",
            _ => "",
        };
        let _ = writeln!(
            out,
            "{:>10} {:>10} {:>10}  {mark}{path}",
            shown(*b),
            shown(*a),
            format!("{}{}", sign(change), ratio(change))
        );
    }
    if paths.len() > PATHS_PER_LOCK {
        let _ = writeln!(out, "  {}", more(paths.len() - PATHS_PER_LOCK, "path"));
    }
    out
}

/// `before -> after (change%)` of two times per request.
pub(super) fn time_change(before: Option<f64>, after: Option<f64>) -> String {
    let shown = |ns: Option<f64>| {
        ns.map_or("-".to_string(), |ns| {
            crate::render::format::duration(ns.round() as u64)
        })
    };
    let change = match (before, after) {
        (Some(b), Some(a)) if b > 0.0 => format!(" ({:+.0}%)", (a - b) / b * 100.0),
        _ => String::new(),
    };
    format!("{} -> {}{change}", shown(before), shown(after))
}

/// One identity's row: per-request figures on both sides and the change.
pub(super) fn compare_row(before: &Side, after: &Side, identity: &LockIdentity) -> Vec<String> {
    let old = before.groups.get(identity);
    let new = after.groups.get(identity);
    let acquisitions =
        |side: &Side, group: Option<&Group>| group.map(|g| side.per_request(g.acquisitions));
    let contended =
        |side: &Side, group: Option<&Group>| group.map(|g| side.per_request(g.contended));
    let (b, a) = (acquisitions(before, old), acquisitions(after, new));
    let bounds =
        old.map_or(0.0, |g| g.per_request_error) + new.map_or(0.0, |g| g.per_request_error);
    let change = match (b, a) {
        _ if !before.counts_acquisitions() => String::new(),
        (Some(b), Some(a)) if bounds > 0.0 && (a - b).abs() <= bounds => {
            "within the bounds".to_string()
        }
        (Some(b), Some(a)) if b > 0.0 => {
            format!(
                "{}{} ({:+.0}%)",
                sign(a - b),
                ratio(a - b),
                (a - b) / b * 100.0
            )
        }
        (Some(b), Some(a)) => format!("{}{}", sign(a - b), ratio(a - b)),
        _ => String::new(),
    };
    let mark = match (old, new) {
        // Contention mode lists a lock only when it was waited on.
        (Some(_), None) if !after.counts_acquisitions() => "no waits after",
        (None, Some(_)) if !before.counts_acquisitions() => "no waits before",
        (Some(_), None) if after.sampled_windows.is_some() => "not seen after (sampled)",
        (None, Some(_)) if before.sampled_windows.is_some() => "not seen before (sampled)",
        (Some(_), None) => "disappeared",
        (None, Some(_)) => "appeared",
        _ => "",
    };
    let count = format!(
        "{}/{}",
        old.map_or(0, |g| g.locks),
        new.map_or(0, |g| g.locks)
    );
    let shown = |v: Option<f64>| v.map_or("-".to_string(), ratio);
    let acquired = |side: &Side, group: Option<&Group>| match group {
        _ if !side.counts_acquisitions() => "not counted".to_string(),
        Some(group) => side.shown(group),
        None => "-".to_string(),
    };
    vec![
        identity.to_string(),
        count,
        acquired(before, old),
        acquired(after, new),
        change,
        shown(contended(before, old)),
        shown(contended(after, new)),
        mark.to_string(),
    ]
}

/// A time per request (`field` of a group: hold time, CPU) of the locks
/// where either side recorded it and it is not zero on both, and its
/// change: a table under the main one.
pub(super) fn render_time_changes(
    before: &Side,
    after: &Side,
    title: &'static str,
    field: fn(&Group) -> Option<u64>,
    width: Width,
) -> String {
    let mut identities: Vec<&LockIdentity> = before
        .groups
        .iter()
        .chain(&after.groups)
        .filter(|(_, group)| field(group).is_some_and(|ns| ns > 0))
        .map(|(identity, _)| identity)
        .collect();
    identities.sort();
    identities.dedup();
    if identities.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = identities
        .into_iter()
        .map(|identity| {
            let time = |side: &Side| {
                side.groups
                    .get(identity)
                    .and_then(field)
                    .map(|ns| side.per_request(ns))
            };
            let shown =
                |ns: Option<f64>| ns.map_or("-".to_string(), |ns| duration(ns.round() as u64));
            let (b, a) = (time(before), time(after));
            let change = match (b, a) {
                (Some(b), Some(a)) if b > 0.0 => format!("{:+.0}%", (a - b) / b * 100.0),
                _ => String::new(),
            };
            vec![identity.to_string(), shown(b), shown(a), change]
        })
        .collect();
    let columns = [
        Column::name(title),
        Column::number("before", 100),
        Column::number("after", 100),
        Column::number("change", 80),
    ];
    let table = fit(&columns, &rows, width);
    format!("\n{}{}", table.text, table.note(width).unwrap_or_default())
}

/// The target's CPU per request before and after, then each lock's.
pub(super) fn render_cpu_changes(before: &Side, after: &Side, width: Width) -> String {
    let target = |side: &Side| side.target_cpu_ns.map(|ns| side.per_request(ns));
    if target(before).is_none() && target(after).is_none() {
        return String::new();
    }
    format!(
        "cpu per request: target {}\n{}{}",
        time_change(target(before), target(after)),
        render_time_changes(before, after, "cpu per request", |g| g.cpu_ns, width),
        render_predicted_saving(before, after, width)
    )
}

/// What the locks' removal prices predicted the change to save, per lock
/// and in all, beside the target's measured CPU change.
pub(super) fn render_predicted_saving(before: &Side, after: &Side, width: Width) -> String {
    let total = |side: &Side, field: fn(&Group) -> Option<u64>| {
        side.groups
            .values()
            .filter(|group| group.is_lock)
            .filter_map(field)
            .fold(None, |sum: Option<f64>, ns| {
                Some(sum.unwrap_or(0.0) + side.per_request(ns))
            })
    };
    let (Some(price_before), price_after) = (
        total(before, |g| g.saving_ns),
        total(after, |g| g.saving_ns).unwrap_or(0.0),
    ) else {
        return String::new();
    };
    let bound = total(before, |g| g.saving_error_ns).unwrap_or(0.0)
        + total(after, |g| g.saving_error_ns).unwrap_or(0.0);
    let predicted = price_before - price_after;
    // The tracer's probes cost the target CPU too, more where there are more
    // lock calls: its estimated share is not the program's.
    let untraced = |side: &Side| {
        side.target_cpu_ns
            .map(|ns| side.per_request(ns.saturating_sub(side.tracer_cpu_ns)))
    };
    // With lock probes the share is an estimate (hits × a calibrated cost):
    // one that big swamps a lock's few ns per call. Contention mode's is
    // measured (what the sampler could not see while the probes ran).
    let tracer_share = |side: &Side| match side.target_cpu_ns {
        _ if !side.counts_acquisitions() => 0.0,
        Some(ns) if ns > 0 => side.tracer_cpu_ns as f64 / ns as f64,
        _ => 1.0,
    };
    let share = tracer_share(before).max(tracer_share(after));
    let measured = match (untraced(before), untraced(after)) {
        (Some(_), Some(_)) if share > MAX_TRACER_SHARE => format!(
            "; measured: not comparable, the tracer took {:.0}% of the target's CPU (record both in contention mode)",
            share * 100.0
        ),
        (Some(b), Some(a)) => format!(
            "; measured: the target's CPU per request less the tracer's share fell by {}",
            signed_duration(b - a)
        ),
        _ => String::new(),
    };
    format!(
        "{}predicted saving: the locks' price fell by {} ±{} CPU per request{measured}\n",
        render_time_changes(
            before,
            after,
            "removal saving per request",
            |g| g.saving_ns,
            width
        ),
        signed_duration(predicted),
        duration(bound.round() as u64)
    )
}

/// Above this share of the target's CPU, the lock probes' estimated cost
/// is too uncertain to take out of a measured CPU change.
pub(super) const MAX_TRACER_SHARE: f64 = 0.05;

/// A duration that may be negative (`-1.2 µs`).
pub(super) fn signed_duration(ns: f64) -> String {
    let shown = duration(ns.abs().round() as u64);
    if ns < 0.0 { format!("-{shown}") } else { shown }
}

/// `+` for a rise or no change (ratio prints the `-` itself).
pub(super) fn sign(delta: f64) -> &'static str {
    if delta >= 0.0 { "+" } else { "" }
}
