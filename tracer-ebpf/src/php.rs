//! `--php` (see `tracer_common::php`): the route of each request, counts
//! per (route, lock), and the PHP stack in each snapshot.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{bpf_get_current_task, bpf_probe_read_user_str},
    },
};
use tracer_common::{
    LockOp, ThreadRoute, drop_reason,
    php::{
        FILE_BYTES, MAX_FRAMES, NO_REQUEST, PAST_CAP_ROUTE, PhpFrame, PhpOffsets, PhpStack,
        RouteLockCounts, RouteLockKey, RouteText, UNREADABLE_ROUTE, USER_FUNCTION, miss,
        route_hash,
    },
};

use crate::{
    counters::{add, count_drop, entry},
    holds::in_lock_code,
    maps::{
        PHP_MISSES, PHP_OFFSETS, PHP_THREADS, ROUTE_CPU, ROUTE_LOCKS, ROUTE_REQUESTS, ROUTE_TEXTS,
        THREAD_ROUTES,
    },
};

/// The offsets userspace loaded (None before, or without `--php`).
#[inline(always)]
fn offsets() -> Option<&'static PhpOffsets> {
    PHP_OFFSETS.get(0).filter(|offsets| offsets.enabled != 0)
}

#[inline(always)]
fn count_miss(reason: u32) {
    if let Some(counter) = PHP_MISSES.get_ptr_mut(reason) {
        add(counter, 1);
    }
}

#[inline(always)]
fn read_u64(address: u64) -> Result<u64, u32> {
    // SAFETY: the helper checks the user address and fails (never faults).
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| miss::READ_FAILED)
}

/// Copies the NUL-terminated string at `address` into `dest` (cut to fit,
/// always terminated); an empty string when the read fails.
#[inline(always)]
fn read_str(address: u64, dest: &mut [u8]) {
    dest[0] = 0;
    // SAFETY: `dest` is a buffer of `dest.len()` bytes; the helper checks the
    // user address and fails (never faults).
    let read = unsafe {
        bpf_probe_read_user_str(
            dest.as_mut_ptr() as *mut core::ffi::c_void,
            dest.len() as u32,
            address as *const core::ffi::c_void,
        )
    };
    if read < 0 {
        dest[0] = 0;
    }
}

/// The current thread's block of PHP globals (TSRM's entry), through its
/// thread pointer.
#[inline(always)]
fn thread_block(offsets: &PhpOffsets) -> Result<u64, u32> {
    // SAFETY: the helper returns the current task's address; the read
    // helper checks the kernel address and fails (never faults).
    let fsbase = unsafe {
        let task = bpf_get_current_task();
        bpf_probe_read_kernel((task + offsets.task_fsbase) as *const u64)
    }
    .map_err(|_| miss::NO_THREAD_POINTER)?;
    if offsets.tls_known != 0
        && let Ok(slot) = tls_slot(offsets, fsbase)
        && let Ok(block) = read_u64(slot)
        && block != 0
    {
        return Ok(block);
    }
    // No TLS slot known, or not set on this thread yet (PHP sets its cache
    // after creating the thread's block): PHP's table as last read.
    // SAFETY: the value is copied out at once.
    unsafe { PHP_THREADS.get(fsbase) }
        .copied()
        .ok_or(miss::THREAD_UNKNOWN)
}

/// Where the thread whose thread pointer is `fsbase` keeps its block: at
/// `tls_offset` from it, or in the array pointed to from there.
#[inline(always)]
fn tls_slot(offsets: &PhpOffsets, fsbase: u64) -> Result<u64, u32> {
    let slot = fsbase.wrapping_add(offsets.tls_offset);
    if offsets.tls_indirect == 0 {
        return Ok(slot);
    }
    Ok(read_u64(slot)?.wrapping_add(offsets.tls_index_offset))
}

/// At a request's start (the request probe): labels the thread with the
/// request's route and counts the request under it.
#[inline(always)]
pub(crate) fn begin_request() {
    // Before userspace has loaded PHP's offsets (the first moments after
    // attach) a request counts as unreadable, with its locks: every request
    // and acquisition in one route.
    let route = match offsets().map(read_route) {
        Some(Ok(route)) => route,
        Some(Err(reason)) => {
            count_miss(reason);
            UNREADABLE_ROUTE
        }
        None => UNREADABLE_ROUTE,
    };
    if let Some(state) = thread_state() {
        // SAFETY: `state` is the map value just looked up.
        unsafe { (*state).route = route };
    }
    if let Some(count) = entry(&ROUTE_REQUESTS, &route, drop_reason::ROUTES_FULL) {
        add(count, 1);
    }
}

