//! The `SNAPSHOTS` ring buffer: stack snapshots (registers and a copy of
//! the user stack) that the BPF side takes for `--stacks`. A thread of its
//! own drains it every few milliseconds and hands each snapshot to a
//! consumer (the unwinder): a load's first requests send a burst of them
//! (every new call site's first counts), more than the ring holds between
//! two of the recording's ticks.
use std::{
    os::fd::{AsFd, AsRawFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Map, MapData, RingBuf},
};
use tracer_common::{SnapshotHeader, StackSnapshot, names, php::PhpStack};

use crate::model::PhpSnapshot;

/// How long the reader waits on an empty ring before it looks at the
/// stop flag again.
const POLL_EVERY: Duration = Duration::from_millis(5);

/// What takes the snapshots, on the reader's thread.
pub(crate) trait SnapshotSink: Send + 'static {
    /// `stack` is the header's `len` bytes from its `sp` up; `php` the
    /// thread's PHP frames and route (`--php`).
    fn take(&mut self, header: &SnapshotHeader, php: PhpSnapshot, stack: &[u8]);
}

/// The reading thread; [`SnapshotReader::finish`] stops it and returns
/// the consumer.
pub(crate) struct SnapshotReader<C> {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<C>,
}

/// Starts the thread that hands every snapshot to `consumer`.
pub(crate) fn spawn<C: SnapshotSink>(ebpf: &Ebpf, mut consumer: C) -> Result<SnapshotReader<C>> {
    let mut ring = open(ebpf)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("locktrace-stacks".into())
        .spawn(move || {
            loop {
                // Read the flag first: the drain after it sees everything
                // sent before `finish` was called.
                let last = stopping.load(Ordering::Acquire);
                if drain(&mut ring, &mut consumer) == 0 && !last {
                    wait_for_data(&ring);
                }
                if last {
                    return consumer;
                }
            }
        })
        .context("starting the stack snapshot reader")?;
    Ok(SnapshotReader { stop, thread })
}

impl<C> SnapshotReader<C> {
    /// Stops the reader after a last drain (call it once counting has
    /// stopped) and returns the consumer.
    pub(crate) fn finish(self) -> Result<C> {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .map_err(|_| anyhow!("the stack snapshot reader panicked"))
    }
}

/// The ring buffer through a descriptor of its own, so the reader thread
/// owns it while the recording goes on with the rest of the object.
fn open(ebpf: &Ebpf) -> Result<RingBuf<MapData>> {
    let Some(Map::RingBuf(data)) = ebpf.map(names::MAP_SNAPSHOTS) else {
        bail!("BPF object lacks ring buffer {}", names::MAP_SNAPSHOTS);
    };
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating the snapshot ring buffer's descriptor")?;
    let data = MapData::from_fd(fd).context("opening the snapshot ring buffer")?;
    RingBuf::try_from(Map::RingBuf(data)).context("mapping the snapshot ring buffer")
}

/// Waits until the ring has data (the kernel wakes the reader at the first
/// record after it caught up) or [`POLL_EVERY`] passed. A fixed sleep left
/// a burst 5 ms to fill the ring before the reader looked.
fn wait_for_data(ring: &RingBuf<MapData>) {
    let mut poll = libc::pollfd {
        fd: ring.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = i32::try_from(POLL_EVERY.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one pollfd on the stack, its descriptor owned by `ring`.
    if unsafe { libc::poll(&mut poll, 1, millis) } < 0 {
        std::thread::sleep(POLL_EVERY);
    }
}

/// Hands every snapshot waiting in the ring to `each`; returns how many.
fn drain(ring: &mut RingBuf<MapData>, sink: &mut impl SnapshotSink) -> usize {
    let mut drained = 0;
    while let Some(item) = ring.next() {
        if item.len() < std::mem::size_of::<StackSnapshot>() {
            continue;
        }
        // SAFETY: the record holds a whole `StackSnapshot` (checked above),
        // written by the BPF side with the same repr(C) layout, header
        // first; any bytes are a valid header. Only the header is copied.
        let header = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const SnapshotHeader) };
        let php_at = std::mem::offset_of!(StackSnapshot, php);
        // SAFETY: as above; the PHP stack is plain integers and bytes.
        let php = unsafe { std::ptr::read_unaligned(item.as_ptr().add(php_at) as *const PhpStack) };
        let start = std::mem::offset_of!(StackSnapshot, stack);
        let len = usize::try_from(header.len).unwrap_or(usize::MAX);
        let end = start.saturating_add(len).min(item.len());
        let php = PhpSnapshot {
            frames: super::php::frames(&php),
            route: php.route,
        };
        sink.take(&header, php, &item[start..end]);
        drained += 1;
    }
    drained
}
