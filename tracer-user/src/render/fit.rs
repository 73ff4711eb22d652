//! Tables that fit a terminal: every text table (the lock table, the
//! waiting-for-work section, compare) is a list of [`Column`]s, each with a
//! rank saying how long it stays and how narrow it may get. When a table is
//! wider than its [`Width`], the lowest-ranked columns are shortened (with
//! `…`) or dropped first; the name column ranks highest and is cut last.
//! One row per line, numbers right-aligned. [`Fixed`] columns are the
//! other layout, for tables whose widths the caller sets (`top`).
use std::fmt::Write;

use prettytable::{Cell, Row, Table, format};

use super::format::truncate;

/// How wide a table may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// At most this many characters per line (a terminal's width; 160 in files and pipes).
    Columns(usize),
    /// Everything in full (`--wide`).
    Unlimited,
}

/// What a table is cut to when stdout is not a terminal (files, pipes, CI logs).
pub(crate) const DEFAULT_COLUMNS: usize = 160;

impl Width {
    /// For text printed on stdout: everything with `--wide`, else the
    /// terminal's width, else [`DEFAULT_COLUMNS`].
    pub(crate) fn for_stdout(wide: bool) -> Width {
        use std::io::IsTerminal;
        if wide {
            Width::Unlimited
        } else if std::io::stdout().is_terminal() {
            let columns = crossterm::terminal::size().map_or(DEFAULT_COLUMNS, |(c, _)| c.into());
            Width::Columns(columns)
        } else {
            Width::Columns(DEFAULT_COLUMNS)
        }
    }
}

/// The name column is shortened to [`NAME_SHORT_WIDTH`] once the lesser
/// columns are gone (before the main figures go), and below that only when
/// nothing else is left, never below [`NAME_MIN_WIDTH`].
const NAME_SHORT_WIDTH: usize = 32;
const NAME_SHORT_RANK: u8 = 60;
const NAME_MIN_WIDTH: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// How a column gives way when the table is too wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shrink {
    /// Dropped whole (numbers: a cut number would mislead).
    Drop,
    /// Shortened down to this many characters, then dropped.
    ThenDrop(usize),
    /// Shortened down to this many characters, never dropped (the name).
    Never(usize),
}

/// One column: its title, alignment, rank (lower ranks give way first) and
/// how it gives way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    pub title: &'static str,
    pub align: Align,
    pub rank: u8,
    pub shrink: Shrink,
    /// A first cut at a lower rank: shortened to this width at that rank.
    pub early_cut: Option<(u8, usize)>,
}

impl Column {
    /// The lock's name or identity: the row is about it, so it is cut last.
    pub(crate) fn name(title: &'static str) -> Column {
        Column {
            title,
            align: Align::Left,
            rank: u8::MAX,
            shrink: Shrink::Never(NAME_MIN_WIDTH),
            early_cut: Some((NAME_SHORT_RANK, NAME_SHORT_WIDTH)),
        }
    }

    /// A right-aligned figure, dropped whole when there is no room.
    pub(crate) fn number(title: &'static str, rank: u8) -> Column {
        Column {
            title,
            align: Align::Right,
            rank,
            shrink: Shrink::Drop,
            early_cut: None,
        }
    }

    /// Left-aligned text that is dropped whole (a kind, an address).
    pub(crate) fn label(title: &'static str, rank: u8) -> Column {
        Column {
            title,
            align: Align::Left,
            rank,
            shrink: Shrink::Drop,
            early_cut: None,
        }
    }

    /// Left-aligned text shortened to `min_width` before it is dropped (callers, holders).
    pub(crate) fn text(title: &'static str, rank: u8, min_width: usize) -> Column {
        Column {
            title,
            align: Align::Left,
            rank,
            shrink: Shrink::ThenDrop(min_width),
            early_cut: None,
        }
    }
}

/// A table fitted to a width, and what was left out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fitted {
    pub text: String,
    /// Titles of the columns dropped.
    pub dropped: Vec<&'static str>,
    /// Titles of the columns shortened.
    pub shortened: Vec<&'static str>,
}

impl Fitted {
    /// One line saying what `--wide` would add, if anything was left out:
    /// the dropped columns (lowest rank first, as many as fit in `width`)
    /// and the shortened ones.
    pub(crate) fn note(&self, width: Width) -> Option<String> {
        if self.dropped.is_empty() && self.shortened.is_empty() {
            return None;
        }
        let limit = match width {
            Width::Columns(columns) => columns,
            Width::Unlimited => usize::MAX,
        };
        let mut listed = self.dropped.len();
        loop {
            let line = self.describe(listed);
            if listed == 0 || line.chars().count() <= limit {
                return Some(line + "\n");
            }
            listed -= 1;
        }
    }

