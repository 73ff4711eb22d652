//! `locktrace compare BEFORE.json AFTER.json`: per-request lock figures of
//! two recordings side by side, matched by an identity that survives a
//! restart (never the address), plus CI assertions.
//!
//! Identity, first that exists: the lock's `name` (symbol, pointer chain,
//! or creation site: `mutex created in f <- g <- h`), else the set of its caller functions (`callers[].function`), else
//! `unidentified KIND`. A lock also answers to its other names (its
//! `offset_name`, its alternative routes), so a report from before field
//! names (`*g_stats->+0x20`) still matches one with them
//! (`*g_stats->LOCK_access`), and names spelled before C notation
//! (`g_stats->+0x20->`) are read as C writes them. Locks with the
//! same identity (e.g. one mutex per connection, all taken by the same
//! function) are one row, their figures summed: a row grouped by creation
//! site and the per-address rows of the same site match, and `locks` counts
//! the addresses either stands for.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, anyhow, bail};
use identity::{Identified, LockIdentity};

use crate::{
    model::{Lock, LockKind, LockStack, Mode, Report},
    naming::chain::c_notation,
    render::{
        Sink,
        fit::{Column, Width, fit},
        format::{duration, ratio},
        output,
        pprof::is_lock_call,
        stacks::folded_path,
    },
};

mod identity;
mod routes;

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// Report recorded before the change (with a request count).
    before: PathBuf,
    /// Report recorded after the change.
    after: PathBuf,
    /// Fail (exit 1) if a lock matching SELECTOR is still taken after; repeatable.
    /// A selector matches a lock whose name or one of whose caller functions contains it.
    #[arg(long, value_name = "SELECTOR")]
    assert_gone: Vec<String>,
    /// Fail (exit 1) if a lock matching SELECTOR is taken more than N times per request after; repeatable.
    #[arg(long, value_name = "SELECTOR=N")]
    assert_max: Vec<String>,
    /// Print every column in full (by default the table fits the terminal, or 160 columns).
    #[arg(long)]
    wide: bool,
    /// Reports with `--stacks`: show the call paths of up to N locks, those
    /// whose acquisitions per request changed most (0: none).
    // At most a row per lock the lock map holds: only lock calls have paths.
    #[arg(
        long,
        value_name = "N",
        default_value_t = PATH_LOCKS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(0..=u64::from(tracer_common::MAX_LOCKS))
    )]
    paths_of: usize,
}

/// Locks of one identity in one report, summed.
#[derive(Debug, Clone, Default, PartialEq)]
struct Group {
    kind: Option<LockKind>,
    locks: usize,
    acquisitions: u64,
    contended: u64,
    wait_ns: u64,
    /// `--hold-times`: time held, where recorded.
    hold_ns: Option<u64>,
    /// Sampled CPU time in lock code, where CPU was sampled.
    cpu_ns: Option<u64>,
    /// What removing the locks would save (`removal`): CPU ns and bound.
    saving_ns: Option<u64>,
    saving_error_ns: Option<u64>,
    /// What the lock's handoffs between CPUs cost (`handoffs.cost_ns`), where counted.
    handoff_cost_ns: Option<u64>,
    /// Name and caller functions: what selectors search.
    labels: Vec<String>,
    /// Lock contention rows (not condvar, Go runtime or other futex words):
    /// the only ones assertions select.
    is_lock: bool,
    /// Other names of the same locks (offset notation, other routes).
    aliases: BTreeSet<String>,
    /// Sampled reports: the per-request bound of `acquisitions`, summed
    /// over the group's locks (each lock's own bound; a sum never understates).
    per_request_error: f64,
    /// `--stacks`: lock calls by call path (folded, outermost first).
    paths: BTreeMap<String, u64>,
}

/// Adds to an optional total, starting it at 0, never wrapping.
fn saturating_add_to(total: &mut Option<u64>, value: u64) {
    let total = total.get_or_insert(0);
    *total = total.saturating_add(value);
}

impl Group {
    fn absorb(&mut self, other: Group) {
        self.locks = self.locks.saturating_add(other.locks);
        self.acquisitions = self.acquisitions.saturating_add(other.acquisitions);
        self.contended = self.contended.saturating_add(other.contended);
        self.wait_ns = self.wait_ns.saturating_add(other.wait_ns);
        if let Some(held) = other.hold_ns {
            saturating_add_to(&mut self.hold_ns, held);
        }
        if let Some(cpu) = other.cpu_ns {
            saturating_add_to(&mut self.cpu_ns, cpu);
        }
        if let Some(saving) = other.saving_ns {
            saturating_add_to(&mut self.saving_ns, saving);
        }
        if let Some(error) = other.saving_error_ns {
            saturating_add_to(&mut self.saving_error_ns, error);
        }
        if let Some(cost) = other.handoff_cost_ns {
            saturating_add_to(&mut self.handoff_cost_ns, cost);
        }
        self.is_lock |= other.is_lock;
        self.labels.extend(other.labels);
        self.labels.sort();
        self.labels.dedup();
        self.aliases.extend(other.aliases);
        self.per_request_error += other.per_request_error;
        for (path, count) in other.paths {
            let total = self.paths.entry(path).or_default();
            *total = total.saturating_add(count);
        }
    }
}

/// The report's request count, which every per-request figure divides by.
fn request_count(report: &Report, path: &Path) -> Result<u64> {
    match &report.requests {
        Some(r) if r.refused.is_none() && r.count > 0 => Ok(r.count),
        Some(r) if r.refused.is_some() => bail!(
            "{} has no per-request figures: {}",
            path.display(),
            r.refused.as_deref().unwrap_or_default()
        ),
        _ => bail!(
            "{} has no request count; record it with --load URL, --request-probe MODULE:SYMBOL or --requests N",
            path.display()
        ),
    }
}

