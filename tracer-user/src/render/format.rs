//! Number and text formatting shared by every text output, and how a lock
//! and a frame are labelled in all of them.
pub(crate) use crate::model::diagnostics::printable;

use crate::model::{Frame, Lock};

/// A duration in the unit that reads best: `850 ns`, `12.5 µs`, `3.2 ms`, `1.25 s`.
pub(crate) fn duration(ns: u64) -> String {
    match ns {
        0 => "0".into(),
        n if n < 1_000 => format!("{n} ns"),
        n if n < 1_000_000 => format!("{:.1} µs", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n => format!("{:.2} s", n as f64 / 1e9),
    }
}

/// A per-request figure: `8.0` when whole (exact), else two decimals (four below 0.1).
pub(crate) fn ratio(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.1}")
    } else if value.abs() < 0.1 {
        format!("{value:.4}")
    } else {
        format!("{value:.2}")
    }
}

/// `text` cut to at most `max` characters, ending in `…` when cut; control
/// characters escaped first (see [`printable`]).
pub(crate) fn truncate(text: &str, max: usize) -> String {
    cut(&printable(text), max)
}

/// `text` cut to at most `max` characters, ending in `…` when cut, as it
/// is (`top` escapes its lines whole when it prints them).
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

#[cfg(test)]
/// Widest line of a rendered block, in characters.
pub(crate) fn width(text: &str) -> usize {
    text.lines()
        .map(|line| line.chars().count())
        .max()
        .unwrap_or(0)
}

/// A lock as people read it: its name, else its region and address; a
/// lock whose memory went away during the recording says so.
pub(crate) fn label(lock: &Lock) -> String {
    let address = lock.shown_address();
    let label = match &lock.name {
        Some(name) => name.clone(),
        None if matches!(lock.region, crate::model::Region::Unset) => format!("{address:#x}"),
        None => format!("{} {address:#x}", lock.region),
    };
    label + lifetime_note(lock)
}

/// What a lock's name is followed by when its memory went away during the
/// recording: another row counts the lock at its address now.
pub(crate) fn lifetime_note(lock: &Lock) -> &'static str {
    match lock.lifetime {
        Some(ended) if ended.by_exec => " (before exec)",
        Some(ended) if ended.module_unseen => {
            " (unmapped; its module came and went between two reads of the maps: not named)"
        }
        Some(_) => " (unmapped)",
        None => "",
    }
}

/// A stack frame as people read it: its function, else module and offset.
pub(crate) fn frame_label(frame: &Frame) -> String {
    if let (Some(php), Some(function)) = (&frame.php, &frame.function) {
        // `Repo::find (Repo.php:42)`; a PHP function written in C says so.
        let text = if php.file.is_empty() {
            format!("{function} (php)")
        } else {
            format!("{function} ({}:{})", short_module(&php.file), php.line)
        };
        return text.replace(';', ",");
    }
    // ';' separates frames in the folded format.
    frame.code_label().replace(';', ",")
}

/// A module path's file name.
pub(crate) fn short_module(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_with_an_ellipsis() {
        assert_eq!(truncate("global_stats_add", 40), "global_stats_add");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abcdef", 4).chars().count(), 4);
    }

    #[test]
    fn control_characters_are_escaped() {
        let hostile = "evil\x1b]0;pwned\x07name\u{9b}2J";
        assert_eq!(printable(hostile), "evil\\x1b]0;pwned\\x07name\\u{9b}2J");
        assert_eq!(printable("a\nb µs"), "a\nb µs");
        assert_eq!(truncate(hostile, 9), "evil\\x1b…");
    }

    #[test]
    fn ratios_show_exact_counts_whole() {
        assert_eq!(ratio(408.0), "408.0");
        assert_eq!(ratio(2.345), "2.35");
        assert_eq!(ratio(0.01234), "0.0123");
    }
}