/// `SG(request_info)`'s method and path (the script's path without a URI),
/// cut at the query string, stored in `ROUTE_TEXTS` under its hash.
#[inline(always)]
fn read_route(offsets: &PhpOffsets) -> Result<u64, u32> {
    let sapi = thread_block(offsets)? + offsets.sapi_globals;
    let mut text = RouteText {
        method: [0; tracer_common::php::METHOD_BYTES],
        path: [0; tracer_common::php::PATH_BYTES],
    };
    let method = read_u64(sapi + offsets.request_method)?;
    let mut path = read_u64(sapi + offsets.request_uri)?;
    if path == 0 {
        path = read_u64(sapi + offsets.path_translated)?;
    }
    if path == 0 {
        return Err(miss::READ_FAILED);
    }
    if method != 0 {
        read_str(method, &mut text.method);
    }
    read_str(path, &mut text.path);
    cut_query(&mut text.path);
    let route = route_hash(&text);
    let _ = ROUTE_TEXTS.insert(route, text, BPF_NOEXIST as u64);
    // SAFETY: only whether the key is there is read.
    if unsafe { ROUTE_TEXTS.get(route) }.is_none() {
        // The map is full: a route of its own would have no name, and
        // would be shown as unreadable.
        count_drop(drop_reason::ROUTES_PAST_CAP);
        return Ok(PAST_CAP_ROUTE);
    }
    Ok(route)
}

/// Zeroes the path from its query string (or end) on. Without branches:
/// the verifier walks every byte, and a branch per byte multiplies its
/// states past its limit.
#[inline(always)]
fn cut_query(path: &mut [u8; tracer_common::php::PATH_BYTES]) {
    let mut live: u64 = 1;
    for byte in path.iter_mut() {
        let value = u64::from(*byte);
        // 1 when the byte is not 0, and when it is not '?' (both below 256).
        let not_end = (value + 255) >> 8;
        let not_query = ((value ^ u64::from(b'?')) + 255) >> 8;
        live &= not_end & not_query;
        *byte = (value * live) as u8;
    }
}

/// The current thread's state, created (route `NO_REQUEST`) at its first
/// use; None when the map is full.
#[inline(always)]
fn thread_state() -> Option<*mut ThreadRoute> {
    let tid = bpf_get_current_pid_tgid() as u32;
    entry(&THREAD_ROUTES, &tid, drop_reason::ROUTES_FULL)
}

/// The current thread's route (`NO_REQUEST` before its first request).
#[inline(always)]
pub(crate) fn current_route() -> u64 {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out at once.
    unsafe { THREAD_ROUTES.get(tid) }
        .map(|state| state.route)
        .unwrap_or(NO_REQUEST)
}

/// The (route, lock) counts of `route`.
#[inline(always)]
fn route_counts(route: u64, lock: u64) -> Option<*mut RouteLockCounts> {
    let key = RouteLockKey { route, lock };
    entry(&ROUTE_LOCKS, &key, drop_reason::ROUTES_FULL)
}

/// At a lock call's entry: whether it is nested in another lock call
/// (made from inside a lock function, or tail-called by the call this
/// thread entered last), remembering this entry for the next; and, when
/// `count` and not nested, one acquisition of `lock` under the thread's
/// route. Nested calls are the same acquisition: the lock's row leaves
/// them out, so do routes.
#[inline(always)]
pub(crate) fn route_call(lock: u64, op: u32, slot: u64, return_ip: u64, count: bool) -> bool {
    let Some(state) = thread_state() else {
        return false;
    };
    // SAFETY: `state` is this thread's map value, looked up just now; only
    // this thread writes it.
    let (tail_called, route) = unsafe {
        let tail_called = (*state).return_slot == slot
            && (*state).return_ip == return_ip
            && LockOp::index_tail_called_by(op, (*state).op as u32);
        (*state).return_slot = slot;
        (*state).return_ip = return_ip;
        (*state).op = u64::from(op);
        (tail_called, (*state).route)
    };
    let nested = tail_called || in_lock_code(return_ip);
    if count && !nested {
        count_route_call(route, lock);
    }
    nested
}

/// One acquisition of `lock` under `route`.
#[inline(always)]
pub(crate) fn count_route_call(route: u64, lock: u64) {
    if let Some(counts) = route_counts(route, lock) {
        // SAFETY: `counts` is the map value just looked up.
        add(unsafe { &mut (*counts).calls }, 1);
    }
}

/// One contended wait of `waited` ns on `lock` under the thread's route.
#[inline(always)]
pub(crate) fn count_route_wait(lock: u64, waited: u64) {
    if let Some(counts) = route_counts(current_route(), lock) {
        // SAFETY: `counts` is the map value just looked up.
        unsafe {
            add(&mut (*counts).waits, 1);
            add(&mut (*counts).wait_ns, waited);
        }
    }
}

/// A CPU sample of a target thread, under the thread's route.
#[inline(always)]
pub(crate) fn count_route_sample() {
    if let Some(count) = entry(&ROUTE_CPU, &current_route(), drop_reason::ROUTES_FULL) {
        add(count, 1);
    }
}

/// A CPU sample in `lock`'s code, under the thread's route.
#[inline(always)]
pub(crate) fn count_route_lock_sample(lock: u64) {
    if let Some(counts) = route_counts(current_route(), lock) {
        // SAFETY: `counts` is the map value just looked up.
        add(unsafe { &mut (*counts).cpu_samples }, 1);
    }
}

