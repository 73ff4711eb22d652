//! Byte offsets of kernel struct members, read from the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`), so the BPF side can read a field such as
//! `current->thread.fsbase` with `bpf_probe_read_kernel(task + offset)` on
//! whatever layout the running kernel has. A reader of our own because
//! aya-obj keeps struct members private. Every read is bounds-checked and
//! every type chain bounded: hostile or truncated input is an error, never a
//! panic or a hang.
use std::ops::Range;

/// Where the running kernel publishes its BTF.
pub(crate) const SYS_FS_PATH: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
/// The header fields this reader uses; `hdr_len` may be larger.
const HEADER_LEN: usize = 24;
/// `struct btf_type` before its kind-specific data.
const TYPE_LEN: usize = 12;
/// Hops through typedef/const/… and nesting of anonymous members before the
/// input is taken as cyclic (real kernels need a handful).
const MAX_DEPTH: usize = 64;
/// Members looked at in one search through anonymous members; bounds the
/// work on hostile input that shares one anonymous struct many times.
const SEARCH_BUDGET: usize = 1 << 20;

const KIND_INT: u8 = 1;
const KIND_STRUCT: u8 = 4;
const KIND_UNION: u8 = 5;
const KIND_TYPEDEF: u8 = 8;
const KIND_VOLATILE: u8 = 9;
const KIND_CONST: u8 = 10;
const KIND_RESTRICT: u8 = 11;
const KIND_TYPE_TAG: u8 = 18;

/// Why a member offset could not be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BtfError {
    #[error(
        "cannot read kernel BTF {path}: {reason}; run on a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y, with read access to {path}"
    )]
    Unreadable { path: String, reason: String },
    #[error(
        "kernel BTF is malformed: {0}; check that {SYS_FS_PATH} belongs to the \
         running kernel, and report this with `uname -r`"
    )]
    Malformed(String),
    #[error(
        "kernel BTF has no definition of struct {0}; this kernel is not supported, \
         report it with `uname -r`"
    )]
    NoStruct(String),
    #[error(
        "kernel BTF: {strukt} has no member {member}; this kernel (or architecture) \
         lays it out differently, report it with `uname -r`"
    )]
    NoMember { strukt: String, member: String },
    #[error(
        "kernel BTF: {strukt}.{member} is a bit-field (bit offset {bit_offset}), which \
         a byte offset cannot address; report it with `uname -r`"
    )]
    BitField {
        strukt: String,
        member: String,
        bit_offset: u64,
    },
}

fn malformed(what: impl Into<String>) -> BtfError {
    BtfError::Malformed(what.into())
}

/// One type; only what member lookups need is kept.
#[derive(Debug, Clone)]
struct Type {
    kind: u8,
    name_off: u32,
    /// Size for INT/STRUCT/UNION, referenced type id for the modifiers.
    size_or_type: u32,
    /// INT: the encoding word (bit-field offset and width for old encoders).
    int_encoding: u32,
    /// STRUCT/UNION: its members in `KernelBtf::members`.
    members: Range<usize>,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u64,
    /// Non-zero for a bit-field declared with the struct's kind_flag.
    bitfield_size: u32,
}

/// The kernel's types and strings, parsed from raw BTF.
#[derive(Debug, Clone)]
pub(crate) struct KernelBtf {
    /// Index `id - 1` holds type `id` (type 0 is void).
    types: Vec<Type>,
    members: Vec<Member>,
    /// The string section; validated to start and end with a NUL.
    strings: Vec<u8>,
}

/// Bounds-checked integer reads in the blob's byte order.
struct Reader<'a> {
    bytes: &'a [u8],
    big_endian: bool,
}

impl Reader<'_> {
    fn u32(&self, at: usize) -> Result<u32, BtfError> {
        let end = at
            .checked_add(4)
            .ok_or_else(|| malformed("offset overflow"))?;
        let b: [u8; 4] = self
            .bytes
            .get(at..end)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| malformed(format!("truncated at byte {at}")))?;
        Ok(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }
}

/// Bytes of kind-specific data after a `struct btf_type`; None for a kind
/// this reader does not know (whose size it therefore cannot skip).
fn extra_len(kind: u8, vlen: usize) -> Option<usize> {
    Some(match kind {
        1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
        2 | 7..=12 | 16 | 18 => 0,    // PTR, FWD, modifiers, FUNC, FLOAT, TYPE_TAG
        3 => 12,                      // ARRAY
        4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
        _ => return None,
    })
}