/// What identifies a lock across runs, and what selectors find it by.
struct LockNames<'r> {
    /// The name as the report spells it (never a bare address).
    spelled: Option<&'r str>,
    /// The name in C notation.
    name: Option<String>,
    /// Its caller functions, sorted, once each.
    callers: Vec<String>,
}

impl<'r> LockNames<'r> {
    fn of(lock: &'r Lock) -> LockNames<'r> {
        let spelled = lock
            .name
            .as_deref()
            // A bare address is no identity across runs.
            .filter(|n| !n.is_empty() && !n.starts_with("0x"));
        let mut callers: Vec<String> = lock
            .callers
            .iter()
            .filter_map(|c| c.function.clone())
            .collect();
        callers.sort();
        callers.dedup();
        LockNames {
            spelled,
            // Reports before C notation wrote `g_stats->+0x20->` for `*g_stats->+0x20`.
            name: spelled.map(c_notation),
            callers,
        }
    }

    /// The group's key: the name, else the callers, else the kind.
    fn identity(&self, lock: &Lock) -> LockIdentity {
        let by = match (&self.name, self.callers.is_empty()) {
            (Some(name), _) => Identified::Name(name.clone()),
            (None, false) => Identified::Callers {
                kind: lock.kind,
                functions: self.callers.clone(),
            },
            (None, true) => Identified::Unidentified(lock.kind),
        };
        // Like with like: a condvar or runtime word never matches a lock.
        LockIdentity {
            class: lock.wait_class,
            by,
        }
    }

    /// Other names of the lock (offset notation, other routes), in C notation.
    fn aliases(&self, lock: &Lock) -> Vec<String> {
        lock.offset_name
            .iter()
            .cloned()
            .chain(
                lock.alternatives
                    .iter()
                    .flat_map(|a| [a.name.clone(), a.offset_name.clone()]),
            )
            .map(|alias| c_notation(&alias))
            .filter(|alias| Some(alias) != self.name.as_ref())
            .collect()
    }
}

/// Adds a lock's figures, names and call paths to the group of its identity.
fn add_to_group(
    groups: &mut BTreeMap<LockIdentity, Group>,
    lock: &Lock,
    requests: u64,
    stacks: &[&LockStack],
) {
    let names = LockNames::of(lock);
    let group = groups.entry(names.identity(lock)).or_insert_with(|| Group {
        kind: Some(lock.kind),
        is_lock: lock.is_contention(),
        ..Group::default()
    });
    add_figures(group, lock, requests);
    let aliases = names.aliases(lock);
    // Selectors find a lock by its old spelling too.
    group.labels.extend(names.spelled.map(str::to_string));
    group.labels.extend(lock.offset_name.clone());
    group.labels.extend(names.name);
    group.labels.extend(names.callers);
    group.labels.extend(aliases.iter().cloned());
    group.aliases.extend(aliases);
    for stack in stacks {
        if is_lock_call(stack, lock) {
            let total = group.paths.entry(folded_path(stack)).or_default();
            *total = total.saturating_add(stack.count);
        }
    }
    group.labels.sort();
    group.labels.dedup();
}

/// Adds a lock's counts and times to its group.
fn add_figures(group: &mut Group, lock: &Lock, requests: u64) {
    // Saturating: a crafted report's counts near 2^64 must not wrap.
    // A row grouped by creation site stands for its addresses.
    let addresses = lock.group.as_ref().map_or(1, |g| g.addresses);
    group.locks = group
        .locks
        .saturating_add(usize::try_from(addresses).unwrap_or(usize::MAX));
    group.acquisitions = group
        .acquisitions
        .saturating_add(lock.acquisitions.unwrap_or(0));
    group.per_request_error += lock
        .per_request
        .as_ref()
        .and_then(|per| per.acquisitions_error)
        // Reports before per-request bounds: the lock's own bound.
        .or(lock.acquisitions_error.map(|e| e as f64 / requests as f64))
        .unwrap_or(0.0);
    group.contended = group.contended.saturating_add(lock.contended);
    group.wait_ns = group.wait_ns.saturating_add(lock.wait_ns);
    if let Some(holds) = &lock.holds {
        saturating_add_to(&mut group.hold_ns, holds.hold_ns);
    }
    if let Some(handoffs) = &lock.handoffs {
        saturating_add_to(&mut group.handoff_cost_ns, handoffs.cost_ns);
    }
    if let Some(cpu) = lock.cpu_ns {
        saturating_add_to(&mut group.cpu_ns, cpu);
    }
    if let Some(removal) = &lock.removal {
        // Non-negative and finite by construction; `as` saturates a crafted one.
        saturating_add_to(&mut group.saving_ns, removal.saving_ns.max(0.0) as u64);
        saturating_add_to(&mut group.saving_error_ns, removal.error_ns.max(0.0) as u64);
    }
}

struct Side {
    path: PathBuf,
    requests: u64,
    mode: Mode,
    /// Sampled reports: their windows (a lock never seen may have been missed).
    sampled_windows: Option<u32>,
    /// The target's CPU time over the window (`cpu.target_ns`), where measured.
    target_cpu_ns: Option<u64>,
    /// The tracer's estimated share of it (`cpu.tracer_ns`).
    tracer_cpu_ns: u64,
    groups: BTreeMap<LockIdentity, Group>,
    /// `--php` recordings: each route's locks.
    routes: Option<crate::model::Routes>,
}

impl Side {
    fn load(path: &Path) -> Result<Side> {
        let report = Report::load(path)?;
        let requests = request_count(&report, path)?;
        let mut stacks: HashMap<u64, Vec<&LockStack>> = HashMap::new();
        for stack in &report.stacks {
            stacks.entry(stack.lock).or_default().push(stack);
        }
        let mut groups: BTreeMap<LockIdentity, Group> = BTreeMap::new();
        for lock in &report.locks {
            let lock_stacks = stacks.get(&lock.address).map_or(&[][..], Vec::as_slice);
            add_to_group(&mut groups, lock, requests, lock_stacks);
        }
        Ok(Side {
            path: path.to_path_buf(),
            requests,
            mode: report.mode,
            sampled_windows: report.estimate.as_ref().map(|e| e.windows),
            target_cpu_ns: report.cpu.as_ref().and_then(|cpu| cpu.target_ns),
            tracer_cpu_ns: report.cpu.as_ref().map_or(0, |cpu| cpu.tracer_ns),
            groups,
            routes: report.routes.clone(),
        })
    }

