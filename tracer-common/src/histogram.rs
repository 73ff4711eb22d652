//! Log2 buckets of durations, shared by the wait and hold histograms.
//! Bucket 0 holds durations under 256 ns, bucket `b` in 1..BUCKETS-1 holds
//! [2^(7+b), 2^(8+b)) ns, and the last one everything from 2^38 ns (~275 s) up.

pub const BUCKETS: usize = 32;
/// log2 of bucket 0's (exclusive) upper bound.
pub const FIRST_BITS: u32 = 8;

/// The bucket of a duration; branchy binary search, as BPF has no clz.
#[inline(always)]
pub fn bucket(ns: u64) -> usize {
    // bits = number of significant bits of ns (0 for 0).
    let mut value = ns;
    let mut bits = 0u32;
    if value >= 1 << 32 {
        value >>= 32;
        bits += 32;
    }
    if value >= 1 << 16 {
        value >>= 16;
        bits += 16;
    }
    if value >= 1 << 8 {
        value >>= 8;
        bits += 8;
    }
    if value >= 1 << 4 {
        value >>= 4;
        bits += 4;
    }
    if value >= 1 << 2 {
        value >>= 2;
        bits += 2;
    }
    if value >= 1 << 1 {
        value >>= 1;
        bits += 1;
    }
    bits += value as u32;
    let bucket = bits.saturating_sub(FIRST_BITS) as usize;
    if bucket >= BUCKETS {
        BUCKETS - 1
    } else {
        bucket
    }
}

/// Exclusive upper bound of a bucket in ns (u64::MAX for the last).
pub const fn upper_bound_ns(bucket: usize) -> u64 {
    if bucket + 1 >= BUCKETS {
        u64::MAX
    } else {
        1 << (FIRST_BITS as usize + bucket)
    }
}
