//! Bounds of the numeric flags, checked before anything is attached: a
//! value out of range is one line that says the range, never a panic
//! (`Duration::from_secs_f64(1e20)`) or an allocation that eats the machine.
use std::{path::Path, time::Duration};

use anyhow::{Result, bail};

/// Longest `--duration`: one year (leave the flag out to record until Ctrl-C).
pub const MAX_DURATION_S: f64 = 366.0 * 86_400.0;
/// Longest `--sample-period`: one hour.
pub const MAX_SAMPLE_PERIOD_S: f64 = 3_600.0;
pub const MIN_SAMPLE_PERIOD_S: f64 = 0.1;
/// Most `--load` connections (each one a socket and a task).
pub const MAX_CONCURRENCY: usize = 10_000;

/// `--duration`: positive, finite, at most a year.
pub fn duration(seconds: f64) -> Result<Duration> {
    // NaN fails both comparisons, so it is refused too.
    if seconds.is_nan() || seconds <= 0.0 {
        bail!("--duration must be positive (seconds), not {seconds}");
    }
    if seconds > MAX_DURATION_S {
        bail!(
            "--duration {seconds} is too long: at most {MAX_DURATION_S} s (a year); leave it out to record until Ctrl-C"
        );
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `--sample`: a fraction in (0, 1].
pub fn sample_rate(rate: f64) -> Result<f64> {
    if !(rate > 0.0 && rate <= 1.0) {
        bail!("--sample must be a fraction in (0, 1], not {rate}");
    }
    Ok(rate)
}

/// `--sample-period`: 0.1 s to an hour.
pub fn sample_period(seconds: f64) -> Result<Duration> {
    if !(MIN_SAMPLE_PERIOD_S..=MAX_SAMPLE_PERIOD_S).contains(&seconds) {
        bail!(
            "--sample-period must be between {MIN_SAMPLE_PERIOD_S} and {MAX_SAMPLE_PERIOD_S} seconds, not {seconds}"
        );
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `-c`: 1 to [`MAX_CONCURRENCY`] connections.
pub fn concurrency(connections: usize) -> Result<usize> {
    if !(1..=MAX_CONCURRENCY).contains(&connections) {
        bail!(
            "-c (concurrency) must be between 1 and {MAX_CONCURRENCY} connections, not {connections}"
        );
    }
    Ok(connections)
}

/// `--expect-status`: an HTTP status code.
pub fn status(code: u16) -> Result<u16> {
    if !(100..=599).contains(&code) {
        bail!("--expect-status must be an HTTP status (100 to 599), not {code}");
    }
    Ok(code)
}

/// `--json PATH`: checked before attaching, so a typo does not cost the
/// whole recording. Opens it for writing (creating it, then removing it
/// again if it did not exist: the report is written at the end).
pub fn writable(path: &Path) -> Result<()> {
    if path.is_dir() {
        bail!("--json {} is a directory; give a file path", path.display());
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(error) => bail!(
            "cannot write --json {}: {error}; give a writable path",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_flags_are_bounded() {
        for bad in [1e20, -1.0, 0.0, f64::NAN, f64::INFINITY] {
            assert!(duration(bad).is_err(), "{bad}");
            assert!(sample_period(bad).is_err(), "{bad}");
        }
        assert!(format!("{}", duration(-1.0).unwrap_err()).contains("must be positive"));
        assert_eq!(duration(1.5).unwrap(), Duration::from_millis(1500));
        assert!(sample_rate(0.0).is_err() && sample_rate(1.5).is_err());
        assert!(concurrency(usize::MAX).is_err() && concurrency(0).is_err());
        assert_eq!(concurrency(4).unwrap(), 4);
        assert!(status(0).is_err() && status(600).is_err());
    }

    #[test]
    fn json_path_is_checked_without_leaving_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("r.json");
        writable(&fresh).unwrap();
        assert!(!fresh.exists());
        assert!(writable(&dir.path().join("no/such/dir/r.json")).is_err());
        assert!(writable(dir.path()).is_err());
    }
}
