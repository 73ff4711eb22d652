//! What was still going on when the recording stopped: waits not yet over
//! (also those that began before attach), holds not yet released, and the
//! cycles of waits that will never end (deadlocks).
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{WaitClass, address};

/// A wait for a lock, or a hold of one, in progress at the end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct InProgress {
    pub activity: Activity,
    /// The lock (for a futex word inside a known lock, the lock's address),
    /// or the futex word.
    #[serde(with = "address")]
    #[schemars(with = "address::Hex")]
    pub lock: u64,
    /// The lock's name as in `locks[]` (null if it has none).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub region: super::Region,
    /// Waits only: whether it is lock contention or waiting for work.
    #[serde(default)]
    pub wait_class: Option<WaitClass>,
    pub tid: u32,
    #[serde(default)]
    pub thread: Option<String>,
    /// How long so far; for a wait that began before attach, since attach
    /// (it has lasted at least that long).
    pub elapsed_ns: u64,
    /// The wait was already blocked in the kernel when the probes went in.
    #[serde(default)]
    pub since_before_attach: bool,
    /// Waits only: who holds the lock now, where known.
    #[serde(default)]
    pub holder: Option<ThreadRef>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activity {
    Wait,
    Hold,
}

/// A thread of the target, by tid and name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ThreadRef {
    pub tid: u32,
    #[serde(default)]
    pub thread: Option<String>,
}

/// Threads each waiting for a lock the next one holds, the last waiting
/// for one the first holds: none of them can go on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Deadlock {
    pub cycle: Vec<DeadlockStep>,
}

/// One thread of a deadlock: it waits for `lock`, held by `held_by`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct DeadlockStep {
    pub tid: u32,
    #[serde(default)]
    pub thread: Option<String>,
    #[serde(with = "address")]
    #[schemars(with = "address::Hex")]
    pub lock: u64,
    #[serde(default)]
    pub name: Option<String>,
    pub held_by: u32,
}
