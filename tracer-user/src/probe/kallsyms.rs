//! The kernel's symbols (`/proc/kallsyms`, real addresses for root): the
//! functions of kernel stacks, the global variables kernel locks live in,
//! and the kernel's lock code (the `__lock_text` and `__sched_text`
//! sections, where `perf lock` also looks to skip past the lock functions).

/// One symbol: its address, `nm`-style type letter and name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KernelSymbol {
    address: u64,
    kind: char,
    name: String,
}

/// The kernel's symbols, by address.
#[derive(Debug, Clone, Default)]
pub(crate) struct Kallsyms {
    symbols: Vec<KernelSymbol>,
    /// `[start, end)` of the lock and scheduler text sections.
    lock_code: Vec<(u64, u64)>,
}

/// How far past a data symbol's start a lock still counts as in it (a lock
/// inside a global structure, e.g. a member of `rcu_state`).
const DATA_SPAN: u64 = 64 * 1024;

impl Kallsyms {
    /// The running kernel's symbols; empty when they cannot be read or
    /// their addresses are hidden (`kptr_restrict`).
    pub(crate) fn read() -> Kallsyms {
        std::fs::read_to_string("/proc/kallsyms")
            .map(|text| Kallsyms::parse(&text))
            .unwrap_or_default()
    }

    /// Parses the text of `/proc/kallsyms` (`ADDRESS TYPE NAME [MODULE]`).
    pub(crate) fn parse(text: &str) -> Kallsyms {
        let mut symbols: Vec<KernelSymbol> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let address = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?.chars().next()?;
                let name = fields.next()?.to_string();
                (address != 0).then_some(KernelSymbol {
                    address,
                    kind,
                    name,
                })
            })
            .collect();
        symbols.sort_by_key(|symbol| symbol.address);
        let at = |name: &str| {
            symbols
                .iter()
                .find(|symbol| symbol.name == name)
                .map(|symbol| symbol.address)
        };
        let lock_code = [
            ("__lock_text_start", "__lock_text_end"),
            ("__sched_text_start", "__sched_text_end"),
        ]
        .iter()
        .filter_map(|(start, end)| Some((at(start)?, at(end)?)))
        .collect();
        Kallsyms { symbols, lock_code }
    }

    /// The last symbol at or before `address` that `wanted` accepts, with
    /// the address's offset into it (only the nearest symbol is tried).
    fn nearest(&self, address: u64, wanted: impl Fn(char) -> bool) -> Option<(&str, u64)> {
        let index = self
            .symbols
            .partition_point(|symbol| symbol.address <= address);
        let symbol = self.symbols.get(index.checked_sub(1)?)?;
        wanted(symbol.kind).then(|| (symbol.name.as_str(), address - symbol.address))
    }

    /// The function holding the code address `ip`.
    pub(crate) fn function(&self, ip: u64) -> Option<&str> {
        self.nearest(ip, |kind| matches!(kind, 't' | 'T' | 'w' | 'W'))
            .map(|(name, _)| name)
    }

    /// The global variable holding `address`: its name, plus `+0xOFFSET`
    /// inside it.
    pub(crate) fn global(&self, address: u64) -> Option<String> {
        let (name, offset) = self.nearest(address, |kind| {
            matches!(kind, 'd' | 'D' | 'b' | 'B' | 'r' | 'R')
        })?;
        match offset {
            0 => Some(name.to_string()),
            offset if offset < DATA_SPAN => Some(format!("{name}+{offset:#x}")),
            _ => None,
        }
    }

    /// True when `ip` is in the kernel's lock or scheduler code.
    pub(crate) fn in_lock_code(&self, ip: u64) -> bool {
        self.lock_code
            .iter()
            .any(|&(start, end)| ip >= start && ip < end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
ffffffff82249180 T __sched_text_start
ffffffff82249220 t __schedule
ffffffff8224e370 t rwsem_down_write_slowpath
ffffffff82251ea2 T __sched_text_end
ffffffff82251eb0 T __lock_text_start
ffffffff822525d0 T _raw_spin_lock
ffffffff82253931 T __lock_text_end
ffffffff82300000 T __vm_munmap
ffffffff83000000 d tasklist_lock
ffffffff83000040 b rcu_state
ffffffffc0000000 t some_module_function\t[ext4]
";

    #[test]
    fn functions_globals_and_lock_code() {
        let symbols = Kallsyms::parse(TEXT);
        assert_eq!(symbols.function(0xffffffff82300010), Some("__vm_munmap"));
        assert_eq!(
            symbols.function(0xffffffffc0000008),
            Some("some_module_function")
        );
        assert_eq!(symbols.function(0xffffffff83000000), None);
        assert_eq!(
            symbols.global(0xffffffff83000000).as_deref(),
            Some("tasklist_lock")
        );
        assert_eq!(
            symbols.global(0xffffffff83000048).as_deref(),
            Some("rcu_state+0x8")
        );
        // A slab address (the direct map) is in no symbol.
        assert_eq!(symbols.global(0xffff888012345678), None);
        assert!(symbols.in_lock_code(0xffffffff8224e400));
        assert!(symbols.in_lock_code(0xffffffff822525e0));
        assert!(!symbols.in_lock_code(0xffffffff82300010));
    }

    #[test]
    fn hidden_addresses_give_nothing() {
        let symbols = Kallsyms::parse("0000000000000000 T _raw_spin_lock\n");
        assert_eq!(symbols.function(0x10), None);
    }
}
