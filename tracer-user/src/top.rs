//! `locktrace top`: a live table of the busiest locks, refreshed every second,
//! with the busiest kernel locks under it.
//! On a terminal it takes the full screen (crossterm: alternate screen, raw
//! mode, restored on every way out); `s` cycles the sort key, `q` or Ctrl-C
//! quits. When stdout is not a terminal it prints one plain table per second.
use std::{
    fmt::Write as _,
    io::{IsTerminal, Write},
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::Result;
use crossterm::{
    cursor, event, execute, queue,
    style::Print,
    terminal::{self, ClearType},
};

use crate::{
    live::{self, Interval, LiveOptions, LiveSession, LockActivity},
    model::{RouteKind, WaitClass},
    render::{
        Sink,
        fit::{Fixed, Width, fixed_line},
        format::{self, cut},
        in_progress,
        output::Written,
        routes,
    },
};

/// Rows of the plain (not a terminal) table per interval.
const PLAIN_ROWS: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SortKey {
    Acquisitions,
    Contended,
    Wait,
    Cpu,
    Name,
}

impl SortKey {
    fn next(self) -> SortKey {
        match self {
            SortKey::Acquisitions => SortKey::Contended,
            SortKey::Contended => SortKey::Wait,
            SortKey::Wait => SortKey::Cpu,
            SortKey::Cpu => SortKey::Name,
            SortKey::Name => SortKey::Acquisitions,
        }
    }

    fn title(self) -> &'static str {
        match self {
            SortKey::Acquisitions => "acq/s",
            SortKey::Contended => "contended/s",
            SortKey::Wait => "wait ms/s",
            SortKey::Cpu => "cpu ms/s",
            SortKey::Name => "lock name",
        }
    }

    fn sort(self, locks: &mut [LockActivity]) {
        locks.sort_by(|a, b| {
            let order = match self {
                SortKey::Acquisitions => b.acquisitions.cmp(&a.acquisitions),
                SortKey::Contended => b.contended.cmp(&a.contended),
                SortKey::Wait => b.wait_ns.cmp(&a.wait_ns),
                SortKey::Cpu => b.cpu_ns.cmp(&a.cpu_ns),
                SortKey::Name => a.label.cmp(&b.label),
            };
            order.then(a.address.cmp(&b.address))
        });
    }
}

pub(crate) async fn run(options: &LiveOptions) -> Result<ExitCode> {
    let stop = live::stop_requested();
    tokio::pin!(stop);
    let mut session = LiveSession::attach(options)?;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    if !std::io::stdout().is_terminal() {
        crate::render::output::note(format_args!(
            "locktrace: top of pid {} ({}): {} probes live after {} ms; a table per second, Ctrl-C to stop{}",
            session.target.pid,
            session.target.exe,
            session.probe_count,
            session.attach_ms,
            session.request_probe_note()
        ));
        loop {
            tokio::select! {
                result = &mut stop => { result?; return Ok(ExitCode::SUCCESS); }
                _ = tick.tick() => {
                    if !session.target.is_alive() {
                        crate::render::output::note(format_args!("{}", live::target_exited(session.target.pid)));
                        return Ok(ExitCode::FAILURE);
                    }
                    let mut interval = session.tick()?;
                    SortKey::Acquisitions.sort(&mut interval.locks);
                    let text = plain(&session, &interval, started.elapsed());
                    // A closed pipe (| head), or any stdout that fails, ends top quietly.
                    if !matches!(Sink::Stdout.text(&text), Ok(Written::All)) {
                        return Ok(ExitCode::SUCCESS);
                    }
                }
            }
        }
    }

    let screen = Screen::enter()?;
    let mut keys = key_events();
    let mut sort = SortKey::Acquisitions;
    let mut last: Option<Interval> = None;
    let outcome = loop {
        tokio::select! {
            result = &mut stop => break result.map(|_| ExitCode::SUCCESS),
            key = keys.recv() => match key {
                Some(Key::Quit) | None => break Ok(ExitCode::SUCCESS),
                Some(Key::Sort) => sort = sort.next(),
                Some(Key::Redraw) => {}
            },
            _ = tick.tick() => {
                if !session.target.is_alive() {
                    drop(screen);
                    crate::render::output::note(format_args!("{}", live::target_exited(session.target.pid)));
                    return Ok(ExitCode::FAILURE);
                }
                match session.tick() {
                    Ok(interval) => last = Some(interval),
                    Err(error) => break Err(error),
                }
            }
        }
        if let Some(interval) = &mut last {
            sort.sort(&mut interval.locks);
            let (width, height) = terminal::size().unwrap_or((80, 24));
            let lines = full_screen(&session, interval, sort, width as usize, height as usize);
            screen.draw(&lines)?;
        }
    };
    drop(screen);
    outcome
}