/// The type and string sections of a blob, checked against its length.
fn sections(bytes: &[u8]) -> Result<(Reader<'_>, Range<usize>, Range<usize>), BtfError> {
    let magic = bytes
        .get(..2)
        .ok_or_else(|| malformed("shorter than the header"))?;
    let big_endian = match magic {
        [0x9f, 0xeb] => false,
        [0xeb, 0x9f] => true,
        _ => return Err(malformed(format!("bad magic (not {MAGIC:#x})"))),
    };
    let reader = Reader { bytes, big_endian };
    if bytes.len() < HEADER_LEN {
        return Err(malformed("shorter than the header"));
    }
    let hdr_len = reader.u32(4)? as usize;
    if hdr_len < HEADER_LEN {
        return Err(malformed(format!("header length {hdr_len} too small")));
    }
    let section = |off_at: usize| -> Result<Range<usize>, BtfError> {
        let (off, len) = (
            reader.u32(off_at)? as usize,
            reader.u32(off_at + 4)? as usize,
        );
        let start = hdr_len.checked_add(off);
        match start.and_then(|s| s.checked_add(len).map(|e| s..e)) {
            Some(range) if range.end <= bytes.len() => Ok(range),
            _ => Err(malformed("a section runs past the end of the data")),
        }
    };
    let (types, strings) = (section(8)?, section(16)?);
    Ok((reader, types, strings))
}

impl KernelBtf {
    /// Parses raw BTF (either byte order). Never panics.
    pub(crate) fn parse(bytes: &[u8]) -> Result<KernelBtf, BtfError> {
        let (reader, type_range, str_range) = sections(bytes)?;
        let strings = bytes.get(str_range).unwrap_or_default().to_vec();
        // A NUL first and last makes every in-range name offset terminated.
        if strings.first() != Some(&0) || strings.last() != Some(&0) {
            return Err(malformed("string section not NUL-delimited"));
        }
        let mut btf = KernelBtf {
            types: Vec::new(),
            members: Vec::new(),
            strings,
        };
        let mut at = type_range.start;
        while at < type_range.end {
            at = btf.read_type(&reader, at, type_range.end)?;
        }
        Ok(btf)
    }

    /// Reads the type at `at`, returning where the next one starts.
    fn read_type(&mut self, r: &Reader<'_>, at: usize, end: usize) -> Result<usize, BtfError> {
        let (name_off, info, size_or_type) = (r.u32(at)?, r.u32(at + 4)?, r.u32(at + 8)?);
        let kind = ((info >> 24) & 0x1f) as u8;
        let kind_flag = info >> 31 == 1;
        let vlen = (info & 0xffff) as usize;
        let extra = extra_len(kind, vlen).ok_or_else(|| {
            malformed(format!(
                "unknown type kind {kind} (BTF newer than this reader)"
            ))
        })?;
        let data = at + TYPE_LEN;
        let next = data + extra;
        if next > end {
            return Err(malformed(format!(
                "type {} runs past the type section",
                self.types.len() + 1
            )));
        }
        self.check_name(name_off)?;
        let mut ty = Type {
            kind,
            name_off,
            size_or_type,
            int_encoding: 0,
            members: self.members.len()..self.members.len(),
        };
        match kind {
            KIND_INT => ty.int_encoding = r.u32(data)?,
            KIND_STRUCT | KIND_UNION => {
                for i in 0..vlen {
                    let m = data + i * 12;
                    let (name_off, type_id, raw) = (r.u32(m)?, r.u32(m + 4)?, r.u32(m + 8)?);
                    self.check_name(name_off)?;
                    let (bit_offset, bitfield_size) = if kind_flag {
                        (raw & 0xff_ffff, raw >> 24)
                    } else {
                        (raw, 0)
                    };
                    self.members.push(Member {
                        name_off,
                        type_id,
                        bit_offset: u64::from(bit_offset),
                        bitfield_size,
                    });
                }
                ty.members.end = self.members.len();
            }
            _ => {}
        }
        self.types.push(ty);
        Ok(next)
    }

    fn check_name(&self, name_off: u32) -> Result<(), BtfError> {
        if (name_off as usize) < self.strings.len() {
            Ok(())
        } else {
            Err(malformed(format!(
                "name offset {name_off} outside the string section"
            )))
        }
    }

    /// Reads the running kernel's BTF.
    pub(crate) fn from_sys_fs() -> Result<KernelBtf, BtfError> {
        let bytes = std::fs::read(SYS_FS_PATH).map_err(|e| BtfError::Unreadable {
            path: SYS_FS_PATH.to_string(),
            reason: e.to_string(),
        })?;
        KernelBtf::parse(&bytes)
    }

