//! pprof export of a report: a gzipped `profile.proto` that `go tool pprof`,
//! Pyroscope, Parca and Grafana read, shaped like Go's mutex profile
//! (`contentions/count`, `delay/nanoseconds`) plus `acquisitions/count` and
//! `cpu/nanoseconds` (the lock code's sampled CPU).
//!
//! Each stack of a lock call (`--stacks`) or, without stacks, each caller
//! becomes a sample carrying its acquisitions, with the lock as the leaf
//! frame (`lock NAME`) and as the label `lock`; stacks of futex waits carry
//! contentions, stacks of CPU samples `cpu` (samples x the sampling
//! period, no other value). What no stack accounts for (stacks past the top N kept, and
//! the wait time, known per lock only) goes on a sample whose only frame is
//! the lock, so each lock's totals in the profile are the report's. With
//! `--php`, stack samples also carry the label `route` (the route their
//! snapshots were taken in: `-tagfocus route=...`). Reads only the report
//! model.
use std::{collections::HashMap, io::Write};

use anyhow::{Context, Result};
use flate2::{Compression, write::GzEncoder};
use prost::Message;

use super::format::{frame_label, label, short_module};
use crate::model::{Frame, KernelLock, Lock, LockStack, Report, StackOrigin};

/// Sample value positions, in the order of `sample_type`.
const ACQUISITIONS: usize = 0;
const CONTENTIONS: usize = 1;
const DELAY: usize = 2;
/// Sampled CPU in lock code: on the stacks of CPU samples (`--stacks`),
/// the rest on the lock's frame.
const CPU: usize = 3;
const SAMPLE_TYPES: usize = 4;

/// True for a stack of lock calls (not of futex waits or CPU samples);
/// reports from before `source` tell them by the first frame.
pub(crate) fn is_lock_call(stack: &LockStack, lock: &Lock) -> bool {
    match stack.source {
        Some(source) => source == StackOrigin::LockCalls,
        None => starts_in_lock_function(stack, lock),
    }
}

/// True when the stack's innermost frame is a lock function (`pthread_mutex_lock`,
/// glibc's `___pthread_mutex_lock`, …): a stack of a lock call, not of a futex wait.
fn starts_in_lock_function(stack: &LockStack, lock: &Lock) -> bool {
    let Some(function) = stack.frames.first().and_then(|f| f.function.as_deref()) else {
        return false;
    };
    let function = function.trim_start_matches('_');
    lock.calls
        .keys()
        .any(|symbol| function.starts_with(symbol.trim_start_matches('_')))
        || function.starts_with("pthread_mutex_")
        || function.starts_with("pthread_rwlock_")
}

/// Writes the report as a gzipped pprof profile.
pub fn write(report: &Report, out: &mut dyn Write) -> Result<()> {
    let bytes = encode(report).encode_to_vec();
    let mut gzip = GzEncoder::new(out, Compression::default());
    gzip.write_all(&bytes)
        .and_then(|_| gzip.finish().map(|_| ()))
        .context("cannot write the pprof profile")
}