    /// The note with the first `listed` dropped columns named.
    fn describe(&self, listed: usize) -> String {
        let mut parts = Vec::new();
        if !self.dropped.is_empty() {
            let mut titles = self.dropped[..listed].to_vec();
            if listed < self.dropped.len() {
                titles.push("…");
            }
            parts.push(format!("not shown: {}", titles.join(", ")));
        }
        if !self.shortened.is_empty() {
            parts.push(format!("cut: {}", self.shortened.join(", ")));
        }
        format!("({}; --wide shows all)", parts.join("; "))
    }
}

/// A table of `columns` and `rows` (one cell per column), fitted to `width`.
pub(crate) fn fit(columns: &[Column], rows: &[Vec<String>], width: Width) -> Fitted {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| one_line(cell)).collect())
        .collect();
    let mut widths: Vec<Option<usize>> = (0..columns.len())
        .map(|at| {
            let cells = rows.iter().filter_map(|row| row.get(at));
            Some(
                cells
                    .map(|cell| cell.chars().count())
                    .chain([columns[at].title.chars().count()])
                    .max()
                    .unwrap_or(0),
            )
        })
        .collect();
    let natural = widths.clone();
    let (mut dropped, mut shortened) = (Vec::new(), Vec::new());
    if let Width::Columns(limit) = width {
        for (_, at, step) in steps(columns) {
            let over = line_width(&widths).saturating_sub(limit);
            if over == 0 {
                break;
            }
            let Some(current) = widths[at] else { continue };
            let (floor, droppable) = match step {
                Step::Cut(to) => (to.min(current), false),
                Step::Last(Shrink::Drop) => (current, true),
                Step::Last(Shrink::ThenDrop(min)) => (min.min(current), true),
                Step::Last(Shrink::Never(min)) => (min.min(current), false),
            };
            if current - floor >= over || !droppable {
                widths[at] = Some(current - over.min(current - floor));
            } else {
                widths[at] = None;
            }
        }
        give_back(columns, &natural, &mut widths, limit);
        // Lowest rank first, as they were dropped.
        let mut gone: Vec<usize> = (0..columns.len())
            .filter(|&at| widths[at].is_none())
            .collect();
        gone.sort_by_key(|&at| (columns[at].rank, std::cmp::Reverse(at)));
        dropped = gone.into_iter().map(|at| columns[at].title).collect();
        shortened = (0..columns.len())
            .filter(|&at| widths[at].is_some_and(|w| Some(w) < natural[at]))
            .map(|at| columns[at].title)
            .collect();
    }
    Fitted {
        text: draw(columns, &rows, &widths),
        dropped,
        shortened,
    }
}

/// One way a column gives way, in the order of `fit`.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Shortened to at most this width, kept.
    Cut(usize),
    /// The column's last step: its [`Shrink`].
    Last(Shrink),
}

/// Every column's steps, lowest rank first; among equals the rightmost column first.
fn steps(columns: &[Column]) -> Vec<(u8, usize, Step)> {
    let mut steps: Vec<(u8, usize, Step)> = Vec::new();
    for (at, column) in columns.iter().enumerate() {
        if let Some((rank, to)) = column.early_cut {
            steps.push((rank, at, Step::Cut(to)));
        }
        steps.push((column.rank, at, Step::Last(column.shrink)));
    }
    steps.sort_by_key(|&(rank, at, _)| (rank, std::cmp::Reverse(at)));
    steps
}

/// Room left after the drops goes back, highest rank (the name) first: to
/// dropped columns that fit again at their narrowest, then to shortened ones.
fn give_back(
    columns: &[Column],
    natural: &[Option<usize>],
    widths: &mut [Option<usize>],
    limit: usize,
) {
    let mut order: Vec<usize> = (0..columns.len()).collect();
    order.sort_by_key(|&at| (std::cmp::Reverse(columns[at].rank), at));
    for &at in &order {
        let narrowest = match columns[at].shrink {
            Shrink::Drop => natural[at],
            Shrink::ThenDrop(min) | Shrink::Never(min) => natural[at].map(|full| full.min(min)),
        };
        if widths[at].is_none() {
            widths[at] = narrowest;
            if line_width(widths) > limit {
                widths[at] = None;
            }
        }
    }
    for &at in &order {
        let room = limit.saturating_sub(line_width(widths));
        if let (Some(current), Some(full)) = (widths[at], natural[at]) {
            widths[at] = Some(current + room.min(full - current));
        }
    }
}

/// Characters per line for these column widths (`None`: dropped): ` a | b`.
fn line_width(widths: &[Option<usize>]) -> usize {
    let shown: Vec<usize> = widths.iter().flatten().copied().collect();
    (shown.iter().sum::<usize>() + 3 * shown.len()).saturating_sub(2)
}