enum Key {
    Quit,
    Sort,
    Redraw,
}

/// Key presses, read on a thread of their own (crossterm's reads block).
fn key_events() -> tokio::sync::mpsc::UnboundedReceiver<Key> {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        use event::{Event, KeyCode, KeyEventKind, KeyModifiers};
        while let Ok(event) = event::read() {
            let key = match event {
                Event::Key(key) if key.kind != KeyEventKind::Release => match key.code {
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                        Key::Quit
                    }
                    KeyCode::Char('q') | KeyCode::Esc => Key::Quit,
                    KeyCode::Char('s') | KeyCode::Tab => Key::Sort,
                    _ => continue,
                },
                Event::Resize(..) => Key::Redraw,
                _ => continue,
            };
            if sender.send(key).is_err() {
                break;
            }
        }
    });
    receiver
}

/// The terminal in full-screen mode; dropping it restores the terminal.
struct Screen;

impl Screen {
    fn enter() -> Result<Screen> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide,
            terminal::Clear(ClearType::All)
        )?;
        Ok(screen)
    }

    fn draw(&self, lines: &[String]) -> Result<()> {
        let mut stdout = std::io::stdout().lock();
        for (row, line) in lines.iter().enumerate() {
            queue!(
                stdout,
                cursor::MoveTo(0, row as u16),
                Print(crate::render::format::printable(line)),
                terminal::Clear(ClearType::UntilNewLine)
            )?;
        }
        queue!(
            stdout,
            cursor::MoveTo(0, lines.len() as u16),
            terminal::Clear(ClearType::FromCursorDown)
        )?;
        stdout.flush()?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

/// The table's titles, a cell per column.
const TITLES: [&str; 7] = [
    "lock",
    "kind",
    "acq/s",
    "cont/s",
    "wait ms/s",
    "cpu ms/s",
    "top caller",
];

/// The plain table's columns (the full screen's depend on its width).
const PLAIN_COLUMNS: [Fixed; 7] = [
    Fixed::left(32),
    Fixed::left(6),
    Fixed::right(10),
    Fixed::right(10),
    Fixed::right(10),
    Fixed::right(10),
    Fixed::left(0).after(2),
];

/// One lock's row: its label, kind, per-second rates and top caller.
fn row_cells(lock: &LockActivity, seconds: f64) -> [String; 7] {
    let rate = |n: u64| n as f64 / seconds;
    [
        lock.label.clone(),
        lock.kind.to_string(),
        lock.acquisitions
            .map_or_else(|| "-".into(), |n| format_rate(rate(n))),
        format_rate(rate(lock.contended)),
        format!("{:.1}", rate(lock.wait_ns) / 1e6),
        format!("{:.1}", rate(lock.cpu_ns) / 1e6),
        lock.top_caller.clone().unwrap_or_else(|| "-".into()),
    ]
}

/// Kernel lock rows shown under the lock rows (the busiest by wait).
const KERNEL_ROWS: usize = 5;

/// The kernel locks' titles and columns (under the lock table, plain and
/// full screen alike; the full screen cuts the lines to its width).
const KERNEL_TITLES: [&str; 5] = ["kernel lock", "kind", "cont/s", "wait ms/s", "kernel site"];
const KERNEL_COLUMNS: [Fixed; 5] = [
    Fixed::left(32).cut(),
    Fixed::left(18),
    Fixed::right(10),
    Fixed::right(10),
    Fixed::left(0).after(2),
];

/// The kernel locks under the lock rows: what the interval's busiest
/// kernel locks did (the section's one line when the kernel has no lock
/// tracepoints); nothing while no kernel lock was contended.
fn kernel_lines(interval: &Interval, seconds: f64) -> Vec<String> {
    if let Some(reason) = interval
        .kernel_locks
        .as_ref()
        .and_then(|section| section.unavailable.as_ref())
    {
        return vec![format!("kernel locks: unavailable: {reason}")];
    }
    if interval.kernel_activity.is_empty() {
        return Vec::new();
    }
    let rate = |n: u64| n as f64 / seconds;
    let mut lines = vec![fixed_line(&KERNEL_COLUMNS, &KERNEL_TITLES)];
    for lock in interval.kernel_activity.iter().take(KERNEL_ROWS) {
        let cells = [
            lock.name
                .clone()
                .unwrap_or_else(|| format!("? {:#x}", lock.address)),
            lock.kind.word().to_string(),
            format_rate(rate(lock.contentions)),
            format!("{:.1}", rate(lock.wait_ns) / 1e6),
            lock.kernel_site.clone().unwrap_or_else(|| "-".into()),
        ];
        lines.push(fixed_line(&KERNEL_COLUMNS, &cells));
    }
    if interval.kernel_activity.len() > KERNEL_ROWS {
        lines.push(format!(
            "(+{} more kernel locks)",
            interval.kernel_activity.len() - KERNEL_ROWS
        ));
    }
    lines
}

fn format_rate(rate: f64) -> String {
    if rate >= 10_000_000.0 {
        format!("{:.0}M", rate / 1e6)
    } else if rate >= 100_000.0 {
        format!("{:.0}k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

/// Routes shown under the header with `--php` (most requests first).
const ROUTES_SHOWN: usize = 3;

/// Lines under the header: waits that are not lock contention (per class,
/// as `record` classifies them), the busiest routes (`--php`) and what the
/// tracer lost since attach.
fn notes(interval: &Interval, seconds: f64) -> Vec<String> {
    let mut notes = Vec::new();
    let mut by_class: std::collections::BTreeMap<WaitClass, (u64, u64)> = Default::default();
    for wait in &interval.other_waits {
        let class = by_class.entry(wait.wait_class).or_default();
        class.0 += wait.contended;
        class.1 += wait.wait_ns;
    }
    if !by_class.is_empty() {
        let classes: Vec<String> = by_class
            .iter()
            .map(|(class, (waits, wait_ns))| {
                format!(
                    "{class} {} waits/s {:.1} wait ms/s",
                    format_rate(*waits as f64 / seconds),
                    *wait_ns as f64 / seconds / 1e6
                )
            })
            .collect();
        notes.push(format!("not contention: {}", classes.join("; ")));
    }
    if let Some(longest) = interval.long_waits.first() {
        let more = match interval.long_waits.len() {
            1 => String::new(),
            n => format!(" ({} more lock waits over 1 s)", n - 1),
        };
        notes.push(format!(
            "longest lock wait now: {}{more}",
            in_progress::wait_line(longest)
        ));
    }
    notes.extend(in_progress::deadlock_lines(&interval.deadlocks));
    // `--php`: the busiest routes since attach, as `record` prints them.
    let busiest = interval
        .routes
        .iter()
        .flat_map(|routes| &routes.routes)
        .filter(|route| route.kind == RouteKind::Route)
        .take(ROUTES_SHOWN);
    notes.extend(busiest.map(|route| format!("route {}", routes::line(route, Width::Unlimited))));
    if !interval.dropped.is_empty() {
        let reasons: Vec<String> = interval
            .dropped
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        notes.push(format!(
            "lost since attach: {} (figures above incomplete)",
            reasons.join(", ")
        ));
    }
    notes
}

/// A lock's top stack as a line under its row: its frames folded
/// (outermost first, `;` between), cut at the front to `width` so the
/// frames nearest the lock stay.
fn stack_line(frames: &[String], width: usize) -> String {
    let prefix = "    stack ";
    let folded = frames.join(";");
    let room = width.saturating_sub(prefix.chars().count());
    let count = folded.chars().count();
    if count <= room {
        return format!("{prefix}{folded}");
    }
    let kept: String = folded
        .chars()
        .skip(count - room.saturating_sub(1))
        .collect();
    format!("{prefix}…{kept}")
}

/// The lines of the full-screen view, each at most `width` wide, at most `height` of them.
fn full_screen(
    session: &LiveSession,
    interval: &Interval,
    sort: SortKey,
    width: usize,
    height: usize,
) -> Vec<String> {
    let seconds = interval.elapsed.as_secs_f64().max(1e-3);
    let mut status = format!(
        "locktrace top · pid {} {} · mode {} · probe hits {} ≈ {} added",
        session.target.pid,
        crate::render::format::short_module(&session.target.exe),
        format!("{:?}", session.mode).to_lowercase(),
        interval.cost.probe_hits,
        format::duration(interval.cost.estimated_added_ns),
    );
    if let Some(requests) = interval.requests {
        let _ = write!(
            status,
            " · {} req/s",
            format_rate(requests as f64 / seconds)
        );
    }
    let help = format!(
        "sorted by {} · s: change sort · q: quit · {} active locks",
        sort.title(),
        interval.locks.len()
    );
    // Fixed columns: kind 6, acq/s 8, contended/s 8, wait ms/s 9, cpu ms/s 8, and 6 gaps.
    let fixed = 6 + 8 + 8 + 9 + 8 + 6;
    let flexible = width.saturating_sub(fixed).max(20);
    let name_width = flexible * 11 / 20;
    let columns = [
        Fixed::left(name_width).cut(),
        Fixed::left(6).cut(),
        Fixed::right(8),
        Fixed::right(8),
        Fixed::right(9),
        Fixed::right(8),
        Fixed::left(flexible - name_width).cut(),
    ];
    let row = |cells: &[String]| cut(&fixed_line(&columns, cells), width);
    let mut lines = vec![cut(&status, width), cut(&help, width)];
    lines.extend(notes(interval, seconds).iter().map(|note| cut(note, width)));
    lines.push(row(&TITLES.map(String::from)));
    for lock in &interval.locks {
        if lines.len() >= height {
            break;
        }
        lines.push(row(&row_cells(lock, seconds)));
        if let Some(frames) = lock.top_stack.as_ref().filter(|_| lines.len() < height) {
            lines.push(stack_line(frames, width));
        }
    }
    for line in kernel_lines(interval, seconds) {
        if lines.len() >= height {
            break;
        }
        lines.push(cut(&line, width));
    }
    lines
}

/// One plain table (for a pipe or a file): a header line, then a row per lock.
fn plain(session: &LiveSession, interval: &Interval, since_attach: Duration) -> String {
    let seconds = interval.elapsed.as_secs_f64().max(1e-3);
    let mut out = format!(
        "# {:.0}s pid {} mode {} probe_hits {}{}\n",
        since_attach.as_secs_f64(),
        session.target.pid,
        format!("{:?}", session.mode).to_lowercase(),
        interval.cost.probe_hits,
        interval
            .requests
            .map(|n| format!(" req/s {}", format_rate(n as f64 / seconds)))
            .unwrap_or_default()
    );
    for note in notes(interval, seconds) {
        let _ = writeln!(out, "{note}");
    }
    let _ = writeln!(out, "{}", fixed_line(&PLAIN_COLUMNS, &TITLES));
    for lock in interval.locks.iter().take(PLAIN_ROWS) {
        let _ = writeln!(
            out,
            "{}",
            fixed_line(&PLAIN_COLUMNS, &row_cells(lock, seconds))
        );
        if let Some(frames) = &lock.top_stack {
            let _ = writeln!(out, "{}", stack_line(frames, usize::MAX));
        }
    }
    if interval.locks.len() > PLAIN_ROWS {
        let _ = writeln!(out, "(+{} more)", interval.locks.len() - PLAIN_ROWS);
    }
    for line in kernel_lines(interval, seconds) {
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_key_cycles_through_all_five() {
        let mut key = SortKey::Acquisitions;
        let mut seen = vec![key];
        for _ in 0..4 {
            key = key.next();
            seen.push(key);
        }
        assert_eq!(key.next(), SortKey::Acquisitions);
        seen.dedup();
        assert_eq!(seen.len(), 5);
    }

    #[test]
    fn notes_say_what_is_not_contention_and_what_was_lost() {
        let condvar = LockActivity {
            address: 0x10,
            label: "g_pool.work".into(),
            kind: crate::model::LockKind::Condvar,
            wait_class: WaitClass::Condvar,
            module: None,
            top_caller: None,
            acquisitions: None,
            contended: 20,
            wait_ns: 2_000_000_000,
            cpu_ns: 0,
            top_stack: None,
            kernel_contentions: 0,
            kernel_wait_ns: 0,
        };
        let interval = Interval {
            other_waits: vec![condvar],
            dropped: [(crate::model::DropReason::LocksMapFull, 4464)].into(),
            ..Interval::empty(Duration::from_secs(2))
        };
        assert_eq!(
            notes(&interval, 2.0),
            vec![
                "not contention: condvar 10 waits/s 1000.0 wait ms/s".to_string(),
                "lost since attach: locks_map_full 4464 (figures above incomplete)".to_string(),
            ]
        );
    }

    /// The kernel locks under the table: the interval's rows as rates
    /// (a 2 s interval halves the counts), the busiest first, the rest
    /// counted; the one line when the kernel has no lock tracepoints.
    #[test]
    fn kernel_lines_give_each_kernel_locks_rates() {
        use crate::model::{KernelLockKind, KernelLocks};
        let row = |name: Option<&str>, flags, contentions, wait_ns| live::KernelLockActivity {
            address: 0xffff_8881_0000_0000 + u64::from(flags),
            flags,
            name: name.map(str::to_string),
            kind: KernelLockKind::of_flags(flags),
            contentions,
            wait_ns,
            kernel_site: name.map(|_| "__vm_munmap".to_string()),
        };
        let mut interval = Interval {
            kernel_locks: Some(KernelLocks::default()),
            ..Interval::empty(Duration::from_secs(2))
        };
        assert_eq!(kernel_lines(&interval, 2.0), Vec::<String>::new());
        interval.kernel_activity = vec![
            row(Some("mmap_lock"), 4, 240, 74_200_000),
            row(None, 1, 6, 3_000),
        ];
        interval
            .kernel_activity
            .extend((0..5).map(|n| row(Some("runqueue"), 1, 2, 10 - n)));
        let lines = kernel_lines(&interval, 2.0);
        assert_eq!(
            lines[..3],
            [
                "kernel lock                      kind                   cont/s  wait ms/s  kernel site",
                "mmap_lock                        rwsem write               120       37.1  __vm_munmap",
                "? 0xffff888100000001             spinlock                    3        0.0  -",
            ]
        );
        assert_eq!(lines.len(), 1 + KERNEL_ROWS + 1);
        assert_eq!(lines[KERNEL_ROWS + 1], "(+2 more kernel locks)");
        interval.kernel_locks = Some(KernelLocks {
            unavailable: Some("this kernel has no lock:contention_begin tracepoint".into()),
            ..KernelLocks::default()
        });
        assert_eq!(
            kernel_lines(&interval, 2.0),
            ["kernel locks: unavailable: this kernel has no lock:contention_begin tracepoint"]
        );
    }

    /// A stack line keeps the frames nearest the lock when cut.
    #[test]
    fn stack_lines_cut_at_the_outer_end() {
        let frames: Vec<String> = ["main", "serve", "take", "pthread_mutex_lock"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            stack_line(&frames, usize::MAX),
            "    stack main;serve;take;pthread_mutex_lock"
        );
        assert_eq!(
            stack_line(&frames, 34),
            "    stack …take;pthread_mutex_lock"
        );
        assert_eq!(stack_line(&frames, 34).chars().count(), 34);
    }

    /// The plain table's rows line up under its titles, the kind too.
    #[test]
    fn plain_rows_line_up_under_the_titles() {
        assert_eq!(
            fixed_line(&PLAIN_COLUMNS, &TITLES),
            "lock                             kind        acq/s     cont/s  wait ms/s   cpu ms/s  top caller"
        );
        let row = ["g_lock", "mutex", "40000", "0", "0.0", "1.2", "tick"];
        assert_eq!(
            fixed_line(&PLAIN_COLUMNS, &row),
            "g_lock                           mutex       40000          0        0.0        1.2  tick"
        );
    }

    #[test]
    fn cut_cuts_with_an_ellipsis() {
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