    fn per_request(&self, value: u64) -> f64 {
        value as f64 / self.requests as f64
    }

    /// Whether the report counted acquisitions (contention mode does not).
    fn counts_acquisitions(&self) -> bool {
        self.mode != Mode::Contention
    }

    /// A group's acquisitions per request as shown: `~x ±e` when sampled.
    fn shown(&self, group: &Group) -> String {
        let value = ratio(self.per_request(group.acquisitions));
        match self.sampled_windows {
            Some(_) => format!("~{value} ±{}", ratio(group.per_request_error)),
            None => value,
        }
    }

    /// Lock groups a selector matches: by name or caller function (substring).
    fn matching<'a>(
        &'a self,
        selector: &'a str,
    ) -> impl Iterator<Item = (&'a LockIdentity, &'a Group)> + 'a {
        self.groups.iter().filter(move |(_, group)| {
            group.is_lock && group.labels.iter().any(|label| label.contains(selector))
        })
    }
}

/// A group of one side known on the other only by one of its aliases (an
/// older report's offset name, another route) takes the group's identity.
fn unify(before: &mut Side, after: &mut Side) {
    adopt(before, after);
    adopt(after, before);
}

fn adopt(named: &Side, other: &mut Side) {
    for (identity, group) in &named.groups {
        if other.groups.contains_key(identity) {
            continue;
        }
        // Known there by one of its aliases, or sharing one (the same route
        // in offsets, spelled alike in both reports); like with like only.
        let Some(alias) = other
            .groups
            .iter()
            .find(|(key, found)| {
                key.lock_name()
                    .is_some_and(|name| group.aliases.contains(name))
                    || (found.is_lock == group.is_lock
                        && !found.aliases.is_disjoint(&group.aliases))
            })
            .map(|(key, _)| key.clone())
        else {
            continue;
        };
        if let Some(found) = other.groups.remove(&alias) {
            other
                .groups
                .entry(identity.clone())
                .or_insert_with(|| Group {
                    kind: found.kind,
                    ..Group::default()
                })
                .absorb(found);
        }
    }
}

pub fn run(args: &CompareArgs) -> Result<ExitCode> {
    let outcome = evaluate_with(
        &args.before,
        &args.after,
        &args.assert_gone,
        &args.assert_max,
        Width::for_stdout(args.wide),
        args.paths_of,
    )?;
    // A reader that went away (`| head`) is a normal end; the verdict stands.
    Sink::Stdout.text(&outcome.text)?;
    if outcome.failures.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for failure in &outcome.failures {
        output::note(format_args!("locktrace: assertion failed: {failure}"));
    }
    Ok(ExitCode::FAILURE)
}

/// What a comparison prints and which assertions failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The table and the `ok:` lines, for stdout.
    pub text: String,
    pub failures: Vec<String>,
}

/// Loads both reports, renders the comparison and checks the assertions
/// (`--assert-gone SELECTOR`, `--assert-max SELECTOR=N`).
pub fn evaluate(
    before: &Path,
    after: &Path,
    assert_gone: &[String],
    assert_max: &[String],
    width: Width,
) -> Result<Outcome> {
    evaluate_with(before, after, assert_gone, assert_max, width, PATH_LOCKS)
}

/// [`evaluate`], showing the call paths of up to `path_locks` locks.
pub fn evaluate_with(
    before: &Path,
    after: &Path,
    assert_gone: &[String],
    assert_max: &[String],
    width: Width,
    path_locks: usize,
) -> Result<Outcome> {
    let mut before = Side::load(before)?;
    let mut after = Side::load(after)?;
    refuse_mixed_modes(&before, &after)?;
    unify(&mut before, &mut after);
    let limits = assert_max
        .iter()
        .map(|spec| parse_max(spec))
        .collect::<Result<Vec<_>>>()?;
    // Every line fits the width the tables use: notes wrap, indented.
    let mut text = render(&before, &after, width);
    text.push_str(&routes::render(
        before.routes.as_ref(),
        after.routes.as_ref(),
    ));
    text.push_str(&render_path_changes(&before, &after, path_locks));
    let mut text = crate::render::fit::wrap_lines(&text, width);
    let mut failures = Vec::new();
    if !after.counts_acquisitions() {
        for assertion in assert_gone
            .iter()
            .map(|s| format!("--assert-gone {s:?}"))
            .chain(assert_max.iter().map(|s| format!("--assert-max {s:?}")))
        {
            failures.push(format!(
                "{assertion} cannot be checked: {} was recorded with --mode contention, which counts no acquisitions; record it with --mode all",
                after.path.display()
            ));
        }
        return Ok(Outcome { text, failures });
    }
    for selector in assert_gone {
        check_gone(&before, &after, selector, &mut text, &mut failures);
    }
    for (selector, max) in &limits {
        let mut matched = false;
        for (identity, group) in after.matching(selector) {
            matched = true;
            // A sampled figure passes only if its whole bound is within the limit.
            let highest = after.per_request(group.acquisitions) + group.per_request_error;
            if highest > *max {
                failures.push(format!(
                    "{identity} is taken {} times per request after, more than {max}",
                    after.shown(group)
                ));
            } else {
                let _ = writeln!(
                    text,
                    "ok: {identity}: {} per request <= {max}",
                    after.shown(group)
                );
            }
        }
        if matched {
            continue;
        }
        if before.matching(selector).next().is_none() {
            // As with --assert-gone: a selector that matches nothing is a typo, not a pass.
            failures.push(format!(
                "--assert-max {selector:?} matches no lock in {} or {} (check the selector)",
                before.path.display(),
                after.path.display()
            ));
        } else {
            let _ = writeln!(
                text,
                "ok: no lock matching {selector:?} is taken after (0 per request <= {max})"
            );
        }
    }
    Ok(Outcome { text, failures })
}