/// Draws the kept columns with prettytable-rs (no border, a rule under the
/// titles); every cell is already cut to its column's width, so the crate's
/// column widths are exactly the fitted ones.
fn draw(columns: &[Column], rows: &[Vec<String>], widths: &[Option<usize>]) -> String {
    let kept: Vec<(usize, &Column, usize)> = columns
        .iter()
        .enumerate()
        .filter_map(|(at, column)| widths[at].map(|width| (at, column, width)))
        .collect();
    let row_of = |cells: &dyn Fn(usize) -> String| -> Row {
        Row::new(
            kept.iter()
                .map(|&(at, column, width)| {
                    let cell = Cell::new(&truncate(&cells(at), width));
                    match column.align {
                        Align::Left => cell,
                        Align::Right => cell.style_spec("r"),
                    }
                })
                .collect(),
        )
    };
    let mut table = Table::new();
    table.set_format(*format::consts::FORMAT_NO_BORDER_LINE_SEPARATOR);
    table.set_titles(row_of(&|at| columns[at].title.to_string()));
    for row in rows {
        table.add_row(row_of(&|at| row.get(at).cloned().unwrap_or_default()));
    }
    let mut out = String::new();
    for (index, line) in table.to_string().lines().enumerate() {
        // Rows end at their last character; the rule under the titles is as
        // wide as the rows (the crate pads the last cell and the rule too).
        let line = match index {
            1 => line.strip_suffix('-').unwrap_or(line),
            _ => line.trim_end(),
        };
        let _ = writeln!(out, "{line}");
    }
    out
}

/// A column of a table laid out at widths the caller chose (`top`: from
/// the screen, not from the cells), drawn without rule or `|`: its cells
/// [`Align`]ed in `width` characters, cut to them (with `…`) when `cut`,
/// `gap` spaces after the column before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fixed {
    pub align: Align,
    pub width: usize,
    pub cut: bool,
    pub gap: usize,
}

impl Fixed {
    pub(crate) const fn left(width: usize) -> Fixed {
        Fixed {
            align: Align::Left,
            width,
            cut: false,
            gap: 1,
        }
    }

    pub(crate) const fn right(width: usize) -> Fixed {
        Fixed {
            align: Align::Right,
            ..Fixed::left(width)
        }
    }

    /// Cells longer than the width are cut to it.
    pub(crate) const fn cut(self) -> Fixed {
        Fixed { cut: true, ..self }
    }

    /// `gap` spaces before the column instead of one.
    pub(crate) const fn after(self, gap: usize) -> Fixed {
        Fixed { gap, ..self }
    }
}

/// One line of a [`Fixed`] table, a cell per column; a cell wider than
/// an uncut column overflows it, a left-aligned last cell is not padded.
pub(crate) fn fixed_line(columns: &[Fixed], cells: &[impl AsRef<str>]) -> String {
    let mut line = String::new();
    for (at, (column, cell)) in columns.iter().zip(cells).enumerate() {
        if at > 0 {
            line.extend(std::iter::repeat_n(' ', column.gap));
        }
        let cell = cell.as_ref();
        let cell = if column.cut {
            super::format::cut(cell, column.width)
        } else {
            cell.to_string()
        };
        let width = column.width;
        let _ = match column.align {
            Align::Left if at + 1 == columns.len() => write!(line, "{cell}"),
            Align::Left => write!(line, "{cell:<width$}"),
            Align::Right => write!(line, "{cell:>width$}"),
        };
    }
    line
}

