//! The kernel locks section as text: one block per kernel lock (name,
//! kind, contentions, wait), its kernel call sites, the user code behind
//! them, the user locks whose futex calls met them and (`--php`) the
//! routes of the requests that waited; one line when the
//! section is unavailable. And the lock table's cell for a user lock's
//! kernel contention.
use std::fmt::Write;

use super::format::duration;
use crate::model::{Frame, KernelLock, Lock, Report};

/// Kernel locks shown (all are in the JSON).
const SHOWN: usize = 10;
/// Sites shown per kernel lock.
const SITES: usize = 3;

/// True when any user lock row met kernel contention (the column shows).
pub(crate) fn joined(report: &Report) -> bool {
    report
        .locks
        .iter()
        .any(|lock| lock.kernel_contentions.is_some())
}

/// `N (TIME)`: a user lock's kernel contentions inside its futex calls.
pub(crate) fn cell(lock: &Lock) -> String {
    match (lock.kernel_contentions, lock.kernel_wait_ns) {
        (Some(n), Some(ns)) => format!("{n} ({})", duration(ns)),
        _ => "-".into(),
    }
}

/// The section, or nothing when kernel locks were not traced for.
pub(crate) fn render(report: &Report) -> String {
    let Some(section) = &report.kernel_locks else {
        return String::new();
    };
    if let Some(reason) = &section.unavailable {
        return format!("kernel locks: unavailable: {reason}\n");
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kernel locks: {} contentions, {} waiting, {} nested (not counted apart){}{}",
        section.contentions,
        duration(section.wait_ns),
        section.nested,
        if section.lost > 0 {
            format!(", {} lost", section.lost)
        } else {
            String::new()
        },
        match (section.stacks_exact_first, section.stack_sample_every) {
            (Some(first), Some(every)) =>
                format!("; kernel stacks: each site's first {first}, then 1 in {every}"),
            _ => String::new(),
        }
    );
    for lock in section.locks.iter().take(SHOWN) {
        out.push_str(&block(lock));
    }
    if section.locks.len() > SHOWN {
        let _ = writeln!(
            out,
            "  ({} more kernel locks in the JSON)",
            section.locks.len() - SHOWN
        );
    }
    out
}

fn block(lock: &KernelLock) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {} ({}, {:#x}): {} contentions, {} waiting, max {}",
        lock.name.as_deref().unwrap_or("?"),
        lock.kind.word(),
        lock.address,
        lock.contentions,
        duration(lock.wait_ns),
        duration(lock.max_wait_ns)
    );
    let sites: Vec<String> = lock
        .kernel_sites
        .iter()
        .take(SITES)
        .map(|site| {
            format!(
                "{} {} ({})",
                site.function,
                site.contentions,
                duration(site.wait_ns)
            )
        })
        .collect();
    let _ = writeln!(out, "    kernel: {}", sites.join(", "));
    let users: Vec<String> = lock
        .user_sites
        .iter()
        .take(SITES)
        .map(|site| {
            let caller = site
                .stacks
                .first()
                .and_then(|stack| {
                    stack
                        .frames
                        .iter()
                        .find(|frame| Some(*frame) != site.frame.as_ref())
                })
                .map(|frame| format!(" from {}", frame_name(frame)))
                .unwrap_or_default();
            let at = site.frame.as_ref().map_or_else(|| "?".into(), instruction);
            format!("{at}{caller} {}", site.contentions)
        })
        .collect();
    let _ = writeln!(out, "    user: {}", users.join(", "));
    if !lock.user_locks.is_empty() {
        let locks: Vec<String> = lock
            .user_locks
            .iter()
            .take(SITES)
            .map(|user| {
                let name = user
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("{:#x}", user.address));
                format!("{name} {} ({})", user.contentions, duration(user.wait_ns))
            })
            .collect();
        let _ = writeln!(out, "    in futex calls on: {}", locks.join(", "));
    }
    if !lock.routes.is_empty() {
        let routes: Vec<String> = lock
            .routes
            .iter()
            .take(SITES)
            .map(|route| {
                format!(
                    "{} {} ({})",
                    route.route,
                    route.contentions,
                    duration(route.wait_ns)
                )
            })
            .collect();
        let more = match lock.routes.len().saturating_sub(SITES) {
            0 => String::new(),
            n => format!(", {n} more in the JSON"),
        };
        let _ = writeln!(out, "    routes: {}{more}", routes.join(", "));
    }
    out
}

fn frame_name(frame: &Frame) -> String {
    frame.function.clone().unwrap_or_else(|| {
        format!(
            "{}+{:#x}",
            frame.module.as_deref().unwrap_or("?"),
            frame.offset
        )
    })
}

/// The instruction a contention entered the kernel from: `function+0xOFFSET`.
fn instruction(frame: &Frame) -> String {
    match &frame.function {
        Some(function) => format!("{function}+{:#x}", frame.offset),
        None => frame_name(frame),
    }
}
