//! The report model: plain serde types that every output reads and that
//! `analysis` and `naming` fill. Imports nothing from the rest of the crate,
//! so any layer may use it.
//!
//! Schema `locktrace.report/1`: later versions add fields, never rename them.
pub(crate) mod address;
mod collected;
mod coverage;
mod cpu;
mod destination;
pub(crate) mod diagnostics;
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
pub(crate) mod plan;
mod pointer_chains;
mod region;
mod removal;
mod report;
mod requests;
mod sampled_run;
mod saturation;
mod schema;
pub(crate) mod word;
pub(crate) use word::Worded;

pub(crate) use collected::{
    Blocked, Collected, InFlight, KernelLocksCollected, PhpCollected, PhpFrameRead, PhpSnapshot,
    UnwoundStack,
};
pub(crate) use coverage::{Coverage, ExecLoss, ExecSeen, FoundByCode, MainThreadExit, TargetExit};
pub(crate) use cpu::{CpuReport, cpu_error_ns, sample_period_ns};
pub(crate) use destination::{Destination, write_output};
pub use drop_reason::DropReason;
pub(crate) use estimate::{Estimate, ScaleBasis, WindowLinkKind};
pub use handoffs::HandoffClass;
pub(crate) use handoffs::{HandoffCostSource, Handoffs};
pub(crate) use holds::{HoldSite, Holds, WaitHolder, add_histogram, merge_histogram, quantile};
pub(crate) use in_progress::{Activity, Deadlock, DeadlockStep, InProgress, ThreadRef};
pub(crate) use inproc::{CountedBy, Inproc, InprocFunction, InprocModule, Restore, RestoreOutcome};
pub(crate) use kernel_locks::{
    KERNEL_STACKS_PER_LOCK, KernelLockKind, KernelLockRoute, KernelSite, KernelStack,
    KernelUserLock, KernelUserSite, KernelUserStack,
};
pub use kernel_locks::{KernelLock, KernelLocks};
pub use kinds::{LockKind, Mode, Placement, ServerKind, StopReason};
pub(crate) use kinds::{RequestSource, WaitClass};
pub(crate) use lifetimes::{EndedLifetime, Lifetimes};
pub use overhead::Calibration;
pub(crate) use overhead::Overhead;
pub use php::TlsSlotFrom;
pub(crate) use php::{
    LayoutSource, PhpContext, Route, RouteCallsUncounted, RouteKind, RouteLock, Routes,
    ThreadBlocks,
};
pub(crate) use placement_refusal::{At, Elsewhere, PlacementRefusal};
pub(crate) use pointer_chains::{ChainSearch, PointerChains};
pub(crate) use region::Region;
pub(crate) use removal::{PriceBasis, PricePart, Removal};
pub use report::Report;
pub(crate) use report::{
    AddressFigures, AlternativeName, CallSites, Caller, ClassTotals, CreatedBy, Creation,
    DeclaredContention, DeclaredType, Frame, LiveNaming, Lock, LockChain, LockStack, Naming,
    PhpLocation, PlacementFallback, SCHEMA, SiteGroup, SkipReason, SkippedFile, StackEnd,
    StackOrigin, StackSource, StrippedModule, TargetInfo, Totals, sorted_callers,
};
pub(crate) use requests::{AutoProbe, PerRequest, Requests};
pub(crate) use sampled_run::{CountingWindow, SampledRun};
pub(crate) use saturation::{QueueModel, SATURATION_NOTE_AT, Saturation};
pub use schema::report_schema;