/// The profile of a report (not yet serialized).
pub(crate) fn encode(report: &Report) -> Profile {
    let mut builder = Builder::default();
    // String 0 must be "".
    builder.string("");
    let sample_type = [
        ("acquisitions", "count"),
        ("contentions", "count"),
        ("delay", "nanoseconds"),
        ("cpu", "nanoseconds"),
    ]
    .map(|(kind, unit)| builder.value_type(kind, unit))
    .to_vec();
    for lock in &report.locks {
        let (cpu, stacks): (Vec<&LockStack>, Vec<&LockStack>) = report
            .stacks
            .iter()
            // The inproc stubs' samples count samples, not calls: the
            // lock's exact acquisitions stay on its callers and frame.
            .filter(|stack| stack.lock == lock.address && !stack.is_sampled())
            .partition(|stack| stack.is_cpu());
        // Stacks of lock calls and of futex waits (which is all a
        // futex-only lock has); reports from before `source` tell them by
        // the first frame (a lock call's is a lock function).
        let (calls, waits): (Vec<&LockStack>, Vec<&LockStack>) = stacks
            .into_iter()
            .partition(|stack| is_lock_call(stack, lock));
        let acquisitions = lock.acquisitions.unwrap_or(0);
        let mut placed = [0u64; SAMPLE_TYPES];
        // A CPU sample stands for one sampling period of CPU.
        let period = report
            .cpu
            .as_ref()
            .filter(|cpu| cpu.sample_hz > 0)
            .map_or(0, |cpu| crate::model::sample_period_ns(cpu.sample_hz));
        for stack in cpu {
            let ns = stack.count.saturating_mul(period);
            placed[CPU] += builder.sample(lock, stack, CPU, ns);
        }
        if !calls.is_empty() || !waits.is_empty() {
            for stack in calls {
                placed[ACQUISITIONS] += builder.sample(lock, stack, ACQUISITIONS, stack.count);
            }
            for stack in waits {
                placed[CONTENTIONS] += builder.sample(lock, stack, CONTENTIONS, stack.count);
            }
        } else {
            // A futex-only lock's callers are its waiters, counted per wait.
            let index = if lock.acquisitions.is_some() {
                ACQUISITIONS
            } else {
                CONTENTIONS
            };
            for caller in &lock.callers {
                placed[index] +=
                    builder.sample_at(lock, &[caller.frame()], None, index, caller.count);
            }
        }
        // What no stack or caller accounts for (stacks beyond the top N,
        // lost ones, delay) sits on the lock's frame, so each lock's totals
        // are the report's.
        for (index, total) in [
            (ACQUISITIONS, acquisitions),
            (CONTENTIONS, lock.contended),
            (DELAY, lock.wait_ns),
            (CPU, lock.cpu_ns.unwrap_or(0)),
        ] {
            if total > placed[index] {
                builder.sample_at(lock, &[], None, index, total - placed[index]);
            }
        }
    }
    if let Some(section) = &report.kernel_locks {
        for lock in &section.locks {
            kernel_samples(&mut builder, lock);
        }
    }
    let comment = vec![builder.string(&format!(
        "locktrace: pid {} ({}), mode {}",
        report.target.pid, report.target.exe, report.mode
    ))];
    let period_type = Some(builder.value_type("contentions", "count"));
    Profile {
        sample_type,
        sample: builder.samples,
        mapping: Vec::new(),
        location: builder.locations,
        function: builder.functions,
        string_table: builder.strings,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: 0,
        duration_nanos: (report.duration_s * 1e9) as i64,
        period_type,
        period: 1,
        comment,
        default_sample_type: 0,
    }
}

/// A kernel lock's contentions and delay: a sample per kernel stack kept
/// (leaf `kernel lock NAME (KIND)`, then the kernel functions innermost
/// first, then the user instruction it entered the kernel from); what no
/// kept stack accounts for on the leaf alone, so the totals are the row's.
fn kernel_samples(builder: &mut Builder, lock: &KernelLock) {
    let name = lock
        .name
        .clone()
        .unwrap_or_else(|| format!("{:#x}", lock.address));
    let kind = format!("kernel {}", lock.kind.word());
    let labels = [("lock", name.as_str()), ("kind", kind.as_str())];
    let leaf = builder.location(
        format!("kernel lock {name} ({})", lock.kind.word()),
        KERNEL_FILE.into(),
    );
    let (mut contentions, mut wait_ns) = (0, 0);
    for stack in &lock.kernel_stacks {
        let mut location_id = vec![leaf];
        for function in &stack.functions {
            location_id.push(builder.location(function.clone(), KERNEL_FILE.into()));
        }
        let user = lock
            .user_sites
            .iter()
            .find(|site| site.ip == stack.user_ip)
            .and_then(|site| site.frame.as_ref());
        if let Some(frame) = user {
            let file = frame
                .module
                .as_deref()
                .map(short_module)
                .unwrap_or_default();
            location_id.push(builder.location(frame_label(frame), file.to_string()));
        }
        builder.push(location_id, (stack.contentions, stack.wait_ns), &labels);
        contentions += stack.contentions;
        wait_ns += stack.wait_ns;
    }
    let rest = (
        lock.contentions.saturating_sub(contentions),
        lock.wait_ns.saturating_sub(wait_ns),
    );
    if rest != (0, 0) {
        builder.push(vec![leaf], rest, &labels);
    }
}

/// The file of kernel frames.
const KERNEL_FILE: &str = "[kernel]";

/// Interns strings, functions and locations as profile.proto wants them (ids from 1).
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<Function>,
    /// (name, file) -> location id; one location per function, as pprof shows functions.
    location_ids: HashMap<(String, String), u64>,
    locations: Vec<Location>,
    samples: Vec<Sample>,
}

