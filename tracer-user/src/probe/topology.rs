//! The machine's cache topology from sysfs, for the handoff classes: per
//! CPU its core (`topology/thread_siblings_list`) and its last-level cache
//! (`cache/index*/level` and `shared_cpu_list`, the highest level; without
//! cache information the package, `topology/physical_package_id`). A pure
//! parser over the files' text ([`Topology::parse`]) and the read
//! ([`read`]).
use std::{collections::BTreeMap, path::Path};

use tracer_common::{CpuPlace, handoff_class};

use crate::model::HandoffClass;

/// Where the CPUs' files are.
const SYSFS_CPUS: &str = "/sys/devices/system/cpu";
/// Package ids are kept apart from cache ids (a CPU number plus one).
const PACKAGE_ID_BASE: u32 = 1 << 16;

/// What sysfs says of one CPU (None: the file is missing).
#[derive(Debug, Clone, Default)]
pub(crate) struct CpuFiles {
    pub cpu: u32,
    pub thread_siblings_list: Option<String>,
    pub physical_package_id: Option<String>,
    /// `(level, shared_cpu_list)` of each `cache/index*`.
    pub caches: Vec<(String, String)>,
}

/// Each CPU's place: its core and last-level cache, as ids the BPF side
/// compares (`tracer_common::CpuPlace`, 0 unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    places: BTreeMap<u32, CpuPlace>,
}

impl Topology {
    /// The places of `cpus`: a core is named by its first SMT sibling, a
    /// cache by the first CPU sharing it (plus one each, 0 is unknown).
    pub(crate) fn parse(cpus: &[CpuFiles]) -> Topology {
        let places = cpus
            .iter()
            .map(|files| (files.cpu, place_of(files)))
            .collect();
        Topology { places }
    }

    /// The place of `cpu` (unknown when sysfs did not list it).
    pub(crate) fn place(&self, cpu: u32) -> CpuPlace {
        self.places.get(&cpu).copied().unwrap_or_default()
    }

    /// Every CPU listed, with its place.
    pub(crate) fn places(&self) -> impl Iterator<Item = (u32, CpuPlace)> + '_ {
        self.places.iter().map(|(&cpu, &place)| (cpu, place))
    }

    /// The class of a lock's move from CPU `from` to CPU `to`, as the BPF
    /// side counts it; None for the same CPU (no move).
    pub fn class(&self, from: u32, to: u32) -> Option<HandoffClass> {
        if from == to {
            return None;
        }
        HandoffClass::from_index(handoff_class::of(self.place(from), self.place(to)))
    }
}

fn place_of(files: &CpuFiles) -> CpuPlace {
    let first = |list: &str| parse_cpu_list(list).and_then(|cpus| cpus.first().copied());
    let core = files
        .thread_siblings_list
        .as_deref()
        .and_then(first)
        .unwrap_or(files.cpu);
    let last_level = files
        .caches
        .iter()
        .filter_map(|(level, shared)| Some((level.trim().parse::<u32>().ok()?, shared)))
        .max_by_key(|(level, _)| *level)
        .and_then(|(_, shared)| first(shared));
    let package = files
        .physical_package_id
        .as_deref()
        .and_then(|id| id.trim().parse::<u32>().ok());
    let l3 = match (last_level, package) {
        (Some(cpu), _) => cpu.saturating_add(1),
        (None, Some(package)) => PACKAGE_ID_BASE.saturating_add(package),
        (None, None) => 0,
    };
    CpuPlace {
        core: core.saturating_add(1),
        l3,
    }
}