/// `--assert-gone SELECTOR`: an `ok:` line in `text`, or a failure.
fn check_gone(
    before: &Side,
    after: &Side,
    selector: &str,
    text: &mut String,
    failures: &mut Vec<String>,
) {
    let still: Vec<String> = after
        .matching(selector)
        .filter(|(_, group)| group.acquisitions.saturating_add(group.contended) > 0)
        .map(|(identity, group)| {
            format!(
                "{identity} ({} per request)",
                ratio(after.per_request(group.acquisitions))
            )
        })
        .collect();
    if !still.is_empty() {
        failures.push(format!(
            "a lock matching {selector:?} is still taken after: {}",
            still.join("; ")
        ));
    } else if before.matching(selector).next().is_none() {
        // Matching nothing on either side is a typo, not a pass.
        failures.push(format!(
            "--assert-gone {selector:?} matches no lock in {} either (check the selector)",
            before.path.display()
        ));
    } else if let Some(windows) = after.sampled_windows {
        let _ = writeln!(
            text,
            "ok: no lock matching {selector:?} was seen in the {windows} sampling windows after (a lock taken rarely may be missed; --mode all to be sure)"
        );
    } else {
        let _ = writeln!(text, "ok: no lock matching {selector:?} is taken after");
    }
}

/// A report that counted acquisitions against one that did not (contention
/// mode) would show every lock as gone: refused in one line.
fn refuse_mixed_modes(before: &Side, after: &Side) -> Result<()> {
    if before.counts_acquisitions() == after.counts_acquisitions() {
        return Ok(());
    }
    let (counted, uncounted) = if before.counts_acquisitions() {
        (before, after)
    } else {
        (after, before)
    };
    bail!(
        "{} was recorded with --mode {} and {} with --mode contention, which counts no acquisitions (a lock missing there may still be taken); record both with the same --mode",
        counted.path.display(),
        counted.mode,
        uncounted.path.display()
    )
}

/// `+` for a rise or no change (ratio prints the `-` itself).
fn sign(delta: f64) -> &'static str {
    if delta >= 0.0 { "+" } else { "" }
}

fn parse_max(spec: &str) -> Result<(String, f64)> {
    let (selector, max) = spec
        .rsplit_once('=')
        .ok_or_else(|| anyhow!("--assert-max {spec:?}: want SELECTOR=N"))?;
    let max: f64 = max
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .with_context(|| format!("--assert-max {spec:?}: N must be a number >= 0"))?;
    if selector.is_empty() {
        bail!("--assert-max {spec:?}: the selector is empty");
    }
    Ok((selector.to_string(), max))
}