impl Builder {
    fn string(&mut self, text: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(text) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(text.to_string());
        self.string_ids.insert(text.to_string(), id);
        id
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn location(&mut self, name: String, file: String) -> u64 {
        self.location_at(name, file, 0)
    }

    /// A location with a source line (PHP frames).
    fn location_at(&mut self, name: String, file: String, line: u32) -> u64 {
        if let Some(&id) = self.location_ids.get(&(name.clone(), file.clone())) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        let function = Function {
            id,
            name: self.string(&name),
            system_name: self.string(&name),
            filename: self.string(&file),
            start_line: 0,
        };
        self.functions.push(function);
        self.locations.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![Line {
                function_id: id,
                line: i64::from(line),
            }],
            is_folded: false,
        });
        self.location_ids.insert((name, file), id);
        id
    }

    /// A sample of contentions and delay with string labels.
    fn push(
        &mut self,
        location_id: Vec<u64>,
        (contentions, delay): (u64, u64),
        labels: &[(&str, &str)],
    ) {
        let mut value = vec![0i64; SAMPLE_TYPES];
        value[CONTENTIONS] = i64::try_from(contentions).unwrap_or(i64::MAX);
        value[DELAY] = i64::try_from(delay).unwrap_or(i64::MAX);
        let label = labels
            .iter()
            .map(|(key, text)| Label {
                key: self.string(key),
                str: self.string(text),
                num: 0,
                num_unit: 0,
            })
            .collect();
        self.samples.push(Sample {
            location_id,
            value,
            label,
        });
    }

    /// One sample of a stack: its frames, labelled with its route (`--php`).
    fn sample(&mut self, lock: &Lock, stack: &LockStack, index: usize, value: u64) -> u64 {
        self.sample_at(lock, &stack.frames, stack.route.as_deref(), index, value)
    }

    /// One sample: the lock as the leaf, then `frames` (innermost first),
    /// with the labels `lock`, `kind` and `route` (when known); returns
    /// `value`.
    fn sample_at(
        &mut self,
        lock: &Lock,
        frames: &[Frame],
        route: Option<&str>,
        index: usize,
        value: u64,
    ) -> u64 {
        let lock_name = label(lock);
        let mut location_id = vec![self.location(
            format!("lock {lock_name}"),
            lock.module.clone().unwrap_or_default(),
        )];
        for frame in frames {
            if let Some(php) = &frame.php {
                let id = self.location_at(frame_label(frame), php.file.clone(), php.line);
                location_id.push(id);
                continue;
            }
            let file = frame
                .module
                .as_deref()
                .map(short_module)
                .unwrap_or_default()
                .to_string();
            location_id.push(self.location(frame_label(frame), file));
        }
        let mut values = vec![0i64; SAMPLE_TYPES];
        values[index] = i64::try_from(value).unwrap_or(i64::MAX);
        let mut label = vec![
            Label {
                key: self.string("lock"),
                str: self.string(&lock_name),
                num: 0,
                num_unit: 0,
            },
            Label {
                key: self.string("kind"),
                str: self.string(&lock.kind.to_string()),
                num: 0,
                num_unit: 0,
            },
        ];
        if let Some(route) = route {
            label.push(Label {
                key: self.string("route"),
                str: self.string(route),
                num: 0,
                num_unit: 0,
            });
        }
        self.samples.push(Sample {
            location_id,
            value: values,
            label,
        });
        value
    }
}

