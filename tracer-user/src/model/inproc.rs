//! `--mode inproc`: which mechanism counted each lock function, what was
//! written into the target, and whether it was all put back.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a lock function's calls were counted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CountedBy {
    /// Counting stubs in the target, entered through the modules' GOT entries.
    GotStubs,
    /// Uprobes, as in `--mode all` (no module calls the function through a GOT).
    Uprobe,
    /// Neither: no module calls it through a GOT, and a uprobe would count
    /// twice the calls a stubbed function makes to it (see `not_covered`).
    NotCounted,
}

/// One module whose GOT entries for a function were switched to a stub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InprocModule {
    /// Path as the target sees it.
    pub module: String,
    /// GOT entries switched (one per relocation and loaded copy).
    pub entries: u64,
    /// Linked with `-z now` (its GOT is read-only: made writable for the
    /// switch, then read-only again).
    pub bind_now: bool,
    /// Entries the lazy binder had not resolved yet when they were switched.
    pub unresolved: u64,
}

/// One lock function in `--mode inproc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InprocFunction {
    pub function: String,
    pub counted_by: CountedBy,
    /// The modules whose calls the stubs counted (`got_stubs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<InprocModule>,
    /// What the mechanism does not see, one line each: calls from inside
    /// the module that defines the function, entries left alone and why,
    /// or why uprobes count it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_covered: Vec<String>,
}

/// How the GOT entries were put back at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestoreOutcome {
    /// Every switched entry holds its original value again.
    Restored,
    /// The target exited: nothing left to restore.
    TargetExited,
    /// The lazy binder overwrote entries (calls after that went uncounted);
    /// the others were restored.
    Overwritten,
    /// Restoring failed; `locktrace restore --pid PID` retries.
    Failed,
    /// Nothing was switched (every function counted by uprobes).
    NothingSwitched,
    /// The process ran another program (exec) or unmapped locktrace's
    /// memory: the switched entries are gone with the old program.
    ProgramReplaced,
}

/// The end of the switch: the outcome, and its figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Restore {
    pub outcome: RestoreOutcome,
    /// Entries switched back.
    pub entries: u64,
    /// Entries the lazy binder had overwritten (`overwritten`).
    #[serde(default)]
    pub overwritten: u64,
    /// Why restoring failed (`failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Entries whose library was unloaded (dlclose) while switched:
    /// nothing left to restore there, and nothing touched.
    #[serde(default)]
    pub unloaded: u64,
}

impl Restore {
    pub(crate) fn outcome(outcome: RestoreOutcome) -> Restore {
        Restore {
            outcome,
            entries: 0,
            overwritten: 0,
            reason: None,
            unloaded: 0,
        }
    }
}

/// The `inproc` block of a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Inproc {
    pub functions: Vec<InprocFunction>,
    /// Address of the mapping locktrace made in the target (left mapped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapping: Option<String>,
    /// Whether each CPU counts in its own table (the CPU's `rdpid` gives
    /// the stubs the CPU); without it every thread counts in one table.
    #[serde(default)]
    pub per_cpu_tables: bool,
    /// Calls not counted because a stub's table was full.
    pub table_overflow: u64,
    /// GOT entries (or modules) of the lock functions found and not
    /// switched (left alone, unreadable, past the header's room): their
    /// calls are not counted.
    #[serde(default)]
    pub entries_not_switched: u64,
    /// Modules with GOT entries for the lock functions that were loaded
    /// while recording: not switched, their calls not counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded_while_recording: Vec<String>,
    /// GOT entries an earlier run left switched (killed before it could
    /// restore them), restored at the start of this one.
    pub restored_at_start: u64,
    pub restore: Restore,
    /// `--stacks`: the stubs sample one acquisition in this many per
    /// lock, call site and CPU (a power of two), and take its stack; the
    /// `sampled_lock_calls` stacks count these samples, not calls. Absent
    /// without `--stacks`, or when sampling is off (`stack_samples_off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_sample_every: Option<u64>,
    /// `--stacks` asked for and the stubs take no samples: why (a seccomp
    /// filter that may stop their `getppid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_samples_off: Option<String>,
}
