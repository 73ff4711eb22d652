//! What the running kernel's BPF offers, probed once at start-up, and what
//! locktrace does without it. Linux 5.10 (Debian 11) lacks attach cookies
//! and `bpf_task_pt_regs` (both 5.15): the lock program then finds its
//! cookie by the probe's address, and what needs a thread's saved user
//! registers is off, with its reason in the report. It also lacks BPF's
//! compare-exchange (5.12), which the loader then rewrites into a plain
//! store (see [`without_compare_exchange`]).
use std::sync::OnceLock;

use anyhow::{Result, anyhow};
use object::{Object, ObjectSection, SectionFlags};

use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
};
use tracer_common::kernel_caps;

use super::sys::load_probe_program;

/// Set in the environment to a comma-separated list (`cookies`,
/// `task_regs`, `cmpxchg`), these count as missing whatever the kernel has: the
/// tests' stand-in for Linux 5.10.
pub(crate) const WITHOUT_FOR_A_TEST: &str = "LOCKTRACE_TEST_KERNEL_WITHOUT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelFeatures {
    /// `bpf_get_attach_cookie` in uprobe programs (Linux 5.15).
    pub attach_cookies: bool,
    /// `bpf_get_current_task_btf` and `bpf_task_pt_regs` (Linux 5.15).
    pub task_regs: bool,
    /// The `BPF_CMPXCHG` atomic instruction (Linux 5.12).
    pub compare_exchange: bool,
}

impl KernelFeatures {
    /// The running kernel's features (probed on the first call).
    pub(crate) fn get() -> KernelFeatures {
        static PROBED: OnceLock<KernelFeatures> = OnceLock::new();
        *PROBED.get_or_init(|| {
            let without = std::env::var(WITHOUT_FOR_A_TEST).unwrap_or_default();
            let forced_off = |name: &str| without.split(',').any(|item| item.trim() == name);
            // A failed probe (no BPF at all) counts as present: the load
            // then fails with the loader's own message.
            let has = |program: ProgramType, helper: BpfHelper| {
                is_helper_supported(program, helper).unwrap_or(true)
            };
            KernelFeatures {
                attach_cookies: !forced_off("cookies")
                    && has(ProgramType::KProbe, BpfHelper::BPF_FUNC_get_attach_cookie),
                task_regs: !forced_off("task_regs")
                    && has(ProgramType::TracePoint, BpfHelper::BPF_FUNC_task_pt_regs)
                    && has(
                        ProgramType::TracePoint,
                        BpfHelper::BPF_FUNC_get_current_task_btf,
                    ),
                compare_exchange: !forced_off("cmpxchg") && loads_compare_exchange(),
            }
        })
    }

    /// The `KERNEL_CAPS` global's bits.
    pub(crate) fn caps(self) -> u32 {
        let mut caps = 0;
        if self.attach_cookies {
            caps |= kernel_caps::ATTACH_COOKIE;
        }
        if self.task_regs {
            caps |= kernel_caps::TASK_REGS;
        }
        caps
    }

    /// What the recording cannot do on this kernel, one line each, for the
    /// report: `stacks` asked for, a Go target, the CPU sampler on.
    pub(crate) fn limits(self, stacks: bool, go_runtime: bool, cpu_sampler: bool) -> Vec<String> {
        let mut limits = Vec::new();
        if !self.task_regs {
            let why = "this kernel has no bpf_task_pt_regs (Linux 5.15+)";
            if go_runtime {
                limits.push(format!(
                    "Go runtime futex waits count as plain futex waits: {why}"
                ));
            }
            if stacks {
                limits.push(format!("no stacks of contended waits: {why}"));
            }
            if cpu_sampler {
                limits.push(format!(
                    "CPU samples inside futex calls count for the target, not for a lock: {why}"
                ));
            }
        }
        limits
    }
}

/// The oldest kernel locktrace runs on (the kernel matrix's oldest).
pub(crate) const MINIMUM_KERNEL: (u32, u32) = (5, 10);

/// The one line for a kernel that refused the BPF object: the minimum
/// when the kernel is older, else what the object needs.
pub(crate) fn refused(error: &dyn std::fmt::Display) -> anyhow::Error {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    match kernel_version(release) {
        Some(version) if version < MINIMUM_KERNEL => anyhow!(
            "locktrace needs Linux {}.{} or newer; this kernel is {release} (the kernel said: {error})",
            MINIMUM_KERNEL.0,
            MINIMUM_KERNEL.1
        ),
        _ => anyhow!(
            "the kernel refused locktrace's BPF programs ({error}); it needs BPF with BTF, uprobes and syscall tracepoints (Linux {}.{} or newer)",
            MINIMUM_KERNEL.0,
            MINIMUM_KERNEL.1
        ),
    }
}