    /// The name at `off`, empty for anonymous (offsets are checked at parse).
    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        rest.split(|b| *b == 0).next().unwrap_or_default()
    }

    fn get(&self, id: u32) -> Result<&Type, BtfError> {
        let index = (id as usize).checked_sub(1);
        index
            .and_then(|i| self.types.get(i))
            .ok_or_else(|| malformed(format!("reference to type {id}, which does not exist")))
    }

    /// Follows typedef/const/volatile/restrict/type_tag to the type beneath.
    fn resolve(&self, mut id: u32) -> Result<&Type, BtfError> {
        for _ in 0..MAX_DEPTH {
            let ty = self.get(id)?;
            match ty.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = ty.size_or_type;
                }
                _ => return Ok(ty),
            }
        }
        Err(malformed(format!(
            "type chain from type {id} too long or cyclic"
        )))
    }

    /// The full definition (kind STRUCT, not a forward declaration) named `name`.
    fn find_struct(&self, name: &str) -> Result<&Type, BtfError> {
        self.types
            .iter()
            .find(|t| t.kind == KIND_STRUCT && self.name(t.name_off) == name.as_bytes())
            .ok_or_else(|| BtfError::NoStruct(name.to_string()))
    }

    #[cfg(test)]
    /// Size in bytes of struct `name`.
    pub(crate) fn struct_size(&self, name: &str) -> Result<u64, BtfError> {
        Ok(u64::from(self.find_struct(name)?.size_or_type))
    }

    /// Byte offset of `path` (e.g. `["thread", "fsbase"]`) inside struct
    /// `name` (e.g. `"task_struct"`), following each member's type through
    /// typedef/const/volatile/restrict/type_tag and descending into anonymous
    /// struct/union members when a name is not a direct member.
    pub(crate) fn member_offset(&self, name: &str, path: &[&str]) -> Result<u64, BtfError> {
        let mut container = self.find_struct(name)?;
        let mut owner = format!("struct {name}");
        let mut bits: u64 = 0;
        for (i, member) in path.iter().enumerate() {
            let no_member = || BtfError::NoMember {
                strukt: owner.clone(),
                member: member.to_string(),
            };
            if !matches!(container.kind, KIND_STRUCT | KIND_UNION) {
                return Err(no_member());
            }
            let mut budget = SEARCH_BUDGET;
            let found = self
                .find_member(container, member.as_bytes(), 0, &mut budget)?
                .ok_or_else(no_member)?;
            let ty = self.resolve(found.type_id)?;
            if found.bitfield_size != 0 || found.bit_offset % 8 != 0 || is_int_bitfield(ty) {
                return Err(BtfError::BitField {
                    strukt: owner,
                    member: member.to_string(),
                    bit_offset: found.bit_offset,
                });
            }
            bits = bits
                .checked_add(found.bit_offset)
                .ok_or_else(|| malformed("member offset overflows"))?;
            if i + 1 < path.len() {
                owner = format!("{owner}.{member}");
                container = ty;
            }
        }
        Ok(bits / 8)
    }

    /// Member `name` of `container`, directly or inside anonymous
    /// struct/union members (its offset then relative to `container`).
    fn find_member(
        &self,
        container: &Type,
        name: &[u8],
        depth: usize,
        budget: &mut usize,
    ) -> Result<Option<Member>, BtfError> {
        let members = self
            .members
            .get(container.members.clone())
            .unwrap_or_default();
        *budget = budget
            .checked_sub(members.len())
            .ok_or_else(|| malformed("anonymous members nest too widely"))?;
        if let Some(m) = members.iter().find(|m| self.name(m.name_off) == name) {
            return Ok(Some(*m));
        }
        if depth >= MAX_DEPTH {
            return Err(malformed("anonymous members nest too deep or cyclically"));
        }
        for anon in members
            .iter()
            .filter(|m| m.name_off == 0 || self.name(m.name_off).is_empty())
        {
            let inner = self.resolve(anon.type_id)?;
            if !matches!(inner.kind, KIND_STRUCT | KIND_UNION) {
                continue;
            }
            if let Some(found) = self.find_member(inner, name, depth + 1, budget)? {
                let bit_offset = anon
                    .bit_offset
                    .checked_add(found.bit_offset)
                    .ok_or_else(|| malformed("member offset overflows"))?;
                return Ok(Some(Member {
                    bit_offset,
                    ..found
                }));
            }
        }
        Ok(None)
    }
}