/// A sysfs CPU list (`0-3,8,10-11`), in order; None when malformed.
pub(crate) fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|part| !part.is_empty()) {
        match part.split_once('-') {
            Some((start, end)) => {
                let (start, end) = (start.parse::<u32>().ok()?, end.parse::<u32>().ok()?);
                if end < start || end - start > tracer_common::MAX_CPUS {
                    return None;
                }
                cpus.extend(start..=end);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The topology of this machine's possible CPUs (empty when sysfs is unreadable).
pub fn read() -> Topology {
    read_from(Path::new(SYSFS_CPUS))
}

/// [`read`] under another root (tests).
pub(crate) fn read_from(root: &Path) -> Topology {
    let text = |path: &Path| std::fs::read_to_string(path).ok();
    let cpus = text(&root.join("possible"))
        .and_then(|list| parse_cpu_list(&list))
        .unwrap_or_default();
    let files: Vec<CpuFiles> = cpus
        .into_iter()
        .map(|cpu| {
            let dir = root.join(format!("cpu{cpu}"));
            let caches = std::fs::read_dir(dir.join("cache"))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().starts_with("index"))
                .filter_map(|entry| {
                    let path = entry.path();
                    Some((
                        text(&path.join("level"))?,
                        text(&path.join("shared_cpu_list"))?,
                    ))
                })
                .collect();
            CpuFiles {
                cpu,
                thread_siblings_list: text(&dir.join("topology/thread_siblings_list")),
                physical_package_id: text(&dir.join("topology/physical_package_id")),
                caches,
            }
        })
        .collect();
    Topology::parse(&files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sockets, each of two cores with two SMT threads, one L3 per
    /// socket (CPUs 0-3 and 4-7; siblings 0+1, 2+3, …).
    fn two_sockets() -> Vec<CpuFiles> {
        (0..8)
            .map(|cpu| {
                let core = cpu & !1;
                let socket = cpu / 4;
                CpuFiles {
                    cpu,
                    thread_siblings_list: Some(format!("{core}-{}\n", core + 1)),
                    physical_package_id: Some(format!("{socket}\n")),
                    caches: vec![
                        ("1\n".into(), format!("{core}-{}\n", core + 1)),
                        ("2\n".into(), format!("{core},{}\n", core + 1)),
                        ("3\n".into(), format!("{}-{}\n", socket * 4, socket * 4 + 3)),
                    ],
                }
            })
            .collect()
    }

    #[test]
    fn cpu_lists_parse_ranges_and_singles() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("0-99999999"), None);
    }

    #[test]
    fn moves_are_classed_by_core_then_l3() {
        let topology = Topology::parse(&two_sockets());
        assert_eq!(topology.place(3), CpuPlace { core: 3, l3: 1 });
        assert_eq!(topology.place(6), CpuPlace { core: 7, l3: 5 });
        assert_eq!(topology.class(2, 2), None);
        assert_eq!(topology.class(0, 1), Some(HandoffClass::SameCore));
        assert_eq!(topology.class(1, 2), Some(HandoffClass::SameL3));
        assert_eq!(topology.class(3, 4), Some(HandoffClass::OtherL3));
        // A CPU sysfs did not list is in no known place.
        assert_eq!(topology.class(0, 9), Some(HandoffClass::OtherL3));
    }

    #[test]
    fn without_caches_the_package_stands_for_the_l3() {
        let mut cpus = two_sockets();
        for cpu in &mut cpus {
            cpu.caches.clear();
        }
        let topology = Topology::parse(&cpus);
        assert_eq!(topology.class(1, 2), Some(HandoffClass::SameL3));
        assert_eq!(topology.class(3, 4), Some(HandoffClass::OtherL3));
        // Nothing at all: every CPU its own core, no shared cache.
        let bare: Vec<CpuFiles> = (0..2)
            .map(|cpu| CpuFiles {
                cpu,
                ..CpuFiles::default()
            })
            .collect();
        let topology = Topology::parse(&bare);
        assert_eq!(topology.place(1), CpuPlace { core: 2, l3: 0 });
        assert_eq!(topology.class(0, 1), Some(HandoffClass::OtherL3));
    }

    #[test]
    fn the_classifier_needs_known_ids_to_match() {
        let unknown = CpuPlace::default();
        let known = CpuPlace { core: 1, l3: 1 };
        assert_eq!(handoff_class::of(unknown, unknown), handoff_class::OTHER_L3);
        assert_eq!(handoff_class::of(known, known), handoff_class::SAME_CORE);
        let sibling_cache = CpuPlace { core: 2, l3: 1 };
        assert_eq!(
            handoff_class::of(known, sibling_cache),
            handoff_class::SAME_L3
        );
    }

    #[test]
    fn this_machine_reads_when_sysfs_is_there() {
        let topology = read();
        if Path::new(SYSFS_CPUS).join("cpu0").exists() {
            assert_ne!(topology.place(0).core, 0);
        }
    }

    #[test]
    fn a_sysfs_tree_reads_like_its_text() {
        let root = std::env::temp_dir().join(format!("locktrace-topology-{}", std::process::id()));
        for cpu in 0..2 {
            let dir = root.join(format!("cpu{cpu}"));
            std::fs::create_dir_all(dir.join("topology")).expect("temp dir");
            std::fs::create_dir_all(dir.join("cache/index3")).expect("temp dir");
            std::fs::write(
                dir.join("topology/thread_siblings_list"),
                format!("{cpu}\n"),
            )
            .expect("write");
            std::fs::write(dir.join("topology/physical_package_id"), "0\n").expect("write");
            std::fs::write(dir.join("cache/index3/level"), "3\n").expect("write");
            std::fs::write(dir.join("cache/index3/shared_cpu_list"), "0-1\n").expect("write");
        }
        std::fs::write(root.join("possible"), "0-1\n").expect("write");
        let topology = read_from(&root);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(topology.class(0, 1), Some(HandoffClass::SameL3));
    }
}
