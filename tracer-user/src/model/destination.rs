//! Where an output file (`--json`, `--pprof`, `--ready-file`) goes, decided
//! from what is at its path. Only a regular file (or nothing) is replaced by
//! a temporary file renamed over it; a device, FIFO or socket (`/dev/null`,
//! a tty, a named pipe) and anything under `/dev` or `/proc` is written
//! through, because renaming over `/dev/null` or the `/dev/stdout` symlink
//! damages the system for every user. `-` and `/dev/stdout` mean stdout.
use std::{
    fs::OpenOptions,
    io::{ErrorKind, Write},
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// How an output path is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Destination {
    /// `-` or `/dev/stdout`: this process's stdout.
    Stdout,
    /// An existing device, FIFO or socket, or a path in `/dev` or `/proc`:
    /// opened for writing (appending, so a regular file behind `/dev/stderr`
    /// keeps what was written before), never created or replaced.
    WriteThrough(PathBuf),
    /// A regular file, a symlink to one, or nothing yet: a temporary file in
    /// the same directory, renamed over the path.
    Replace(PathBuf),
}

impl Destination {
    /// Decides from the path as it is now (nothing is created).
    pub(crate) fn of(path: &Path) -> Destination {
        if path == Path::new("-") || path == Path::new("/dev/stdout") {
            return Destination::Stdout;
        }
        // Following symlinks: `/dev/stderr` is a symlink to a tty or pipe.
        let special = std::fs::metadata(path).is_ok_and(|meta| {
            let kind = meta.file_type();
            kind.is_char_device() || kind.is_block_device() || kind.is_fifo() || kind.is_socket()
        });
        if special || in_system_tree(path) {
            Destination::WriteThrough(path.to_path_buf())
        } else {
            Destination::Replace(path.to_path_buf())
        }
    }

    /// Writes all of `bytes` to the destination.
    pub(crate) fn write(&self, bytes: &[u8]) -> Result<()> {
        match self {
            Destination::Stdout => {
                let mut out = std::io::stdout().lock();
                match out.write_all(bytes).and_then(|()| out.flush()) {
                    // A reader that went away is a normal end, as for the table.
                    Err(error) if error.kind() != ErrorKind::BrokenPipe => {
                        Err(error).context("cannot write to stdout")
                    }
                    _ => Ok(()),
                }
            }
            Destination::WriteThrough(path) => OpenOptions::new()
                .append(true)
                // A FIFO with no reader would block the stop for ever.
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
                .and_then(|mut file| file.write_all(bytes))
                .with_context(|| format!("cannot write {}", path.display())),
            Destination::Replace(path) => replace_file(path, bytes),
        }
    }
}

/// A path whose directory is `/dev` or `/proc` (after resolving symlinks in
/// the directory): nothing there may be renamed over. `/dev/shm` is a
/// plain tmpfs for files, and is not.
fn in_system_tree(path: &Path) -> bool {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    directory.canonicalize().is_ok_and(|dir| {
        (dir.starts_with("/dev") && !dir.starts_with("/dev/shm")) || dir.starts_with("/proc")
    })
}

/// Writes `bytes` to a new temporary file in `path`'s directory, then renames
/// it over `path`. The rename replaces a symlink at `path` instead of writing
/// through it (root must not overwrite the file another user's symlink
/// points to), and a reader never sees a half-written file.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut file = tempfile::NamedTempFile::new_in(directory)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // Readable like a file written the usual way, not the temporary's 0600.
    let readable = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    file.write_all(bytes)
        .and_then(|()| file.as_file().set_permissions(readable))
        .and_then(|()| file.as_file().sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.persist(path)
        .map_err(|error| error.error)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Writes an output file the way its path calls for (see [`Destination`]).
pub(crate) fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    Destination::of(path).write(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn an_output_replaces_a_symlink_instead_of_writing_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let output = dir.path().join("report.json");
        std::os::unix::fs::symlink(&victim, &output).unwrap();
        write_output(&output, b"report").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!output.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&output).unwrap(), b"report");
        // Only the two files: no temporary left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn dev_null_and_dev_stdout_are_written_through_not_replaced() {
        let null = Path::new("/dev/null");
        let before = std::fs::metadata(null).unwrap();
        assert_eq!(
            Destination::of(null),
            Destination::WriteThrough(null.into())
        );
        write_output(null, b"gone").unwrap();
        let after = std::fs::metadata(null).unwrap();
        assert!(after.file_type().is_char_device());
        assert_eq!((before.ino(), before.mode()), (after.ino(), after.mode()));
        assert_eq!(Destination::of(Path::new("-")), Destination::Stdout);
        assert_eq!(
            Destination::of(Path::new("/dev/stdout")),
            Destination::Stdout
        );
        // /dev/stderr is a symlink whatever fd 2 is; it must stay one.
        assert!(matches!(
            Destination::of(Path::new("/dev/stderr")),
            Destination::WriteThrough(_)
        ));
    }

    #[test]
    fn a_fifo_is_written_through_and_a_regular_file_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert_eq!(
            Destination::of(&fifo),
            Destination::WriteThrough(fifo.clone())
        );
        // No reader: refused at once (ENXIO), not a hang, and still a FIFO.
        assert!(write_output(&fifo, b"x").is_err());
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo()
        );
        let plain = dir.path().join("r.json");
        assert_eq!(Destination::of(&plain), Destination::Replace(plain.clone()));
        let shared = Path::new("/dev/shm/locktrace-report.json");
        assert_eq!(Destination::of(shared), Destination::Replace(shared.into()));
    }
}
