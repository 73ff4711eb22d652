//! One way out for every format of a report (as py-spy has one recorder per
//! format): [`OutputFormat`] names the format, [`OutputFormat::render`] gives
//! its text or bytes, and [`write`] hands them to a [`Sink`]: the command's
//! stdout, stderr, or an output flag's path (written as
//! [`crate::model::Destination`] decides: devices and symlinks are never
//! replaced, `-` is stdout, a closed pipe is a normal end).
use std::path::Path;

use anyhow::{Result, bail};

use super::{fit::Width, holds, output, output::Written, pprof, stacks, table};
use crate::model::Report;

/// The formats a report is written in (`report --format`, and the files
/// `record --json`/`--pprof` write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Table,
    Folded,
    Svg,
    /// Gzipped pprof protobuf (`go tool pprof`, Pyroscope, Parca).
    Pprof,
    /// The report itself, as `record --json` saves it (`report` reads it).
    Json,
}

/// What the table shows; the other formats show the whole report.
#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    /// At most this many locks (None: all).
    pub top: Option<usize>,
    pub width: Width,
    /// Every lock's wait (and hold) histogram in full under the table.
    pub histograms: bool,
}

impl TableOptions {
    /// All locks, every column in full, no histograms (for the file formats).
    pub const FULL: TableOptions = TableOptions {
        top: None,
        width: Width::Unlimited,
        histograms: false,
    };
}

/// A rendered report: text (escaped for a terminal on stdout) or binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendered {
    Text(String),
    Binary(Vec<u8>),
}

impl OutputFormat {
    /// The report in this format.
    pub fn render(self, report: &Report, table: &TableOptions) -> Result<Rendered> {
        Ok(match self {
            OutputFormat::Table => {
                let mut text = table::render(report, table.top, table.width);
                if table.histograms {
                    text.push_str(&holds::render_histograms(report, table.top));
                }
                Rendered::Text(text)
            }
            OutputFormat::Folded => Rendered::Text(stacks::folded(report)?),
            OutputFormat::Svg => {
                let mut bytes = Vec::new();
                stacks::write_svg(report, &mut bytes)?;
                Rendered::Text(String::from_utf8_lossy(&bytes).into_owned())
            }
            OutputFormat::Pprof => {
                let mut bytes = Vec::new();
                pprof::write(report, &mut bytes)?;
                Rendered::Binary(bytes)
            }
            OutputFormat::Json => Rendered::Text(serde_json::to_string_pretty(report)? + "\n"),
        })
    }

    fn is_binary(self) -> bool {
        self == OutputFormat::Pprof
    }
}

/// Where a rendered output goes.
#[derive(Debug, Clone, Copy)]
pub enum Sink<'a> {
    /// The command's own stdout: text escaped for a terminal (control
    /// characters from the target's names), binary refused on a terminal.
    Stdout,
    /// stderr, as one note (the table when `--json -` has stdout).
    Stderr,
    /// An output flag's path (`--json`, `--pprof`), bytes as rendered.
    File(&'a Path),
}

impl Sink<'_> {
    /// Writes text (a report's, or another command's: `compare`, `top`).
    pub(crate) fn text(self, text: &str) -> Result<Written> {
        self.rendered(&Rendered::Text(text.to_string()))
    }

    /// Writes a rendered output.
    pub(crate) fn rendered(self, rendered: &Rendered) -> Result<Written> {
        match (self, rendered) {
            (Sink::Stdout, Rendered::Text(text)) => output::stdout_text(text),
            (Sink::Stdout, Rendered::Binary(bytes)) => output::stdout(bytes),
            (Sink::Stderr, Rendered::Text(text)) => {
                output::note(format_args!("{}", text.trim_end()));
                Ok(Written::All)
            }
            (Sink::Stderr, Rendered::Binary(_)) => {
                bail!("binary output cannot go to stderr")
            }
            (Sink::File(path), Rendered::Text(text)) => {
                crate::model::write_output(path, text.as_bytes()).map(|()| Written::All)
            }
            (Sink::File(path), Rendered::Binary(bytes)) => {
                crate::model::write_output(path, bytes).map(|()| Written::All)
            }
        }
    }
}

/// Writes `report` in `format` to `sink`: the one output path of every
/// command. Binary data is refused on a terminal stdout before anything
/// is rendered.
pub fn write(
    report: &Report,
    format: OutputFormat,
    table: &TableOptions,
    sink: Sink,
) -> Result<Written> {
    if matches!(sink, Sink::Stdout)
        && format.is_binary()
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
    {
        bail!("--format pprof writes binary data: redirect it to a file (> FILE.pb.gz)")
    }
    sink.rendered(&format.render(report, table)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file output is the rendered bytes as they are; the JSON reads back.
    #[test]
    fn files_get_the_rendered_bytes_and_json_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let report = Report::empty_for_tests("all");
        let save = |format, name: &str| {
            let path = dir.path().join(name);
            write(&report, format, &TableOptions::FULL, Sink::File(&path)).unwrap();
            path
        };
        let path = save(OutputFormat::Json, "r.json");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("}\n"));
        assert_eq!(Report::load(&path).unwrap().duration_s, report.duration_s);
        let pprof = save(OutputFormat::Pprof, "r.pb.gz");
        // gzip magic.
        assert_eq!(std::fs::read(&pprof).unwrap()[..2], [0x1f, 0x8b]);
    }

    #[test]
    fn folded_and_svg_refuse_a_report_without_stacks() {
        let report = Report::empty_for_tests("all");
        for format in [OutputFormat::Folded, OutputFormat::Svg] {
            let error = format.render(&report, &TableOptions::FULL).unwrap_err();
            assert!(error.to_string().contains("record with --stacks N"));
        }
    }
}
