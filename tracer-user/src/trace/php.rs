//! `--php` (see `tracer_common::php`): loads the offsets and PHP's threads
//! into the BPF maps, keeps the threads current while the recording runs,
//! and reads the routes and the PHP stacks back.
use std::collections::HashSet;

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
};
use tracer_common::{
    names,
    php::{PhpFrame, PhpOffsets, PhpStack, RouteText, USER_FUNCTION, miss},
};

use super::maps::{map_mut, per_cpu_sum, read_hash};
use crate::{
    model::{PhpCollected, PhpFrameRead},
    probe::{
        memory::ProcessMemory,
        php::{ThreadTable, tls_offset, tls_offset_holds},
    },
};

/// PHP's thread table, as last loaded into `PHP_THREADS`.
pub(crate) struct PhpThreads {
    table: ThreadTable,
    memory: ProcessMemory,
    loaded: HashSet<(u64, u64)>,
    /// The offsets as loaded, and whether the TLS offset was checked
    /// against every thread known at the last read.
    offsets: PhpOffsets,
}

impl PhpThreads {
    /// Writes `offsets` (with `enabled` set) and the threads PHP has now.
    pub(crate) fn start(
        ebpf: &mut Ebpf,
        pid: u32,
        offsets: PhpOffsets,
        table: ThreadTable,
    ) -> Result<PhpThreads> {
        let mut threads = PhpThreads {
            table,
            memory: ProcessMemory::new(pid),
            loaded: HashSet::new(),
            offsets: PhpOffsets {
                enabled: 1,
                ..offsets
            },
        };
        threads.store_offsets(ebpf)?;
        threads.refresh(ebpf)?;
        Ok(threads)
    }

    fn store_offsets(&self, ebpf: &mut Ebpf) -> Result<()> {
        let mut array: Array<&mut MapData, PhpOffsets> =
            Array::try_from(map_mut(ebpf, names::MAP_PHP_OFFSETS)?)?;
        array
            .set(0, self.offsets, 0)
            .context("writing PHP's offsets to the BPF maps")
    }

    /// Finds the TLS slot of each thread's block once threads are known,
    /// and drops it if a thread ever disagrees (then `PHP_THREADS` alone).
    fn check_tls_offset(&mut self, ebpf: &mut Ebpf, now: &[(u64, u64)]) -> Result<()> {
        let known = self.offsets.tls_known != 0;
        let offset = self.offsets.tls_offset as i64;
        let wanted = match known {
            true if tls_offset_holds(&self.memory, now, offset) => return Ok(()),
            true => None,
            false => tls_offset(&self.memory, now),
        };
        if wanted.is_none() && !known {
            return Ok(());
        }
        self.offsets.tls_known = u64::from(wanted.is_some());
        self.offsets.tls_offset = wanted.unwrap_or(0) as u64;
        self.store_offsets(ebpf)
    }

    /// Loads threads PHP started since the last call (each tick).
    pub(crate) fn refresh(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let now = self.table.threads(&self.memory);
        self.check_tls_offset(ebpf, &now)?;
        let mut map: BpfHashMap<&mut MapData, u64, u64> =
            BpfHashMap::try_from(map_mut(ebpf, names::MAP_PHP_THREADS)?)?;
        for &(thread, block) in &now {
            if self.loaded.insert((thread, block)) {
                // A full map leaves the thread out: its events count as
                // `not_php_thread`.
                let _ = map.insert(thread, block, 0);
            }
        }
        Ok(())
    }

    /// Threads loaded so far.
    pub(crate) fn count(&self) -> u64 {
        self.loaded.len() as u64
    }

    /// Whether the BPF side reads each thread's block from its TLS.
    pub(crate) fn through_tls(&self) -> bool {
        self.offsets.tls_known != 0
    }
}

/// The route maps and the misses, once counting stopped.
pub(crate) fn read(ebpf: &Ebpf, threads: &PhpThreads) -> Result<PhpCollected> {
    let texts: std::collections::HashMap<u64, RouteText> = read_hash(ebpf, names::MAP_ROUTE_TEXTS)?;
    let mut collected = PhpCollected {
        routes: texts
            .into_iter()
            .map(|(route, text)| (route, (c_string(&text.method), c_string(&text.path))))
            .collect(),
        requests: read_hash(ebpf, names::MAP_ROUTE_REQUESTS)?,
        locks: read_hash(ebpf, names::MAP_ROUTE_LOCKS)?,
        cpu: read_hash(ebpf, names::MAP_ROUTE_CPU)?,
        threads: threads.count(),
        tls: threads.through_tls(),
        ..PhpCollected::default()
    };
    for index in 0..miss::COUNT {
        collected.misses[index as usize] = per_cpu_sum(ebpf, names::MAP_PHP_MISSES, index)?;
    }
    Ok(collected)
}

/// The bytes up to the first NUL, as text.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The frames of a snapshot's PHP stack, innermost first.
pub(crate) fn frames(stack: &PhpStack) -> Vec<PhpFrameRead> {
    let depth = (stack.depth as usize).min(stack.frames.len());
    stack.frames[..depth].iter().map(frame).collect()
}

fn frame(raw: &PhpFrame) -> PhpFrameRead {
    let name = c_string(&raw.function);
    let class = c_string(&raw.class);
    let user = raw.kind == u32::from(USER_FUNCTION);
    let function = match (class.is_empty(), name.is_empty()) {
        // A file's top level has no function name.
        (_, true) if user => "{main}".to_string(),
        // A frame whose function did not read.
        (true, true) => "{unknown}".to_string(),
        (true, _) => name,
        (false, _) => format!("{class}::{name}"),
    };
    PhpFrameRead {
        function,
        file: if user {
            c_string(&raw.file)
        } else {
            String::new()
        },
        line: if user { raw.line } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: u8, function: &str, class: &str, file: &str, line: u32) -> PhpFrame {
        let mut frame = PhpFrame {
            line,
            kind: u32::from(kind),
            function: [0; tracer_common::php::NAME_BYTES],
            class: [0; tracer_common::php::NAME_BYTES],
            file: [0; tracer_common::php::FILE_BYTES],
        };
        frame.function[..function.len()].copy_from_slice(function.as_bytes());
        frame.class[..class.len()].copy_from_slice(class.as_bytes());
        frame.file[..file.len()].copy_from_slice(file.as_bytes());
        frame
    }

    #[test]
    fn methods_functions_main_and_c_functions() {
        let user = USER_FUNCTION;
        assert_eq!(
            frame(&raw(user, "find", "Repo", "/srv/Repo.php", 42)),
            PhpFrameRead {
                function: "Repo::find".into(),
                file: "/srv/Repo.php".into(),
                line: 42,
            }
        );
        assert_eq!(
            frame(&raw(user, "", "", "/srv/index.php", 3)).function,
            "{main}"
        );
        let internal = frame(&raw(1, "execute", "PDOStatement", "junk", 7));
        assert_eq!(
            internal,
            PhpFrameRead {
                function: "PDOStatement::execute".into(),
                file: String::new(),
                line: 0,
            }
        );
    }
}
