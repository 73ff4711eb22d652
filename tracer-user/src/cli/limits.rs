//! Bounds of the numeric flags, checked before anything is attached: a
//! value out of range is one line that says the range, never a panic
//! (`Duration::from_secs_f64(1e20)`) or an allocation that eats the machine.
use std::{fmt::Display, path::Path, str::FromStr, time::Duration};

use anyhow::{Result, bail};

use crate::trace::cpu::MAX_CPU_HZ;

/// Most `--stacks` per lock: a lock has no more distinct stacks than the
/// BPF stack map holds.
pub(crate) const MAX_STACKS_PER_LOCK: u64 = tracer_common::MAX_STACKS as u64;
/// Most requests `-n` and `--warmup` send: a billion is hours at 100k
/// requests a second (longer loads are given as --duration).
pub(crate) const MAX_LOAD_REQUESTS: u64 = 1_000_000_000;
/// Longest `--expire-after`: a year, as `--duration`.
pub(crate) const MAX_EXPIRE_AFTER_S: u64 = MAX_DURATION_S as u64;

/// A clap value parser for a whole number in `min..=max` (no upper bound
/// without `max`): a value out of range is a one-line clap error naming
/// `flag` and its range.
pub(crate) fn whole<T>(
    flag: &'static str,
    min: u64,
    max: Option<u64>,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    move |text| {
        let value: u64 = text
            .parse()
            .map_err(|error| format!("{flag} takes a whole number: {error}"))?;
        let refused = || match max {
            Some(max) => format!("{flag} must be between {min} and {max}, not {value}"),
            None => format!("{flag} must be at least {min}, not {value}"),
        };
        if value < min || max.is_some_and(|max| value > max) {
            return Err(refused());
        }
        T::try_from(value).map_err(|_| refused())
    }
}

/// Largest `--stack-sample-every`: one acquisition in a million still
/// gives a busy lock's call site a few samples a second.
pub(crate) const MAX_STACK_SAMPLE_EVERY: u64 = 1 << 20;

/// A clap value parser for a power of two in `min..=max` (the stubs
/// sample with a mask).
pub(crate) fn power_of_two(
    flag: &'static str,
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |text| {
        let value = whole::<u64>(flag, min, Some(max))(text)?;
        if !value.is_power_of_two() {
            return Err(format!(
                "{flag} must be a power of two (the stubs sample with a mask), not {value}; try {}",
                value.next_power_of_two().min(max)
            ));
        }
        Ok(value)
    }
}

/// A clap value parser from one of the checks below: the text as a
/// number, then `check` (whose error says the flag's range).
pub(crate) fn checked<N, T>(
    check: fn(N) -> Result<T>,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    N: FromStr + 'static,
    N::Err: Display,
    T: 'static,
{
    move |text| {
        let number = text.parse::<N>().map_err(|error| error.to_string())?;
        check(number).map_err(|error| error.to_string())
    }
}

/// Longest `--duration`: one year (leave the flag out to record until Ctrl-C).
pub(crate) const MAX_DURATION_S: f64 = 366.0 * 86_400.0;
/// Longest `--sample-period`: one hour.
pub(crate) const MAX_SAMPLE_PERIOD_S: f64 = 3_600.0;
pub(crate) const MIN_SAMPLE_PERIOD_S: f64 = 0.1;
/// Most `--load` connections (each one a socket and a task).
pub(crate) const MAX_CONCURRENCY: u64 = 10_000;

/// Open files locktrace needs besides the load driver's connections: BPF
/// maps and programs, a link per probe point, module files, /proc files.
pub(crate) const BASE_OPEN_FILES: u64 = 128;

/// Makes room for `connections` more sockets over [`BASE_OPEN_FILES`]:
/// raises the soft limit on open files (up to the hard one, and the hard one
/// too where allowed, as for root). With too few left every later failure
/// would be a confusing EMFILE (a map "the kernel refused", "needs root"),
/// so a limit that cannot be raised is one line up front.
pub(crate) fn open_files(connections: u64) -> Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let needed = BASE_OPEN_FILES + connections;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= needed {
        return Ok(());
    }
    let raised = needed.max(soft);
    if setrlimit(Resource::RLIMIT_NOFILE, raised, hard.max(raised)).is_ok()
        || (hard >= needed && setrlimit(Resource::RLIMIT_NOFILE, raised, hard).is_ok())
    {
        return Ok(());
    }
    bail!(
        "too few open files allowed: ulimit -n is {soft} (hard limit {hard}) and locktrace needs {needed} (else EMFILE); raise the limit: ulimit -n {needed}{}",
        if hard < needed {
            " (above the hard limit: needs CAP_SYS_RESOURCE)"
        } else {
            ""
        }
    )
}