/// The line running in the innermost frame written in PHP, as a key part
/// (`StackKey::php_site`): line numbers stay the same from request to
/// request where the frames' addresses do not (PHP compiles each script
/// again per request without opcache). One line, not a whole PHP stack:
/// this runs at every lock call (each frame more is four reads of the
/// target's memory); the callers of that line share its snapshots. 0
/// outside PHP code.
#[inline(always)]
pub(crate) fn php_site() -> u64 {
    let Some(offsets) = offsets() else {
        return 0;
    };
    let Ok(block) = thread_block(offsets) else {
        return 0;
    };
    let mut execute_data =
        read_u64(block + offsets.executor_globals + offsets.current_execute_data).unwrap_or(0);
    // The innermost frames are often PHP functions written in C
    // (`PDOStatement::execute`): a few frames up at most.
    for _ in 0..4 {
        if execute_data == 0 {
            break;
        }
        if let Some(line) = user_line(offsets, execute_data) {
            return u64::from(line) + 1;
        }
        execute_data = read_u64(execute_data + offsets.execute_data_prev).unwrap_or(0);
    }
    0
}

/// The line running in a frame of a function written in PHP.
#[inline(always)]
fn user_line(offsets: &PhpOffsets, execute_data: u64) -> Option<u32> {
    let function = read_u64(execute_data + offsets.execute_data_func).ok()?;
    // SAFETY: the helper checks the user address and fails (never faults).
    let kind =
        unsafe { bpf_probe_read_user((function + offsets.function_type) as *const u8) }.ok()?;
    if function == 0 || kind != USER_FUNCTION {
        return None;
    }
    let opline = read_u64(execute_data + offsets.execute_data_opline).ok()?;
    // SAFETY: as above.
    unsafe { bpf_probe_read_user((opline + offsets.op_lineno) as *const u32) }.ok()
}

/// Fills `stack` (inside a reserved snapshot) with the thread's PHP frames,
/// innermost first, or the reason none were read.
#[inline(always)]
pub(crate) fn read_php_stack(stack: *mut PhpStack) {
    // SAFETY: `stack` points into the ring buffer record the caller reserved.
    unsafe {
        (*stack).depth = 0;
        (*stack).miss = 0;
        (*stack).route = current_route();
    }
    let Some(offsets) = offsets() else {
        return;
    };
    let result = thread_block(offsets).and_then(|block| {
        read_u64(block + offsets.executor_globals + offsets.current_execute_data)
    });
    let mut frame_data = match result {
        Ok(0) => Err(miss::NO_PHP_CODE),
        other => other,
    };
    if let Err(reason) = frame_data {
        count_miss(reason);
        // SAFETY: as above.
        unsafe { (*stack).miss = reason + 1 };
        return;
    }
    let mut depth = 0u32;
    for index in 0..MAX_FRAMES {
        let Ok(execute_data) = frame_data else {
            break;
        };
        if execute_data == 0 {
            break;
        }
        // SAFETY: `index < MAX_FRAMES`, inside the reserved record.
        let frame = unsafe { &mut (*stack).frames[index] };
        // A frame that did not read stays in, as unknown (kind 0): the
        // depth follows the loop alone, which keeps the verifier's paths few.
        if read_frame(offsets, execute_data, frame).is_err() {
            frame.kind = 0;
        }
        depth = index as u32 + 1;
        frame_data = read_u64(execute_data + offsets.execute_data_prev);
    }
    // SAFETY: as above.
    unsafe { (*stack).depth = depth };
}

/// One frame: its function, class, file (the end of its path) and line.
#[inline(always)]
fn read_frame(offsets: &PhpOffsets, execute_data: u64, frame: &mut PhpFrame) -> Result<(), u32> {
    frame.line = 0;
    frame.function[0] = 0;
    frame.class[0] = 0;
    frame.file[0] = 0;
    let function = read_u64(execute_data + offsets.execute_data_func)?;
    if function == 0 {
        frame.kind = 0;
        return Ok(());
    }
    // SAFETY: the helper checks the user address and fails (never faults).
    let kind = unsafe { bpf_probe_read_user((function + offsets.function_type) as *const u8) }
        .map_err(|_| miss::READ_FAILED)?;
    frame.kind = u32::from(kind);
    let name = read_u64(function + offsets.function_name)?;
    if name != 0 {
        read_str(name + offsets.string_val, &mut frame.function);
    }
    let scope = read_u64(function + offsets.function_scope)?;
    if scope != 0 {
        let class = read_u64(scope + offsets.class_name)?;
        if class != 0 {
            read_str(class + offsets.string_val, &mut frame.class);
        }
    }
    if kind != USER_FUNCTION {
        return Ok(());
    }
    let file = read_u64(function + offsets.op_array_filename)?;
    if file != 0 {
        let len = read_u64(file + offsets.string_len)?;
        let keep = (FILE_BYTES - 1) as u64;
        let skip = len.saturating_sub(keep);
        read_str(file + offsets.string_val + skip, &mut frame.file);
    }
    let opline = read_u64(execute_data + offsets.execute_data_opline)?;
    if opline != 0 {
        // SAFETY: as above.
        frame.line =
            unsafe { bpf_probe_read_user((opline + offsets.op_lineno) as *const u32) }.unwrap_or(0);
    }
    Ok(())
}