fn render(before: &Side, after: &Side, width: Width) -> String {
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
const PATH_LOCKS: usize = 3;
const PATHS_PER_LOCK: usize = 5;

/// `--stacks` on both sides: the call paths of the locks whose
/// acquisitions per request changed most, each path's lock calls per
/// request before and after (the paths that changed most first).
fn render_path_changes(before: &Side, after: &Side, path_locks: usize) -> String {
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
fn more(count: usize, noun: &str) -> String {
    match count {
        1 => format!("… 1 more {noun}"),
        _ => format!("… {count} more {noun}s"),
    }
}

/// One lock's call paths, those that changed most first, at most
/// [`PATHS_PER_LOCK`]; a path on one side only is marked.
fn path_lines(before: &Side, old: &Group, after: &Side, new: &Group) -> String {
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
fn time_change(before: Option<f64>, after: Option<f64>) -> String {
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
fn compare_row(before: &Side, after: &Side, identity: &LockIdentity) -> Vec<String> {
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
fn render_time_changes(
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
fn render_cpu_changes(before: &Side, after: &Side, width: Width) -> String {
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
fn render_predicted_saving(before: &Side, after: &Side, width: Width) -> String {
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
const MAX_TRACER_SHARE: f64 = 0.05;

/// A duration that may be negative (`-1.2 µs`).
fn signed_duration(ns: f64) -> String {
    let shown = duration(ns.abs().round() as u64);
    if ns < 0.0 { format!("-{shown}") } else { shown }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The group whose identity is written `written`.
    fn group_of<'s>(side: &'s Side, written: &str) -> Option<&'s Group> {
        side.groups
            .iter()
            .find(|(identity, _)| identity.to_string() == written)
            .map(|(_, group)| group)
    }
    use serde_json::Value;

    /// A minimal report with requests; `locks` as JSON (naming's fields optional).
    fn write_report(dir: &std::path::Path, file: &str, requests: u64, locks: Value) -> PathBuf {
        let report = serde_json::json!({
            "schema": crate::model::SCHEMA,
            "target": {"pid": 1, "exe": "/x", "cmdline": []},
            "duration_s": 1.0,
            "mode": "all",
            "locks": locks,
            "dropped": {},
            "totals": {"acquisitions": 0, "contended": 0, "wakes": 0, "wait_ns": 0},
            "requests": {"source": "given", "count": requests},
        });
        let path = dir.join(file);
        std::fs::write(&path, report.to_string()).unwrap();
        path
    }

    /// Gives a written report a `cpu` block with the target's CPU time.
    fn set_target_cpu(path: &Path, target_ns: u64) {
        let mut report: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        report["cpu"] = serde_json::json!({"target_ns": target_ns, "lock_code_ns": null,
            "lock_code_error_ns": null, "samples": 0, "sample_hz": 999, "tracer_ns": 0});
        std::fs::write(path, report.to_string()).unwrap();
    }

    /// A report of `mode` with 10 requests and the lock `g_lock` (or none).
    fn write_mode_report(
        dir: &std::path::Path,
        file: &str,
        mode: &str,
        lock: Option<Value>,
    ) -> PathBuf {
        let path = write_report(dir, file, 10, Value::Array(lock.into_iter().collect()));
        let mut report: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        report["mode"] = mode.into();
        if mode == "sampled" {
            report["estimate"] = serde_json::json!({
                "estimated": [], "sample_rate": 0.1, "windows": 12, "counted_s": 1.2,
                "total_s": 12.0, "scale": 10.0, "unsampled_edges_s": 0.1,
                "relative_error": 0.1, "probe_time_share": 0.0,
                "per_request_relative_error": 0.05,
            });
        }
        std::fs::write(&path, report.to_string()).unwrap();
        path
    }

    /// Two locks of one name whose counts sum past 2^64 (a crafted
    /// report): the group saturates instead of wrapping to a small number
    /// that `--assert-max` would pass.
    #[test]
    fn sums_near_two_to_the_64_saturate() {
        let dir = tempfile::tempdir().unwrap();
        let big = u64::MAX - 1;
        let locks = serde_json::json!([
            lock("0x1", big, serde_json::json!({"name": "g_lock"})),
            lock("0x2", big, serde_json::json!({"name": "g_lock"})),
        ]);
        let before = write_report(dir.path(), "b.json", 1, locks.clone());
        let after = write_report(dir.path(), "a.json", 1, locks);
        let outcome = evaluate(
            &before,
            &after,
            &[],
            &["g_lock=1000".into()],
            Width::Unlimited,
        )
        .unwrap();
        assert_eq!(outcome.failures.len(), 1, "{}", outcome.text);
    }

    #[test]
    fn a_contention_report_is_not_compared_with_one_that_counted_acquisitions() {
        let dir = tempfile::tempdir().unwrap();
        let before = write_mode_report(
            dir.path(),
            "b.json",
            "all",
            Some(lock("0x1", 80, serde_json::json!({"name": "g_lock"}))),
        );
        let after = write_mode_report(dir.path(), "a.json", "contention", None);
        let error =
            evaluate(&before, &after, &["g_lock".into()], &[], Width::Unlimited).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "{} was recorded with --mode all and {} with --mode contention, which counts no acquisitions (a lock missing there may still be taken); record both with the same --mode",
                before.display(),
                after.display()
            )
        );
        assert!(evaluate(&after, &before, &[], &[], Width::Unlimited).is_err());
    }

    #[test]
    fn contention_reports_assert_nothing_about_acquisitions() {
        let dir = tempfile::tempdir().unwrap();
        let mut waited = lock(
            "0x1",
            0,
            serde_json::json!({"name": "g_lock", "contended": 5}),
        );
        waited["acquisitions"] = Value::Null;
        let before = write_mode_report(dir.path(), "b.json", "contention", Some(waited));
        let after = write_mode_report(dir.path(), "a.json", "contention", None);
        let outcome = evaluate(
            &before,
            &after,
            &["g_lock".into()],
            &["g_lock=1".into()],
            Width::Unlimited,
        )
        .unwrap();
        assert!(!outcome.text.contains("disappeared"), "{}", outcome.text);
        assert!(!outcome.text.contains("%"), "{}", outcome.text);
        assert!(outcome.text.contains("not counted"), "{}", outcome.text);
        assert!(outcome.text.contains("no waits after"), "{}", outcome.text);
        assert_eq!(outcome.failures.len(), 2, "{:?}", outcome.failures);
        assert!(outcome.failures[0].starts_with("--assert-gone \"g_lock\" cannot be checked"));
    }

    #[test]
    fn sampled_reports_show_their_bounds_and_assert_within_them() {
        let dir = tempfile::tempdir().unwrap();
        let sampled = |acquisitions: u64, error: f64| {
            lock(
                "0x1",
                acquisitions,
                serde_json::json!({"name": "g_lock",
                "per_request": {"acquisitions": acquisitions as f64 / 10.0, "acquisitions_error": error, "contended": 0.0, "wait_ns": 0.0}}),
            )
        };
        let before = write_mode_report(dir.path(), "b.json", "sampled", Some(sampled(80, 0.5)));
        let after = write_mode_report(dir.path(), "a.json", "sampled", Some(sampled(78, 0.5)));
        // 7.8 ± 0.5 per request: below 8, but its bound reaches 8.3.
        let outcome =
            evaluate(&before, &after, &[], &["g_lock=8".into()], Width::Unlimited).unwrap();
        assert!(outcome.text.contains("~8.0 ±0.50"), "{}", outcome.text);
        assert!(outcome.text.contains("~7.80 ±0.50"), "{}", outcome.text);
        assert!(
            outcome.text.contains("within the bounds"),
            "{}",
            outcome.text
        );
        assert_eq!(outcome.failures.len(), 1, "{}", outcome.text);
        let outcome = evaluate(
            &before,
            &after,
            &[],
            &["g_lock=8.3".into()],
            Width::Unlimited,
        )
        .unwrap();
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        // Not seen in a sampled report: said so, never "disappeared".
        let gone = write_mode_report(dir.path(), "g.json", "sampled", None);
        let outcome = evaluate(&before, &gone, &["g_lock".into()], &[], Width::Unlimited).unwrap();
        assert!(
            outcome.text.contains("not seen after (sampled)"),
            "{}",
            outcome.text
        );
        assert!(
            outcome.text.contains("was seen in the 12 sampling windows"),
            "{}",
            outcome.text
        );
    }

    fn lock(address: &str, acquisitions: u64, extra: Value) -> Value {
        let mut lock = serde_json::json!({
            "address": address, "kind": "mutex", "acquisitions": acquisitions,
            "contended": 0, "wakes": 0, "wait_ns": 0, "max_wait_ns": 0,
        });
        for (key, value) in extra.as_object().unwrap() {
            lock[key] = value.clone();
        }
        lock
    }

    /// A row grouped by creation site (three addresses) matches the same
    /// site's per-address rows of a run recorded with `--group-by address`:
    /// one identity, its addresses counted, acquisitions summed.
    #[test]
    fn grouped_rows_match_per_address_rows_by_creation_site() {
        let dir = tempfile::tempdir().unwrap();
        let site = "mutex created in conn_create <- serve_request <- worker";
        let grouped = serde_json::json!({"name": site, "group": {
            "addresses": 3, "objects": 40, "by_address": []}});
        let before = write_report(
            dir.path(),
            "before.json",
            10,
            serde_json::json!([lock("0x1000", 30, grouped)]),
        );
        let named = serde_json::json!({"name": site});
        let after = write_report(
            dir.path(),
            "after.json",
            10,
            serde_json::json!([lock("0x7000", 20, named.clone()), lock("0x7100", 10, named)]),
        );
        let before = Side::load(&before).unwrap();
        let after = Side::load(&after).unwrap();
        let identity = before.groups.keys().find(|id| id.to_string() == site);
        let row = compare_row(&before, &after, identity.unwrap());
        assert_eq!(row[1..4], ["3/2", "3.0", "3.0"]);
    }

    /// A stack of `count` `source` events on `lock`, `functions` outermost first.
    fn stack(lock: &str, count: u64, source: &str, functions: &[&str]) -> Value {
        let frames: Vec<Value> = functions
            .iter()
            .rev()
            .enumerate()
            .map(|(at, f)| serde_json::json!({"function": f, "module": "/x", "offset": at}))
            .collect();
        serde_json::json!({"lock": lock, "count": count, "frames": frames,
            "unwound_by": "call_frame_info", "source": source})
    }

    /// Writes a report of `requests` with `locks` and `stacks`.
    fn write_stacks_report(
        dir: &std::path::Path,
        file: &str,
        requests: u64,
        locks: Value,
        stacks: Value,
    ) -> PathBuf {
        let path = write_report(dir, file, requests, locks);
        let mut report: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        report["stacks"] = stacks;
        std::fs::write(&path, report.to_string()).unwrap();
        path
    }

    /// With stacks on both sides, a lock's lock-call paths per request
    /// before and after (waits and CPU samples left out, paths that differ
    /// only in offsets folded into one), appeared and disappeared ones
    /// marked; a lock with stacks on one side only gets no section, and
    /// locks past `--paths-of` are counted.
    #[test]
    fn shows_call_paths_per_request_when_both_sides_have_stacks() {
        let dir = tempfile::tempdir().unwrap();
        let named = |name: &str| serde_json::json!({ "name": name });
        let handle = ["main", "handle", "take", "pthread_mutex_lock"];
        let flush = ["main", "flush", "pthread_mutex_lock"];
        let cache = ["main", "cache", "pthread_mutex_lock"];
        let before = write_stacks_report(
            dir.path(),
            "before.json",
            10,
            serde_json::json!([
                lock("0x1000", 60, named("g_lock")),
                lock("0x3000", 5, named("other")),
                lock("0x4000", 5, named("solo"))
            ]),
            serde_json::json!([
                stack("0x1000", 30, "lock_calls", &handle),
                stack("0x1000", 10, "lock_calls", &handle),
                stack("0x1000", 20, "lock_calls", &flush),
                stack("0x1000", 5, "waits", &["main", "handle", "futex_wait"]),
                stack("0x1000", 7, "cpu_samples", &cache),
                stack("0x3000", 5, "lock_calls", &flush),
                stack("0x4000", 5, "lock_calls", &flush),
            ]),
        );
        let after = write_stacks_report(
            dir.path(),
            "after.json",
            20,
            serde_json::json!([
                lock("0x2000", 50, named("g_lock")),
                lock("0x3000", 5, named("other")),
                lock("0x4000", 5, named("solo"))
            ]),
            serde_json::json!([
                stack("0x2000", 40, "lock_calls", &handle),
                stack("0x2000", 10, "lock_calls", &cache),
                stack("0x3000", 5, "lock_calls", &flush),
            ]),
        );
        let text = render_path_changes(
            &Side::load(&before).unwrap(),
            &Side::load(&after).unwrap(),
            1,
        );
        let section: Vec<&str> = text
            .lines()
            .skip_while(|line| !line.starts_with("call paths"))
            .collect();
        assert_eq!(
            section,
            [
                "call paths (lock calls per request, outermost;…;innermost):",
                "    before      after     change  path",
                "g_lock: 6.0 -> 2.50 per request",
                "       4.0        2.0       -2.0  main;handle;take;pthread_mutex_lock",
                "       2.0          -       -2.0  (disappeared) main;flush;pthread_mutex_lock",
                "         -       0.50      +0.50  (appeared) main;cache;pthread_mutex_lock",
                "… 1 more lock with stacks on both sides (--paths-of N)",
            ],
            "{text}"
        );
        // No stacks after: no section.
        let bare = write_report(
            dir.path(),
            "bare.json",
            10,
            serde_json::json!([lock("0x1000", 60, named("g_lock"))]),
        );
        let text = render_path_changes(
            &Side::load(&before).unwrap(),
            &Side::load(&bare).unwrap(),
            3,
        );
        assert_eq!(text, "");
    }

    #[test]
    fn shows_hold_time_changes_per_request() {
        let dir = tempfile::tempdir().unwrap();
        let holds = |ns: u64| serde_json::json!({"name": "g_lock", "holds": {"holds": 10, "hold_ns": ns, "max_hold_ns": ns, "histogram": [], "by_function": []}});
        let before = write_report(
            dir.path(),
            "before.json",
            10,
            serde_json::json!([lock("0x1000", 10, holds(4_000_000))]),
        );
        let after = write_report(
            dir.path(),
            "after.json",
            10,
            serde_json::json!([lock("0x1000", 10, holds(1_000_000))]),
        );
        let text = render(
            &Side::load(&before).unwrap(),
            &Side::load(&after).unwrap(),
            Width::Unlimited,
        );
        let row = text
            .lines()
            .skip_while(|line| !line.starts_with(" held per request"))
            .find(|line| line.starts_with(" g_lock "))
            .unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells, ["g_lock", "400.0 µs", "100.0 µs", "-75%"], "{text}");
    }

    #[test]
    fn shows_cpu_per_request_of_the_target_and_the_locks() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = |ns: u64| serde_json::json!({"name": "g_lock", "cpu_ns": ns, "cpu_error_ns": 1});
        let before = write_report(
            dir.path(),
            "before.json",
            100,
            serde_json::json!([lock("0x1000", 10, cpu(30_000_000))]),
        );
        let after = write_report(
            dir.path(),
            "after.json",
            200,
            serde_json::json!([lock("0x1000", 10, cpu(0))]),
        );
        set_target_cpu(&before, 100_000_000);
        set_target_cpu(&after, 150_000_000);
        let text = render(
            &Side::load(&before).unwrap(),
            &Side::load(&after).unwrap(),
            Width::Unlimited,
        );
        // 1 ms per request before, 0.75 ms after; the lock 300 µs, then 0.
        assert!(
            text.contains("cpu per request: target 1.0 ms -> 750.0 µs (-25%)"),
            "{text}"
        );
        // The lock's row in the "cpu per request" table: before, after, change.
        let row: Vec<&str> = text
            .lines()
            .find(|line| line.trim_start().starts_with("g_lock") && line.contains("µs"))
            .unwrap_or_else(|| panic!("no cpu row for g_lock in:\n{text}"))
            .split('|')
            .map(str::trim)
            .collect();
        assert_eq!(row, ["g_lock", "300.0 µs", "0", "-100%"], "{text}");
    }

    /// Issue 32: the fall of the locks' removal price is the predicted
    /// saving, set beside the target's measured CPU change.
    #[test]
    fn sets_the_predicted_saving_beside_the_measured_one() {
        let dir = tempfile::tempdir().unwrap();
        let priced = |name: &str, saving_ns: f64, error_ns: f64| {
            serde_json::json!({"name": name, "wait_class": "lock", "removal": {
                "saving_ns": saving_ns, "error_ns": error_ns,
                "lock_code": {"ns": saving_ns, "error_ns": error_ns, "basis": "calibrated"},
                "handoffs": null, "kernel": null}})
        };
        // 100 requests: g_stats costs 5 µs per request and goes; g_conn
        // costs 1 µs per request before and after.
        let before = write_report(
            dir.path(),
            "before.json",
            100,
            serde_json::json!([
                lock("0x1000", 10, priced("g_stats", 500_000.0, 100_000.0)),
                lock("0x2000", 10, priced("g_conn", 100_000.0, 20_000.0)),
            ]),
        );
        let after = write_report(
            dir.path(),
            "after.json",
            100,
            serde_json::json!([lock("0x2000", 10, priced("g_conn", 100_000.0, 20_000.0))]),
        );
        set_target_cpu(&before, 100_000_000);
        set_target_cpu(&after, 99_400_000);
        let text = render(
            &Side::load(&before).unwrap(),
            &Side::load(&after).unwrap(),
            Width::Unlimited,
        );
        assert!(
            text.contains(
                "predicted saving: the locks' price fell by 5.0 µs ±1.4 µs CPU per request; \
                 measured: the target's CPU per request less the tracer's share fell by 6.0 µs"
            ),
            "{text}"
        );
        // A tracer that took a tenth of the target's CPU: no measured figure.
        let mut report: Value =
            serde_json::from_str(&std::fs::read_to_string(&after).unwrap()).unwrap();
        report["cpu"]["tracer_ns"] = 9_940_000.into();
        std::fs::write(&after, report.to_string()).unwrap();
        let text = render(
            &Side::load(&before).unwrap(),
            &Side::load(&after).unwrap(),
            Width::Unlimited,
        );
        assert!(
            text.contains("measured: not comparable, the tracer took 10% of the target's CPU"),
            "{text}"
        );
    }

    #[test]
    fn matches_by_name_then_callers_never_address() {
        let dir = tempfile::tempdir().unwrap();
        let before = write_report(
            dir.path(),
            "before.json",
            10,
            serde_json::json!([
                lock(
                    "0x1000",
                    80,
                    serde_json::json!({"name": "g_stats->lock", "callers": [{"function": "global_stats_add", "module": "httpd", "offset": 16, "count": 80}]})
                ),
                lock(
                    "0x2000",
                    30,
                    serde_json::json!({"callers": [{"function": "conn_counter_add", "module": "httpd", "offset": 9, "count": 1}]})
                ),
                lock(
                    "0x3000",
                    50,
                    serde_json::json!({"callers": [{"function": "conn_counter_add", "module": "httpd", "offset": 9, "count": 1}]})
                ),
                lock("0x4000", 5, serde_json::json!({"name": "0x4000"})),
            ]),
        );
        let after = write_report(
            dir.path(),
            "after.json",
            20,
            serde_json::json!([lock(
                "0x9000",
                160,
                serde_json::json!({"callers": [{"function": "conn_counter_add", "module": "httpd", "offset": 9, "count": 1}]})
            ),]),
        );
        let before = Side::load(&before).unwrap();
        let after = Side::load(&after).unwrap();
        assert_eq!(before.groups.len(), 3);
        assert_eq!(group_of(&before, "g_stats->lock").unwrap().acquisitions, 80);
        // Two per-connection mutexes, one identity; matched across runs whatever their addresses.
        let connections = &group_of(&before, "mutex via conn_counter_add").unwrap();
        assert_eq!((connections.locks, connections.acquisitions), (2, 80));
        assert_eq!(
            after.per_request(
                group_of(&after, "mutex via conn_counter_add")
                    .unwrap()
                    .acquisitions
            ),
            8.0
        );
        assert!(group_of(&before, "unidentified mutex").is_some());
        // Selectors search names and caller functions.
        assert_eq!(before.matching("global_stats").count(), 1);
        assert_eq!(before.matching("g_stats->").count(), 1);
        assert_eq!(after.matching("global_stats").count(), 0);
    }

    /// Reports from before field names (the lock named in offsets, by the
    /// registry route) and from before C notation (`g_stats->+0x10->`,
    /// `g_stats->LOCK_access` for the lock that field points to) compare
    /// with one that has both: one row.
    #[test]
    fn matches_old_offset_names_and_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let old = |file: &str, acquisitions: u64, names: Value| {
            let locks = serde_json::json!([lock("0x1000", acquisitions, names)]);
            write_report(dir.path(), file, 10, locks)
        };
        let olds = [
            (
                old(
                    "registry.json",
                    80,
                    serde_json::json!({"name": "g_plugin_core+0x30->+0x10->"}),
                ),
                80,
            ),
            (
                old(
                    "offsets.json",
                    40,
                    serde_json::json!({"name": "g_global_stats->+0x10->"}),
                ),
                40,
            ),
            (
                old(
                    "fields.json",
                    30,
                    serde_json::json!({"name": "g_global_stats->LOCK_access", "offset_name": "g_global_stats->+0x10->"}),
                ),
                30,
            ),
        ];
        let new = write_report(
            dir.path(),
            "new.json",
            10,
            serde_json::json!([lock(
                "0x2000",
                20,
                serde_json::json!({
                    "name": "*g_global_stats->LOCK_access",
                    "offset_name": "*g_global_stats->+0x10",
                    "alternatives": [{
                        "name": "*g_plugin_core.plugin_header.plugin_stats->LOCK_access",
                        "offset_name": "*g_plugin_core+0x30->+0x10",
                        "chain": {"module": "/x", "root": "g_plugin_core", "offsets": [48, 16, 0]},
                    }],
                })
            )]),
        );
        for (old, acquisitions) in &olds {
            let mut before = Side::load(old).unwrap();
            let mut after = Side::load(&new).unwrap();
            unify(&mut before, &mut after);
            assert_eq!(before.groups.len(), 1, "{old:?}");
            assert_eq!(
                before.groups.keys().collect::<Vec<_>>(),
                after.groups.keys().collect::<Vec<_>>()
            );
            let group = before.groups.values().next().unwrap();
            assert_eq!(group.acquisitions, *acquisitions);
            let table = render(&before, &after, Width::Unlimited);
            assert!(!table.contains("disappeared"), "{table}");
            // Selectors find it by any of its names, old spellings included.
            assert_eq!(after.matching("*g_global_stats->+0x10").count(), 1);
            let spelled = Report::load(old).unwrap().locks[0].name.clone().unwrap();
            assert_eq!(before.matching(&spelled).count(), 1, "{spelled}");
            // Old on the after side works too.
            let mut before = Side::load(&new).unwrap();
            let mut after = Side::load(old).unwrap();
            unify(&mut before, &mut after);
            assert!(group_of(&after, "*g_global_stats->LOCK_access").is_some());
        }
    }

    #[test]
    fn condvars_match_condvars_and_assertions_select_locks() {
        let dir = tempfile::tempdir().unwrap();
        let locks = serde_json::json!([
            lock("0x1000", 20, serde_json::json!({"name": "*g_pool"})),
            lock(
                "0x1028",
                0,
                serde_json::json!({"name": "*g_pool", "kind": "condvar", "wait_class": "condvar", "acquisitions": null, "contended": 30})
            ),
        ]);
        let side = Side::load(&write_report(dir.path(), "r.json", 10, locks)).unwrap();
        assert_eq!(group_of(&side, "*g_pool").unwrap().acquisitions, 20);
        assert_eq!(group_of(&side, "*g_pool").unwrap().contended, 0);
        assert_eq!(group_of(&side, "[condvar] *g_pool").unwrap().contended, 30);
        let selected: Vec<String> = side
            .matching("g_pool")
            .map(|(id, _)| id.to_string())
            .collect();
        assert_eq!(selected, ["*g_pool"]);
    }

    #[test]
    fn refuses_reports_without_requests() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_report(dir.path(), "r.json", 0, serde_json::json!([]));
        let error = Side::load(&path).err().unwrap().to_string();
        assert!(error.contains("no request count"), "{error}");
    }

    #[test]
    fn assert_max_fails_on_a_selector_that_matches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let locks = serde_json::json!([lock(
            "0x1000",
            40,
            serde_json::json!({"name": "g_stats->lock"})
        )]);
        let before = write_report(dir.path(), "before.json", 10, locks.clone());
        let after = write_report(dir.path(), "after.json", 10, locks);
        let max = |spec: &str| {
            evaluate(&before, &after, &[], &[spec.to_string()], Width::Unlimited).unwrap()
        };
        let typo = max("nosuchlock=0");
        assert_eq!(typo.failures.len(), 1, "{typo:?}");
        assert!(
            typo.failures[0].contains("\"nosuchlock\" matches no lock"),
            "{typo:?}"
        );
        // A selector that matches still passes or fails on the figure.
        assert_eq!(max("g_stats=4").failures, Vec::<String>::new());
        assert_eq!(max("g_stats=3.9").failures.len(), 1);
    }

    #[test]
    fn parses_limits() {
        assert_eq!(
            parse_max("global_stats_add=0").unwrap(),
            ("global_stats_add".to_string(), 0.0)
        );
        assert_eq!(parse_max("a=b=2.5").unwrap(), ("a=b".to_string(), 2.5));
        assert!(parse_max("x").is_err());
        assert!(parse_max("x=-1").is_err());
        assert!(parse_max("=1").is_err());
    }
}
