//! The uprobe cookie says which lock function a probe is in and where the
//! return address is on the stack at that probe (8 bytes per push done
//! before the probe point, 0 at the entry).

use super::LockOp;

pub const fn encode(op: LockOp, return_address_sp_offset: u32) -> u64 {
    ((return_address_sp_offset as u64) << 8) | op as u64
}

pub const fn op_index(cookie: u64) -> u32 {
    (cookie & 0xff) as u32
}

pub const fn return_address_sp_offset(cookie: u64) -> u64 {
    cookie >> 8
}
