//! Writing what the user asked for to stdout without ever panicking
//! (`print!` panics when stdout is gone). A reader that went away
//! (`| head`, EPIPE) is a normal end; any other failure (`> /dev/full`) is an
//! error the caller reports in one line.
use std::io::{ErrorKind, Write};

use anyhow::{Context, Result};

pub(crate) use crate::model::diagnostics::note;

/// How a write to stdout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    All,
    /// The reader closed the pipe first; the rest was not wanted.
    ReaderGone,
}

/// Writes `bytes` to the locked stdout and flushes.
pub(crate) fn stdout(bytes: &[u8]) -> Result<Written> {
    to(&mut std::io::stdout().lock(), bytes)
}

/// Writes text for a terminal: control characters from the target's names
/// escaped, wherever a renderer placed them.
pub(crate) fn stdout_text(text: &str) -> Result<Written> {
    stdout(super::format::printable(text).as_bytes())
}

/// Writes `bytes` to `out` and flushes; EPIPE is [`Written::ReaderGone`].
pub(crate) fn to(out: &mut dyn Write, bytes: &[u8]) -> Result<Written> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(Written::All),
        Err(error) if error.kind() == ErrorKind::BrokenPipe => Ok(Written::ReaderGone),
        Err(error) => Err(error).context("cannot write to stdout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Failing(ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_is_a_normal_end_and_a_full_disk_an_error() {
        assert_eq!(
            to(&mut Failing(ErrorKind::BrokenPipe), b"x").unwrap(),
            Written::ReaderGone
        );
        let error = to(&mut Failing(ErrorKind::StorageFull), b"x").unwrap_err();
        assert!(format!("{error:#}").starts_with("cannot write to stdout"));
        assert_eq!(to(&mut Vec::new(), b"x").unwrap(), Written::All);
    }
}