/// An INT narrower than its storage or shifted within it: how encoders
/// without kind_flag describe a bit-field.
fn is_int_bitfield(ty: &Type) -> bool {
    let bits = ty.int_encoding & 0xff;
    let shift = (ty.int_encoding >> 16) & 0xff;
    ty.kind == KIND_INT && (shift != 0 || u64::from(bits) != u64::from(ty.size_or_type) * 8)
}

/// `task_struct.thread.fsbase` of the running kernel: where the user
/// thread pointer (x86-64 `%fs` base) is saved in the task.
pub(crate) fn task_fsbase_offset() -> Result<u64, BtfError> {
    KernelBtf::from_sys_fs()?.member_offset("task_struct", &["thread", "fsbase"])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob type by type.
    struct Blob {
        types: Vec<u8>,
        strings: Vec<u8>,
        count: u32,
    }

    impl Blob {
        fn new() -> Blob {
            Blob {
                types: Vec::new(),
                strings: vec![0],
                count: 0,
            }
        }

        fn name(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(name.as_bytes());
            self.strings.push(0);
            off
        }

        /// Adds a type and returns its id; `extra` is its kind-specific data.
        fn ty(
            &mut self,
            name: &str,
            kind: u32,
            vlen: u32,
            flag: bool,
            size_or_type: u32,
            extra: &[u32],
        ) -> u32 {
            let name_off = self.name(name);
            let info = (u32::from(flag) << 31) | (kind << 24) | vlen;
            for word in [name_off, info, size_or_type].iter().chain(extra) {
                self.types.extend_from_slice(&word.to_le_bytes());
            }
            self.count += 1;
            self.count
        }

        /// A STRUCT (or UNION) with members `(name, type, raw offset)`.
        fn record(
            &mut self,
            name: &str,
            kind: u32,
            flag: bool,
            size: u32,
            members: &[(&str, u32, u32)],
        ) -> u32 {
            let mut extra = Vec::new();
            for (member, type_id, offset) in members {
                extra.extend([self.name(member), *type_id, *offset]);
            }
            self.ty(name, kind, members.len() as u32, flag, size, &extra)
        }

        fn finish(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.extend([1, 0]);
            let words = [
                HEADER_LEN as u32,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strings.len() as u32,
            ];
            for word in words {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// `outer` (48 bytes): `first` int @0, `in` const inner_t @8 (inner:
    /// `a` @0, `b` @8, old-style bit-field `old_bf` @12), an anonymous union
    /// @24 holding `u` and an anonymous struct {`x` @0, `y` @4}, a kind_flag
    /// bit-field `flags` @bit 256, `tail` @40. Other kinds are mixed in so
    /// their sizes are skipped correctly.
    fn synthetic() -> Vec<u8> {
        let mut b = Blob::new();
        b.ty("outer", 7, 0, false, 0, &[]); // FWD first: must not be picked
        let long = b.ty("long", 1, 0, false, 8, &[64]);
        let int = b.ty("int", 1, 0, false, 4, &[32]);
        let bf3 = b.ty("int", 1, 0, false, 4, &[3]);
        b.ty("e", 6, 2, false, 4, &[0, 0, 0, 1]);
        b.ty("", 3, 0, false, 0, &[int, int, 4]); // ARRAY
        b.ty("", 2, 0, false, long, &[]); // PTR
        b.ty("", 13, 1, false, int, &[0, long]); // FUNC_PROTO
        b.ty("e64", 19, 1, false, 8, &[0, 1, 0]);
        let inner = b.record(
            "inner",
            4,
            false,
            16,
            &[("a", int, 0), ("b", long, 64), ("old_bf", bf3, 96)],
        );
        let inner_t = b.ty("inner_t", 8, 0, false, inner, &[]);
        let const_inner = b.ty("", 10, 0, false, inner_t, &[]);
        let anon_struct = b.record("", 4, false, 8, &[("x", int, 0), ("y", int, 32)]);
        let anon_union = b.record("", 5, false, 8, &[("u", long, 0), ("", anon_struct, 0)]);
        let outer = &[
            ("first", int, 0),
            ("in", const_inner, 64),
            ("", anon_union, 192),
            ("flags", int, (3 << 24) | 256),
            ("tail", long, 320),
        ];
        b.record("outer", 4, true, 48, outer);
        b.ty("", 15, 1, false, 0, &[1, 0, 8]); // DATASEC
        b.finish()
    }

    #[test]
    fn synthetic_offsets() {
        let btf = KernelBtf::parse(&synthetic()).expect("parses");
        let at = |path: &[&str]| btf.member_offset("outer", path);
        assert_eq!(at(&["first"]), Ok(0));
        assert_eq!(at(&["in"]), Ok(8));
        assert_eq!(at(&["in", "a"]), Ok(8));
        assert_eq!(at(&["in", "b"]), Ok(16));
        assert_eq!(at(&["u"]), Ok(24));
        assert_eq!(at(&["x"]), Ok(24));
        assert_eq!(at(&["y"]), Ok(28));
        assert_eq!(at(&["tail"]), Ok(40));
        assert_eq!(at(&[]), Ok(0));
        assert_eq!(btf.struct_size("outer"), Ok(48));
        assert_eq!(btf.struct_size("inner"), Ok(16));
    }

    #[test]
    fn synthetic_errors() {
        let btf = KernelBtf::parse(&synthetic()).expect("parses");
        let at = |path: &[&str]| btf.member_offset("outer", path);
        assert!(matches!(
            at(&["flags"]),
            Err(BtfError::BitField {
                bit_offset: 256,
                ..
            })
        ));
        assert!(matches!(
            at(&["in", "old_bf"]),
            Err(BtfError::BitField { .. })
        ));
        assert_eq!(
            at(&["nope"]),
            Err(BtfError::NoMember {
                strukt: "struct outer".into(),
                member: "nope".into()
            })
        );
        assert_eq!(
            at(&["first", "z"]),
            Err(BtfError::NoMember {
                strukt: "struct outer.first".into(),
                member: "z".into()
            })
        );
        assert_eq!(
            btf.member_offset("missing", &["a"]),
            Err(BtfError::NoStruct("missing".into()))
        );
        // A typedef is not a struct definition.
        assert!(matches!(
            btf.member_offset("inner_t", &["a"]),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn truncated_input_is_an_error() {
        let blob = synthetic();
        for len in 0..blob.len() {
            assert!(KernelBtf::parse(&blob[..len]).is_err(), "length {len}");
        }
    }

    /// Corrupting any byte, or feeding pseudo-random bytes, may parse or not
    /// but never panics, in parsing or in lookups.
    #[test]
    fn garbage_never_panics() {
        let blob = synthetic();
        let lookups = |bytes: &[u8]| {
            if let Ok(btf) = KernelBtf::parse(bytes) {
                for path in [&["in", "b"][..], &["y"], &["flags"], &["first", "z"]] {
                    let _ = btf.member_offset("outer", path);
                }
                let _ = btf.struct_size("inner");
            }
        };
        for at in 0..blob.len() {
            for value in [0x00, 0x01, 0x7f, 0xff] {
                let mut bad = blob.clone();
                bad[at] = value;
                lookups(&bad);
            }
        }
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in [0, 1, 24, 100, 4096] {
            let mut noise: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect();
            lookups(&noise);
            // Same noise behind a valid header pointing into it.
            if len >= HEADER_LEN {
                noise[..HEADER_LEN].copy_from_slice(&blob[..HEADER_LEN]);
                lookups(&noise);
            }
        }
    }

    #[test]
    fn cyclic_types_are_an_error() {
        let mut b = Blob::new();
        // Type 1 is a typedef of type 2, which is a typedef of type 1.
        b.ty("a_t", 8, 0, false, 2, &[]);
        b.ty("b_t", 8, 0, false, 1, &[]);
        // A struct whose anonymous member is itself.
        b.record("loop", 4, false, 8, &[("", 3, 0), ("c", 1, 0)]);
        let btf = KernelBtf::parse(&b.finish()).expect("parses");
        assert!(matches!(
            btf.member_offset("loop", &["x"]),
            Err(BtfError::Malformed(_))
        ));
        assert!(matches!(
            btf.member_offset("loop", &["c", "d"]),
            Err(BtfError::Malformed(_))
        ));
    }

    /// The running kernel's BTF (world-readable, no root needed; every
    /// kernel locktrace runs on has it).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn real_kernel_fsbase() {
        let offset = task_fsbase_offset().expect("task_struct.thread.fsbase");
        let size = KernelBtf::from_sys_fs()
            .and_then(|btf| btf.struct_size("task_struct"))
            .expect("task_struct size");
        eprintln!("task_struct.thread.fsbase at byte {offset} of {size}");
        assert_eq!(offset % 8, 0, "offset {offset}");
        assert!(
            offset < size,
            "offset {offset}, task_struct is {size} bytes"
        );
    }
}