// profile.proto (github.com/google/pprof/proto/profile.proto), the fields used.

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_start_empty_and_are_interned_once() {
        let mut builder = Builder::default();
        assert_eq!(builder.string(""), 0);
        assert_eq!(builder.string("lock"), 1);
        assert_eq!(builder.string("lock"), 1);
        assert_eq!(builder.strings, vec!["", "lock"]);
    }

    /// A kernel lock: a sample per kept stack (leaf, kernel functions, the
    /// user instruction) with its contentions and delay; the rest on the
    /// leaf, so the row's totals are exact.
    #[test]
    fn kernel_lock_stacks_carry_contentions_and_delay() {
        use crate::model::{KernelLockKind, KernelLocks, KernelStack, KernelUserSite};
        let mut report = Report::empty_for_tests("all");
        let stack = |function: &str, contentions, wait_ns| KernelStack {
            functions: vec!["rwsem_down_write_slowpath".into(), function.into()],
            user_ip: 0x1007,
            contentions,
            wait_ns,
        };
        report.kernel_locks = Some(KernelLocks {
            locks: vec![KernelLock {
                name: Some("mmap_lock".into()),
                kind: KernelLockKind::RwsemWrite,
                flags: 4,
                contentions: 10,
                wait_ns: 1_000,
                user_sites: vec![KernelUserSite {
                    ip: 0x1007,
                    frame: Some(Frame::named("munmap")),
                    ..Default::default()
                }],
                kernel_stacks: vec![stack("__vm_munmap", 6, 700), stack("vm_mmap_pgoff", 3, 200)],
                ..Default::default()
            }],
            ..Default::default()
        });
        let profile = encode(&report);
        let name = |id: u64| {
            let function = &profile.function[id as usize - 1];
            profile.string_table[function.name as usize].as_str()
        };
        let samples: Vec<(Vec<&str>, i64, i64)> = profile
            .sample
            .iter()
            .map(|sample| {
                let frames = sample.location_id.iter().map(|&id| name(id)).collect();
                (frames, sample.value[CONTENTIONS], sample.value[DELAY])
            })
            .collect();
        let leaf = "kernel lock mmap_lock (rwsem write)";
        assert_eq!(
            samples,
            vec![
                (
                    vec![leaf, "rwsem_down_write_slowpath", "__vm_munmap", "munmap"],
                    6,
                    700
                ),
                (
                    vec![leaf, "rwsem_down_write_slowpath", "vm_mmap_pgoff", "munmap"],
                    3,
                    200
                ),
                (vec![leaf], 1, 100),
            ]
        );
        let labels: Vec<&str> = profile.sample[0]
            .label
            .iter()
            .map(|label| profile.string_table[label.str as usize].as_str())
            .collect();
        assert_eq!(labels, ["mmap_lock", "kernel rwsem write"]);
    }

    #[test]
    fn each_locks_cpu_is_on_its_frame() {
        use crate::model::{LockKind, WaitClass};
        let mut report = Report::empty_for_tests("contention");
        for (address, cpu_ns) in [(0x1000, 7_000_000), (0x2000, 0)] {
            let mut lock = Lock::empty(address, LockKind::Mutex, WaitClass::Lock);
            lock.cpu_ns = Some(cpu_ns);
            report.locks.push(lock);
        }
        let profile = encode(&report);
        let cpu_type = &profile.sample_type[CPU];
        assert_eq!(profile.string_table[cpu_type.r#type as usize], "cpu");
        assert_eq!(profile.string_table[cpu_type.unit as usize], "nanoseconds");
        let cpu: Vec<i64> = profile
            .sample
            .iter()
            .map(|sample| sample.value[CPU])
            .filter(|&ns| ns > 0)
            .collect();
        assert_eq!(cpu, vec![7_000_000]);
    }

    /// Stacks of CPU samples carry CPU (samples x the period) and nothing
    /// else; what they do not account for stays on the lock's frame, so
    /// the lock's CPU is the report's; its lock calls' stack carries the
    /// acquisitions alone.
    #[test]
    fn cpu_sample_stacks_carry_cpu_only() {
        use crate::model::{LockKind, StackOrigin, StackSource, WaitClass};
        let mut report = Report::empty_for_tests("all");
        report.cpu = Some(crate::model::CpuReport {
            sample_hz: 1000,
            ..Default::default()
        });
        let mut lock = Lock::empty(0x1000, LockKind::Mutex, WaitClass::Lock);
        lock.cpu_ns = Some(5_000_000);
        lock.acquisitions = Some(10);
        report.locks.push(lock);
        let stack = |count, first: &str, source| LockStack {
            lock: 0x1000,
            count,
            frames: vec![Frame::named(first), Frame::named("take")],
            unwound_by: StackSource::CallFrameInfo,
            source: Some(source),
            route: (source == StackOrigin::LockCalls).then(|| "GET /q.php".to_string()),
            ended_by: None,
        };
        report.stacks = vec![
            stack(10, "pthread_mutex_lock", StackOrigin::LockCalls),
            stack(3, "pthread_mutex_lock", StackOrigin::CpuSamples),
        ];
        let profile = encode(&report);
        let values: Vec<&Vec<i64>> = profile
            .sample
            .iter()
            .map(|sample| &sample.value)
            .filter(|values| values.iter().any(|&v| v > 0))
            .collect();
        assert_eq!(
            values,
            [
                &vec![0, 0, 0, 3_000_000],
                &vec![10, 0, 0, 0],
                &vec![0, 0, 0, 2_000_000]
            ]
        );
        assert_eq!(profile.sample[0].location_id.len(), 3);
        // `--php`: the lock calls' stack carries its route as a label, the
        // others none.
        let routes: Vec<Option<&str>> = profile
            .sample
            .iter()
            .map(|sample| {
                sample
                    .label
                    .iter()
                    .find(|label| profile.string_table[label.key as usize] == "route")
                    .map(|label| profile.string_table[label.str as usize].as_str())
            })
            .collect();
        assert_eq!(routes, [None, Some("GET /q.php"), None]);
    }
}
