//! The request boundary (`--request-probe`): counts requests per CPU.

use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use tracer_common::{counting, drop_reason, flags, requests};

use crate::{
    counters::{add, count_drop, counting_state, is_target},
    maps::{FLAGS, REQUESTS},
    php::begin_request,
};

/// Attached to the user's request-boundary function (`--request-probe`).
#[uprobe]
pub fn request_boundary(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) {
        return 0;
    }
    let state = counting_state();
    if state & counting::PAUSED != 0 {
        count_drop(drop_reason::PAUSED_FOR_EXPIRY);
        return 0;
    }
    // Sampled mode: requests count over the same windows as the locks, and
    // over the whole recording (what the windows' counts are scaled to).
    if state & counting::LOCK_CALLS != 0
        && let Some(counter) = REQUESTS.get_ptr_mut(requests::WHILE_COUNTING)
    {
        add(counter, 1);
    }
    if state & counting::WAITS != 0
        && let Some(counter) = REQUESTS.get_ptr_mut(requests::WHOLE_RECORDING)
    {
        add(counter, 1);
    }
    if state & counting::WAITS != 0 && FLAGS.load() & flags::PHP != 0 {
        begin_request();
    }
    0
}