/// Cells are one line: control characters (from a hand-edited report) become spaces.
fn one_line(cell: &str) -> String {
    cell.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (Vec<Column>, Vec<Vec<String>>) {
        let columns = vec![
            Column::name("name"),
            Column::number("count", 90),
            Column::number("wakes", 20),
            Column::text("callers", 10, 8),
        ];
        let rows = vec![vec![
            "a_rather_long_lock_name_that_matters".to_string(),
            "12345".to_string(),
            "7".to_string(),
            "caller_one, caller_two".to_string(),
        ]];
        (columns, rows)
    }

    #[test]
    fn fits_by_cutting_the_lesser_columns_first() {
        let (columns, rows) = table();
        let wide = fit(&columns, &rows, Width::Unlimited);
        assert!(wide.note(Width::Unlimited).is_none());
        let full = crate::render::format::width(&wide.text);
        // Callers shortened first, by exactly what is too much.
        let fitted = fit(&columns, &rows, Width::Columns(full - 5));
        assert_eq!(crate::render::format::width(&fitted.text), full - 5);
        assert_eq!(fitted.shortened, ["callers"]);
        assert!(fitted.dropped.is_empty());
        // Narrower: callers and wakes dropped, then the name shortened.
        let narrow = fit(&columns, &rows, Width::Columns(42));
        assert_eq!(narrow.dropped, ["callers", "wakes"]);
        assert_eq!(narrow.shortened, ["name"]);
        assert_eq!(crate::render::format::width(&narrow.text), 42);
        assert!(
            narrow
                .text
                .contains(" a_rather_long_lock_name_that_mat… | 12345"),
            "{}",
            narrow.text
        );
        let note = narrow.note(Width::Unlimited).unwrap();
        assert_eq!(
            note,
            "(not shown: callers, wakes; cut: name; --wide shows all)\n"
        );
        // Below its short width the name goes only after every other column;
        // the room a drop frees goes back to it.
        let narrower = fit(&columns, &rows, Width::Columns(40));
        assert_eq!(narrower.dropped, ["callers", "wakes", "count"]);
        assert_eq!(
            narrower.text.lines().nth(2),
            Some(" a_rather_long_lock_name_that_matters")
        );
        // A note too long for the width names fewer columns.
        let short = narrower.note(Width::Columns(41)).unwrap();
        assert_eq!(short, "(not shown: callers, …; --wide shows all)\n");
    }

    #[test]
    fn the_name_is_never_cut_below_its_minimum() {
        let (columns, rows) = table();
        let fitted = fit(&columns, &rows, Width::Columns(5));
        assert_eq!(fitted.text.lines().nth(2), Some(" a_rather_long_l…"));
    }

    #[test]
    fn fixed_lines_pad_cut_and_leave_the_last_cell_unpadded() {
        let columns = [
            Fixed::left(5).cut(),
            Fixed::right(4),
            Fixed::left(3).after(2),
        ];
        assert_eq!(fixed_line(&columns, &["ab", "7", "x"]), "ab       7  x");
        assert_eq!(
            fixed_line(&columns, &["abcdefg", "123456", "wxyz"]),
            "abcd… 123456  wxyz"
        );
    }

    #[test]
    fn a_cell_stays_on_one_line() {
        let columns = vec![Column::name("name")];
        let fitted = fit(&columns, &[vec!["two\nlines".into()]], Width::Unlimited);
        assert_eq!(fitted.text.lines().count(), 3, "{}", fitted.text);
    }
}

/// `text` with every line wider than `width` broken at spaces, the rest of
/// it on lines indented by two spaces (footers and notes: the tables are
/// already fitted). A word longer than a line (a path) is broken inside.
pub(crate) fn wrap_lines(text: &str, width: Width) -> String {
    let Width::Columns(columns) = width else {
        return text.to_string();
    };
    let columns = columns.max(20);
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        if body.chars().count() <= columns {
            out.push_str(line);
            continue;
        }
        for (index, piece) in wrapped(body, columns).iter().enumerate() {
            if index > 0 {
                out.push_str("\n  ");
            }
            out.push_str(piece);
        }
        out.push_str(newline);
    }
    out
}

/// The pieces of one long line: the first up to `columns` characters, the
/// others up to `columns - 2` (they are indented).
fn wrapped(line: &str, columns: usize) -> Vec<String> {
    let mut pieces: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut room = columns;
    for word in line.split(' ') {
        let mut word = word.to_string();
        loop {
            let needed =
                current.chars().count() + usize::from(!current.is_empty()) + word.chars().count();
            if needed <= room {
                if !current.is_empty() {
                    current.push(' ');
                }
                current.push_str(&word);
                break;
            }
            if !current.is_empty() {
                pieces.push(std::mem::take(&mut current));
                room = columns - 2;
                continue;
            }
            // A word longer than a whole line.
            let head: String = word.chars().take(room).collect();
            word = word.chars().skip(room).collect();
            pieces.push(head);
            room = columns - 2;
        }
    }
    if !current.is_empty() || pieces.is_empty() {
        pieces.push(current);
    }
    pieces
}

#[cfg(test)]
mod wrap_tests {
    use super::*;

    #[test]
    fn long_lines_break_at_spaces_indented_and_short_ones_stay() {
        let text = "short\nnames: 4 modules in 397 ms; pointer chains: no heap locks to name\n";
        let wrapped = wrap_lines(text, Width::Columns(30));
        assert_eq!(
            wrapped,
            "short\nnames: 4 modules in 397 ms;\n  pointer chains: no heap\n  locks to name\n"
        );
        for line in wrapped.lines() {
            assert!(line.chars().count() <= 30, "{line:?}");
        }
        assert_eq!(wrap_lines(text, Width::Unlimited), text);
    }

    #[test]
    fn a_word_longer_than_the_line_is_cut_inside() {
        let path = format!("file: /{}", "a".repeat(50));
        let wrapped = wrap_lines(&path, Width::Columns(20));
        assert!(
            wrapped.lines().all(|line| line.chars().count() <= 20),
            "{wrapped}"
        );
        assert_eq!(
            wrapped.replace("\n  ", "").replace(' ', ""),
            path.replace(' ', "")
        );
    }
}
