//! The closed vocabularies of a report: recording modes, probe placements,
//! lock kinds, stop reasons and request sources. Serialized as the lowercase
//! words the schema has always used.
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the lock probes do (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every acquisition counted, exact.
    All,
    /// No lock probes: futex tracepoints only (contention exact, acquisitions unknown).
    Contention,
    /// Lock probes attached a fraction of the time; counts scaled, marked as estimates.
    Sampled,
    /// Every acquisition counted, exact, inside the target: the modules'
    /// GOT entries lead to counting stubs (no trap); uprobes count the
    /// functions no GOT leads to.
    Inproc,
}

/// Where the lock probes go (`--placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// At each lock function's entry (the kernel may have to single-step it).
    Entry,
    /// At the first instruction the kernel emulates on every path, where safe.
    Auto,
}

/// What a lock in the report is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LockKind {
    Mutex,
    Rwlock,
    /// A futex word no pthread lock function was seen on.
    Futex,
    /// A condition variable (its wait functions were seen on it).
    Condvar,
    /// A `pthread_spinlock_t`: it spins instead of waiting, so it has
    /// acquisitions and CPU but never contended waits.
    Spinlock,
}

impl LockKind {
    /// Bytes a lock of this kind spans: futex words inside it belong to it.
    /// glibc x86-64: pthread_mutex_t is 40 bytes, pthread_rwlock_t 56.
    pub(crate) const fn span(self) -> u64 {
        match self {
            LockKind::Rwlock => 56,
            LockKind::Mutex | LockKind::Futex => 40,
            // pthread_cond_t, glibc and musl.
            LockKind::Condvar => 48,
            LockKind::Spinlock => 4,
        }
    }
}

/// What a futex word's waits mean: only `Lock` is contention.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    Serialize,
    Deserialize,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WaitClass {
    /// A pthread mutex or rwlock (its futex words): lock contention.
    #[default]
    Lock,
    /// A condition variable: threads waiting for work or an event.
    Condvar,
    /// A Go runtime word (notes, semaphores, runtime locks): the scheduler parking threads.
    GoRuntime,
    /// Any other futex word: no pthread lock, condvar or Go runtime call was seen on it.
    Other,
}

impl WaitClass {
    pub(crate) const ALL: [WaitClass; 4] = [
        WaitClass::Lock,
        WaitClass::Condvar,
        WaitClass::GoRuntime,
        WaitClass::Other,
    ];
}

/// Why a recording stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `--duration` ended.
    #[default]
    Duration,
    /// Ctrl-C, SIGTERM or SIGHUP.
    Interrupted,
    /// The target process exited.
    TargetExited,
    /// The load driver sent all its requests.
    LoadDone,
}

/// Where a report's request count comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RequestSource {
    /// Responses of the built-in load driver (`--load`).
    #[default]
    Load,
    /// Calls of a request-boundary function (`--request-probe`).
    Probe,
    /// Given by the user (`--requests N`).
    Given,
}

/// The server `--request-probe auto` recognised, which decides the function
/// counted as the request boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServerKind {
    /// FrankenPHP (Go host with PHP threads), classic or worker mode.
    Frankenphp,
    /// Apache httpd with mod_php.
    ApacheModPhp,
    /// Any other process with PHP's engine (libphp, an embed or CLI SAPI).
    Php,
}

macro_rules! display_as_serde_word {
    ($($kind:ty),*) => {$(
        impl fmt::Display for $kind {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // The serde word: one spelling for JSON, table and messages.
                let word = serde_json::to_value(self)
                    .ok()
                    .and_then(|value| value.as_str().map(str::to_string))
                    .unwrap_or_default();
                f.write_str(&word)
            }
        }
    )*};
}

display_as_serde_word!(
    Mode,
    Placement,
    LockKind,
    WaitClass,
    StopReason,
    RequestSource,
    ServerKind
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_the_schema_words() {
        assert_eq!(StopReason::TargetExited.to_string(), "target_exited");
        assert_eq!(StopReason::LoadDone.to_string(), "load_done");
        assert_eq!(LockKind::Rwlock.to_string(), "rwlock");
        assert_eq!(Mode::Contention.to_string(), "contention");
        assert_eq!(RequestSource::Given.to_string(), "given");
        assert_eq!(ServerKind::ApacheModPhp.to_string(), "apache_mod_php");
        assert_eq!(
            serde_json::from_str::<Placement>("\"auto\"").ok(),
            Some(Placement::Auto)
        );
    }
}
