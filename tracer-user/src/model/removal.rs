//! What removing a lock would save (`locks[].removal`): the CPU its own
//! code, its handoffs between CPUs and the kernel's futex work on it cost
//! the target, each part measured or priced separately.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a part of a lock's price was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PriceBasis {
    /// Exact counts × a cost calibrated on this machine.
    Calibrated,
    /// The CPU sampler's samples in that code.
    Sampled,
    /// Timed by the kernel's lock tracepoints (`kernel_locks`).
    Traced,
}

/// One part of a lock's price: CPU time over the recording.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PricePart {
    pub ns: f64,
    /// `ns` is within ± this.
    pub error_ns: f64,
    pub basis: PriceBasis,
}

/// `locks[].removal`: the CPU removing the lock would save the target,
/// assuming the critical section's own work stays and nothing synchronizes
/// it in the lock's place (an atomic replacement costs back its own
/// atomic operations: a few ns each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Removal {
    /// CPU time saved over the recording: the sum of the known parts.
    pub saving_ns: f64,
    /// `saving_ns` is within ± this (the parts' bounds added).
    pub error_ns: f64,
    /// The same per request; null without a request count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saving_ns_per_request: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_ns_per_request: Option<f64>,
    /// `saving_ns` as a share of the target's CPU time over the recording
    /// (0..1); null when that was not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_of_target_cpu: Option<f64>,
    /// The lock functions' own user-mode work: calls × the calibrated cost
    /// of an uncontended lock and unlock pair with its calls, or (contention
    /// mode, no call counts) the sampled CPU in them.
    pub lock_code: Option<PricePart>,
    /// The lock's cache line moving between CPUs: handoffs × the
    /// calibrated cost of one transfer (modes with lock probes).
    pub handoffs: Option<PricePart>,
    /// The kernel's futex waits and wakes on the lock's words, sampled
    /// (less `kernel_locks`, whose spins the same samples hold).
    pub kernel: Option<PricePart>,
    /// The spin waits for kernel locks (spinlocks, rwlocks: the futex hash
    /// bucket's, the runqueues') inside the lock's futex calls, as the
    /// kernel locks section timed them; null where none were traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_locks: Option<PricePart>,
    /// The scheduler's work the lock's waits cause outside its futex calls
    /// (the woken thread's reschedule interrupt, the preempted thread's
    /// switch back): the samples on interrupts from user code
    /// (`cpu.interrupted_samples`) × the lock's share of the target's futex
    /// waits; null without waits or samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<PricePart>,
    /// Parts that could not be priced, and why (`kernel: CPU not sampled
    /// (--no-cpu)`): the saving leaves them out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<String>,
}
