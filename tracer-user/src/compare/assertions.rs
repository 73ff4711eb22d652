//! The CI assertions of `compare`: `--assert-gone` and `--assert-max`,
//! each an `ok:` line or a failure, and the reports they refuse.
use std::fmt::Write;

use anyhow::{Context, Result, anyhow, bail};

use super::side::Side;
use crate::render::format::ratio;

/// Checks `--assert-gone` (`assert_gone`) and `--assert-max` (`assert_max`,
/// parsed as `limits`) on the after side: an `ok:` line in `text` for each that holds,
/// the failures returned.
pub(super) fn check(
    before: &Side,
    after: &Side,
    assert_gone: &[String],
    (assert_max, limits): (&[String], &[(String, f64)]),
    text: &mut String,
) -> Vec<String> {
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
        return failures;
    }
    for selector in assert_gone {
        check_gone(before, after, selector, text, &mut failures);
    }
    for (selector, max) in limits {
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
    failures
}

/// `--assert-gone SELECTOR`: an `ok:` line in `text`, or a failure.
pub(super) fn check_gone(
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
pub(super) fn refuse_mixed_modes(before: &Side, after: &Side) -> Result<()> {
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

pub(super) fn parse_max(spec: &str) -> Result<(String, f64)> {
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