/// (major, minor) of a release string such as `5.10.0-32-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A BPF instruction's opcode: `BPF_STX | BPF_ATOMIC | BPF_DW`, and the
/// atomic operation `BPF_CMPXCHG` in its immediate.
const ATOMIC_DW: u8 = 0xdb;
const CMPXCHG: u32 = 0xf1;
/// `BPF_STX | BPF_MEM | BPF_DW`: a plain 64-bit store.
const STORE_DW: u8 = 0x7b;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;

/// Whether the kernel accepts `BPF_CMPXCHG`: a socket filter that
/// compare-exchanges a stack slot loads (5.12+) or is refused ("BPF_STX
/// uses reserved fields"). A kernel without BPF counts as having it: the
/// real load then fails with the loader's own message.
fn loads_compare_exchange() -> bool {
    let instructions: [u64; 6] = [
        0x01b7,                                                    // r1 = 0
        0xfff8_1a7b,                                               // *(u64 *)(r10 - 8) = r1
        0xb7,                                                      // r0 = 0
        ((CMPXCHG as u64) << 32) | 0xfff8_1a00 | ATOMIC_DW as u64, // cmpxchg(r10 - 8, r0, r1)
        0xb7,                                                      // r0 = 0
        0x95,                                                      // exit
    ];
    match load_probe_program(BPF_PROG_TYPE_SOCKET_FILTER, &instructions) {
        Ok(_) => true,
        Err(error) => error.raw_os_error() != Some(libc::EINVAL),
    }
}

/// `object` with every 64-bit compare-exchange turned into a plain store
/// of the new value, for kernels without `BPF_CMPXCHG` (5.10), which refuse
/// the instruction even in dead code. The compare value stays in `r0`, so
/// the program reads the exchange as done: `raise_to` (the maximum wait
/// and hold times) then raises the maximum with a store, which two CPUs
/// raising the same maximum at once can lose; the counts are not touched.
pub(crate) fn without_compare_exchange(object: &[u8]) -> Result<Vec<u8>> {
    let file = object::File::parse(object).map_err(|error| anyhow!("the BPF object: {error}"))?;
    let mut bytes = object.to_vec();
    for section in file.sections() {
        let executable = matches!(section.flags(), SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0);
        let Some((start, size)) = section.file_range().filter(|_| executable) else {
            continue;
        };
        let code = bytes
            .get_mut(usize::try_from(start)?..usize::try_from(start + size)?)
            .ok_or_else(|| anyhow!("a BPF object section lies past its end"))?;
        for instruction in code.chunks_exact_mut(8) {
            let imm = u32::from_le_bytes(instruction[4..8].try_into()?);
            if instruction[0] == ATOMIC_DW && imm == CMPXCHG {
                instruction[0] = STORE_DW;
                instruction[4..8].copy_from_slice(&0u32.to_le_bytes());
            }
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_parse_from_release_strings() {
        assert_eq!(kernel_version("5.10.0-32-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("4.18.0-553.el8_10.x86_64"), Some((4, 18)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("4.19.0").unwrap() < MINIMUM_KERNEL);
    }

    /// The real object: its compare-exchanges (in `raise_to`) become plain
    /// stores, and nothing else changes.
    #[test]
    fn compare_exchanges_become_stores_and_nothing_else_changes() {
        let object = super::super::attach::bpf_object();
        let patched = without_compare_exchange(object).unwrap();
        assert_eq!(patched.len(), object.len());
        let changed: Vec<usize> = (0..object.len())
            .filter(|&at| object[at] != patched[at])
            .collect();
        // Two bytes per instruction (opcode, immediate's low byte).
        assert!(
            changed.len() >= 2 && changed.len().is_multiple_of(2),
            "{changed:?}"
        );
        for pair in changed.chunks(2) {
            assert_eq!((object[pair[0]], patched[pair[0]]), (ATOMIC_DW, STORE_DW));
            assert_eq!(pair[1], pair[0] + 4);
            assert_eq!((object[pair[1]], patched[pair[1]]), (CMPXCHG as u8, 0));
        }
    }
}
