//! The report model: plain serde types that every output reads and that
//! `analysis` and `naming` fill. Imports nothing from the rest of the crate,
//! so any layer may use it.
//!
//! Schema `locktrace.report/1`: later versions add fields, never rename them.
pub mod address;
mod collected;
mod coverage;
mod cpu;
mod destination;
pub mod diagnostics;
mod drop_reason;
mod estimate;
mod handoffs;
mod holds;
mod in_progress;
mod inproc;
mod kernel_locks;
mod kinds;
mod lifetimes;
mod overhead;
mod php;
mod placement_refusal;
pub mod plan;
mod pointer_chains;
mod region;
mod removal;
mod report;
mod requests;
mod sampled_run;
mod saturation;
mod schema;
pub(crate) mod word;
pub use word::Worded;

pub use collected::{
    Blocked, Collected, InFlight, KernelLocksCollected, PhpCollected, PhpFrameRead, PhpSnapshot,
    UnwoundStack,
};
pub use coverage::{Coverage, ExecLoss, ExecSeen, FoundByCode, MainThreadExit, TargetExit};
pub use cpu::{CpuReport, cpu_error_ns, sample_period_ns};
pub use destination::{Destination, write_output};
pub use drop_reason::DropReason;
pub use estimate::{Estimate, ScaleBasis, WindowLinkKind};
pub use handoffs::{HandoffClass, HandoffCostSource, Handoffs};
pub use holds::{HoldSite, Holds, WaitHolder, add_histogram, merge_histogram, quantile};
pub use in_progress::{Activity, Deadlock, DeadlockStep, InProgress, ThreadRef};
pub use inproc::{CountedBy, Inproc, InprocFunction, InprocModule, Restore, RestoreOutcome};
pub use kernel_locks::{
    KERNEL_STACKS_PER_LOCK, KernelLock, KernelLockKind, KernelLockRoute, KernelLocks, KernelSite,
    KernelStack, KernelUserLock, KernelUserSite, KernelUserStack,
};
pub use kinds::{LockKind, Mode, Placement, RequestSource, ServerKind, StopReason, WaitClass};
pub use lifetimes::{EndedLifetime, Lifetimes};
pub use overhead::{Calibration, Overhead};
pub use php::{
    LayoutSource, PhpContext, Route, RouteKind, RouteLock, Routes, ThreadBlocks, TlsSlotFrom,
};
pub use placement_refusal::{At, Elsewhere, PlacementRefusal};
pub use pointer_chains::{ChainSearch, PointerChains};
pub use region::Region;
pub use removal::{PriceBasis, PricePart, Removal};
pub use report::{
    AddressFigures, AlternativeName, CallSites, Caller, ClassTotals, CreatedBy, Creation,
    DeclaredContention, DeclaredType, Frame, LiveNaming, Lock, LockChain, LockStack,
    MAX_REPORT_BYTES, Naming, PhpLocation, PlacementFallback, Report, SCHEMA, SiteGroup,
    SkipReason, SkippedFile, StackEnd, StackOrigin, StackSource, StrippedModule, TargetInfo,
    Totals, sorted_callers,
};
pub use requests::{AutoProbe, PerRequest, Requests};
pub use sampled_run::{CountingWindow, SampledRun};
pub use saturation::{QueueModel, SATURATION_NOTE_AT, Saturation};
pub use schema::{report_schema, report_schema_text};
