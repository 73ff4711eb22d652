//! The raw `bpf(2)` calls aya 0.14 does not make for us (uprobe-multi
//! program loads, the kernel feature probes), in one place: the attr
//! layouts and the one `unsafe` syscall.
use std::os::fd::{FromRawFd, OwnedFd};

pub(crate) const BPF_MAP_CREATE: libc::c_long = 0;
pub(crate) const BPF_PROG_LOAD: libc::c_long = 5;

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type` (the
/// kernel zero-fills a shorter attr).
#[repr(C)]
#[derive(Default)]
pub(crate) struct ProgLoadAttr {
    pub prog_type: u32,
    pub insn_cnt: u32,
    pub insns: u64,
    pub license: u64,
    pub log_level: u32,
    pub log_size: u32,
    pub log_buf: u64,
    pub kern_version: u32,
    pub prog_flags: u32,
    pub prog_name: [u8; 16],
    pub prog_ifindex: u32,
    pub expected_attach_type: u32,
}

impl ProgLoadAttr {
    /// A load of `instructions` (raw `bpf_insn`s: 8 bytes each) as a
    /// program of `prog_type` under `license`.
    pub(crate) fn new<I>(
        prog_type: u32,
        instructions: &[I],
        license: &std::ffi::CStr,
    ) -> ProgLoadAttr {
        debug_assert_eq!(std::mem::size_of::<I>(), 8);
        ProgLoadAttr {
            prog_type,
            insn_cnt: instructions.len() as u32,
            insns: instructions.as_ptr() as u64,
            license: license.as_ptr() as u64,
            ..ProgLoadAttr::default()
        }
    }
}

/// Loads a probe program (`instructions` as raw words) of `prog_type`:
/// whether the kernel accepts it is the answer to a feature question.
pub(crate) fn load_probe_program(prog_type: u32, instructions: &[u64]) -> std::io::Result<OwnedFd> {
    bpf(
        BPF_PROG_LOAD,
        &mut ProgLoadAttr::new(prog_type, instructions, c"GPL"),
    )
}

/// The `bpf(2)` syscall with `attr`, a prefix of `union bpf_attr`.
pub(crate) fn bpf<T>(command: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a live repr(C) prefix of `union bpf_attr` of the
    // size passed; the pointers inside it outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
