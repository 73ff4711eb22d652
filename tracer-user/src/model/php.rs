//! `--php`: thread-safe PHP read from outside. The report's `php` block
//! says where PHP's state was found and what could not be read; `routes`
//! gives each route's requests and, per request, its locks.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::address;

/// Where a layout came from: the offsets of PHP's structures, or a lock's
/// declared type (`locks[].declared`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LayoutSource {
    /// The module's own DWARF (built with `-g`, or its debug file).
    #[default]
    Dwarf,
    /// locktrace's table for the module's version (a stripped build): PHP's
    /// structures, CPython's GIL.
    Table,
}

/// The report's `php` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PhpContext {
    /// The module holding PHP's engine (`libphp.so`, or the executable of a
    /// static build), as the target sees it.
    pub module: String,
    /// `8.2.32`, from the module; null when not found.
    #[serde(default)]
    pub version: Option<String>,
    pub layout: LayoutSource,
    /// PHP threads found in PHP's own thread table (0 where it is not read,
    /// see `tls_slot_from`).
    pub threads: u64,
    /// Where the BPF side found each thread's PHP globals.
    #[serde(default)]
    pub thread_blocks: ThreadBlocks,
    /// How the TLS slot of each thread's globals (`_tsrm_ls_cache`) was
    /// found; null when it was not (`thread_blocks: table`) and in older
    /// reports.
    #[serde(default)]
    pub tls_slot_from: Option<TlsSlotFrom>,
    /// Events whose PHP context could not be read, by reason
    /// (`not_php_thread`, `no_php_code`, `read_failed`, `no_thread_pointer`);
    /// zero counts omitted. Such events are counted as always, without
    /// their PHP frames (or under the `(unreadable)` route).
    #[serde(default)]
    pub unread: BTreeMap<String, u64>,
}

/// How the BPF side finds a thread's block of PHP globals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ThreadBlocks {
    /// At a fixed offset from the thread pointer (PHP's `_tsrm_ls_cache`,
    /// found in the threads' TLS): every thread, from its first request.
    Tls,
    /// PHP's thread table as last read (each tick): a thread's requests
    /// before the next read count as `(unreadable)`.
    #[default]
    Table,
}

/// How the TLS slot of each thread's PHP globals was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TlsSlotFrom {
    /// Searched in the TLS of the threads of PHP's thread table (the module
    /// has its symbol table).
    ThreadTable,
    /// PHP's `tsrm_get_ls_cache_tcb_offset` (exported; its code, and the
    /// GOT slot it loads): a stripped build on glibc. PHP's thread table is
    /// not read: `threads` is 0.
    TcbOffsetFunction,
    /// The pthread key PHP's exported `tsrm_get_ls_cache` reads (its code)
    /// and musl's `pthread_getspecific` (its code): a stripped static musl
    /// build, where `tsrm_get_ls_cache_tcb_offset` returns 0. PHP's thread
    /// table is not read: `threads` is 0.
    PthreadKey,
}

/// What a route row stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    /// Requests with this method and path (after `--route-pattern`).
    Route,
    /// The routes past `--max-routes`, together.
    Other,
    /// Requests of routes that were new when the BPF side's route map was
    /// full (more distinct routes than it holds), together; their count is
    /// in `dropped.routes_past_cap`.
    PastCap,
    /// Requests whose method and path could not be read (also those that
    /// started in the moment after attach before PHP's offsets were loaded).
    Unreadable,
    /// Lock calls and waits on threads before their first request (the
    /// server's own threads: Go's, Apache's listener, …).
    OutsideRequests,
}

impl RouteKind {
    /// The name of the [`RouteKind::PastCap`] row.
    pub(crate) const PAST_CAP_NAME: &str = "(routes past the cap)";
}

/// The report's `routes` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Routes {
    /// Most requests first; `other`, `unreadable` and `outside_requests`
    /// rows last.
    pub routes: Vec<Route>,
    /// Distinct routes seen (before folding into `other`).
    pub distinct: u64,
    /// Routes kept apart; the rest are in the `other` row.
    pub max_routes: u64,
    /// `--route-pattern` rules applied, in order (`REGEX=NAME`).
    #[serde(default)]
    pub patterns: Vec<String>,
    /// CPU time one sample of the CPU sampler stands for; null without the
    /// sampler (`--no-cpu`, or the kernel refused it), when the routes have
    /// no CPU figures.
    #[serde(default)]
    pub cpu_sample_period_ns: Option<u64>,
    /// Why the routes' acquisitions are null; null where they are counted
    /// (`--mode all`).
    #[serde(default)]
    pub acquisitions_not_counted: Option<RouteCallsUncounted>,
}

/// Why no route's lock calls were counted (each lock's total still is, in
/// its row, in a mode that counts acquisitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouteCallsUncounted {
    /// `--mode contention`: no lock call is counted at all.
    ContentionMode,
    /// `--mode inproc`: the stubs count each lock and caller, not the
    /// route of the request the thread serves.
    InprocStubs,
}

impl RouteCallsUncounted {
    /// Why, for `mode`; None where each route's calls are counted.
    pub(crate) fn of(mode: super::Mode) -> Option<RouteCallsUncounted> {
        match mode {
            _ if mode.counts_acquisitions_per_route() => None,
            super::Mode::Inproc => Some(RouteCallsUncounted::InprocStubs),
            _ => Some(RouteCallsUncounted::ContentionMode),
        }
    }

    /// The table's line.
    pub(crate) fn line(self) -> &'static str {
        match self {
            RouteCallsUncounted::ContentionMode => {
                "acquisitions per route: not counted (--mode contention counts no lock call)"
            }
            RouteCallsUncounted::InprocStubs => {
                "acquisitions per route: not counted (--mode inproc's stubs count each lock exactly, not its route; --mode all counts both)"
            }
        }
    }
}

/// One route: its requests and, per lock, what its requests did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Route {
    /// `GET /posts/:id`; the script's path when the request had no URI.
    pub name: String,
    pub kind: RouteKind,
    pub requests: u64,
    /// Lock calls of all locks per request (null without requests).
    #[serde(default)]
    pub acquisitions_per_request: Option<f64>,
    /// The CPU sampler's samples of the target's threads while they served
    /// this route (from a request's start to the thread's next one), and
    /// that CPU time per request (samples × the period; null without the
    /// sampler or requests).
    #[serde(default)]
    pub cpu_samples: u64,
    #[serde(default)]
    pub cpu_us_per_request: Option<f64>,
    /// Most acquisitions first.
    pub locks: Vec<RouteLock>,
}

/// One lock under one route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RouteLock {
    /// The lock's `locks[].address`.
    #[serde(
        serialize_with = "address::serialize_without_lifetime",
        deserialize_with = "address::deserialize"
    )]
    #[schemars(with = "address::Hex")]
    pub address: u64,
    /// The lock's name, as in its row.
    #[serde(default)]
    pub name: Option<String>,
    pub acquisitions: u64,
    /// Contended waits and their time.
    pub contended: u64,
    pub wait_ns: u64,
    /// The three above per request of the route (null without requests).
    #[serde(default)]
    pub acquisitions_per_request: Option<f64>,
    #[serde(default)]
    pub contended_per_request: Option<f64>,
    #[serde(default)]
    pub wait_us_per_request: Option<f64>,
    /// The CPU sampler's samples in this lock's code (its lock functions
    /// and the kernel's futex code on it) under this route, and that CPU
    /// time per request (null without the sampler or requests).
    #[serde(default)]
    pub cpu_samples: u64,
    #[serde(default)]
    pub cpu_us_per_request: Option<f64>,
}
