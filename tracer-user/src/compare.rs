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
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Result;

use crate::render::{Sink, fit::Width, output};
use side::{Side, unify};
use table::PATH_LOCKS;

mod assertions;
mod identity;
mod kernel;
mod routes;
mod side;
mod table;

/// What `locktrace compare` was asked (its flags, read by cli).
#[derive(Debug, Clone)]
pub(crate) struct CompareOptions {
    pub before: PathBuf,
    pub after: PathBuf,
    pub assert_gone: Vec<String>,
    pub assert_max: Vec<String>,
    pub wide: bool,
    /// Show the call paths of up to this many locks.
    pub paths_of: usize,
}

/// Locks whose call paths are shown by default (`--paths-of`).
pub(crate) const DEFAULT_PATH_LOCKS: usize = PATH_LOCKS;

pub(crate) fn run(args: &CompareOptions) -> Result<ExitCode> {
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
pub(crate) fn evaluate_with(
    before: &Path,
    after: &Path,
    assert_gone: &[String],
    assert_max: &[String],
    width: Width,
    path_locks: usize,
) -> Result<Outcome> {
    let mut before = Side::load(before)?;
    let mut after = Side::load(after)?;
    assertions::refuse_mixed_modes(&before, &after)?;
    unify(&mut before, &mut after);
    let limits = assert_max
        .iter()
        .map(|spec| assertions::parse_max(spec))
        .collect::<Result<Vec<_>>>()?;
    // Every line fits the width the tables use: notes wrap, indented.
    let mut text = table::render(&before, &after, width);
    text.push_str(&routes::render(
        before.routes.as_ref(),
        after.routes.as_ref(),
    ));
    text.push_str(&kernel::render(&before, &after, width));
    text.push_str(&table::render_path_changes(&before, &after, path_locks));
    let mut text = crate::render::fit::wrap_lines(&text, width);
    let failures = assertions::check(
        &before,
        &after,
        assert_gone,
        (assert_max, &limits),
        &mut text,
    );
    Ok(Outcome { text, failures })
}

#[cfg(test)]
mod tests;