/// Address space locktrace needs at least (`ulimit -v`): module files are
/// mapped whole and each thread reserves its stack and malloc arena.
pub(crate) const MIN_ADDRESS_SPACE: u64 = 256 << 20;

/// A memory limit (`ulimit -v`) under [`MIN_ADDRESS_SPACE`] is raised (to
/// the hard limit where that is enough, else lifted where allowed, as for
/// root), else refused in one line: running out later ends in an abort
/// that loses the recording.
pub(crate) fn address_space() -> Result<()> {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_AS)?;
    let enough = |limit: u64| limit == RLIM_INFINITY || limit >= MIN_ADDRESS_SPACE;
    if enough(soft)
        || (enough(hard) && setrlimit(Resource::RLIMIT_AS, hard, hard).is_ok())
        || setrlimit(Resource::RLIMIT_AS, RLIM_INFINITY, RLIM_INFINITY).is_ok()
    {
        return Ok(());
    }
    bail!(
        "the memory limit (ulimit -v) is {} MiB and locktrace needs at least {} MiB; raise it: ulimit -v unlimited",
        soft >> 20,
        MIN_ADDRESS_SPACE >> 20
    )
}

/// `--duration`: positive, finite, at most a year.
pub(crate) fn duration(seconds: f64) -> Result<Duration> {
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

/// `--cpu-hz`: 1 to [`MAX_CPU_HZ`] samples per CPU second.
pub(crate) fn cpu_hz(hz: i64) -> Result<u64> {
    if !(1..=MAX_CPU_HZ as i64).contains(&hz) {
        bail!(
            "--cpu-hz must be between 1 and {MAX_CPU_HZ} samples per second, not {hz} (--no-cpu turns sampling off)"
        );
    }
    Ok(hz as u64)
}

/// `--sample`: a fraction in (0, 1].
pub(crate) fn sample_rate(rate: f64) -> Result<f64> {
    if !(rate > 0.0 && rate <= 1.0) {
        bail!("--sample must be a fraction in (0, 1], not {rate}");
    }
    Ok(rate)
}

/// `--sample-period`: 0.1 s to an hour.
pub(crate) fn sample_period(seconds: f64) -> Result<Duration> {
    if !(MIN_SAMPLE_PERIOD_S..=MAX_SAMPLE_PERIOD_S).contains(&seconds) {
        bail!(
            "--sample-period must be between {MIN_SAMPLE_PERIOD_S} and {MAX_SAMPLE_PERIOD_S} seconds, not {seconds}"
        );
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The output files (`--json`, `--pprof`, `--ready-file`), checked before
/// attaching so a typo does not cost the whole recording: each is a file
/// path in a directory we can create a file in (outputs are written to a
/// temporary file there and renamed over the path), and no two are the same
/// file. Nothing is left behind.
pub(crate) fn outputs(paths: &[(&str, &Path)]) -> Result<()> {
    let mut seen: Vec<(&str, std::path::PathBuf)> = Vec::new();
    for &(flag, path) in paths {
        let where_ = writable(flag, path)?;
        if let Some((first, _)) = seen.iter().find(|(_, other)| *other == where_) {
            bail!(
                "{first} and {flag} name the same file {}; give each output its own path",
                path.display()
            );
        }
        seen.push((flag, where_));
    }
    Ok(())
}

/// Checks one output path; returns it with its directory resolved, to
/// compare with the others.
fn writable(flag: &str, path: &Path) -> Result<std::path::PathBuf> {
    match crate::model::Destination::of(path) {
        // Two outputs on stdout would interleave: compared like files.
        crate::model::Destination::Stdout => return Ok("/dev/stdout".into()),
        crate::model::Destination::WriteThrough(path) => return existing_special(flag, &path),
        crate::model::Destination::Replace(_) => {}
    }
    if path.is_dir() {
        bail!("{flag} {} is a directory; give a file path", path.display());
    }
    let Some(name) = path.file_name() else {
        bail!(
            "{flag} {} is not a file path; give a file path",
            path.display()
        );
    };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let resolved = directory
        .canonicalize()
        .and_then(|directory| {
            tempfile::NamedTempFile::new_in(&directory)?;
            Ok(directory)
        })
        .map_err(|error| {
            anyhow::anyhow!(
                "cannot write {flag} {}: {error}; give a writable path",
                path.display()
            )
        })?;
    Ok(resolved.join(name))
}
/// A device, FIFO or socket, or a path under /dev or /proc: written
/// through, so it must exist (nothing is created there). Two outputs to
/// `/dev/null` are fine; each returns its own path so they never collide.
fn existing_special(flag: &str, path: &Path) -> Result<std::path::PathBuf> {
    if std::fs::metadata(path).is_err() {
        bail!(
            "{flag} {} does not exist, and locktrace creates no files in /dev or /proc; give a file path",
            path.display()
        );
    }
    if path.is_dir() {
        bail!("{flag} {} is a directory; give a file path", path.display());
    }
    Ok(path.join(flag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn numeric_flags_are_bounded() {
        for bad in [1e20, -1.0, 0.0, f64::NAN, f64::INFINITY] {
            assert!(duration(bad).is_err(), "{bad}");
            assert!(sample_period(bad).is_err(), "{bad}");
        }
        assert!(format!("{}", duration(-1.0).unwrap_err()).contains("must be positive"));
        assert_eq!(duration(1.5).unwrap(), Duration::from_millis(1500));
        assert!(sample_rate(0.0).is_err() && sample_rate(1.5).is_err());
    }

    #[test]
    fn output_paths_are_checked_without_leaving_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("r.json");
        outputs(&[("--json", &fresh)]).unwrap();
        assert!(!fresh.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let missing = dir.path().join("no/such/dir/r.pb.gz");
        let error = outputs(&[("--json", &fresh), ("--pprof", &missing)]).unwrap_err();
        assert!(
            error.to_string().starts_with("cannot write --pprof"),
            "{error}"
        );
        assert!(outputs(&[("--json", dir.path())]).is_err());
    }

    #[test]
    fn the_same_file_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        let same = dir.path().join(".").join("r.json");
        let error = outputs(&[("--json", &json), ("--pprof", &same)]).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "--json and --pprof name the same file {}; give each output its own path",
                same.display()
            )
        );
        let other = dir.path().join("r.pb.gz");
        outputs(&[("--json", &json), ("--pprof", &other)]).unwrap();
        let (stdout, dash) = (Path::new("/dev/stdout"), Path::new("-"));
        let error = outputs(&[("--json", stdout), ("--pprof", dash)]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("--json and --pprof name the same file")
        );
    }

    #[test]
    fn devices_pass_without_a_temporary_and_missing_dev_paths_are_refused() {
        let null = Path::new("/dev/null");
        outputs(&[("--json", null), ("--pprof", null), ("--ready-file", null)]).unwrap();
        assert!(
            std::fs::metadata(null)
                .unwrap()
                .file_type()
                .is_char_device()
        );
        let error = outputs(&[("--json", Path::new("/dev/no-such-output"))]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--json /dev/no-such-output does not exist, and locktrace creates no files in /dev or /proc; give a file path"
        );
    }
}
