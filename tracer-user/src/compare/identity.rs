//! What makes a lock in one report the same lock in another: its identity
//! (never its address, which a restart changes).
use std::{cmp::Ordering, fmt};

use crate::model::{LockKind, WaitClass};

/// How a lock is known across runs, first that exists.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Identified {
    /// Its name in C notation (symbol, pointer chain, creation site).
    Name(String),
    /// No name: its kind and caller functions (sorted, each once).
    Callers {
        kind: LockKind,
        functions: Vec<String>,
    },
    /// Neither name nor callers: only its kind.
    Unidentified(LockKind),
}

/// A lock's identity: how it is known and, so that like only matches like
/// (a condvar or runtime word never matches a lock), its wait class.
/// Ordered as written (`[condvar] …` before names), as the rows are listed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LockIdentity {
    pub class: WaitClass,
    pub by: Identified,
}

impl LockIdentity {
    /// The name it is known by, if a lock (not a condvar or other futex
    /// word) known by name: an alias can only stand for such an identity.
    pub(crate) fn lock_name(&self) -> Option<&str> {
        match (&self.class, &self.by) {
            (WaitClass::Lock, Identified::Name(name)) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Identified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identified::Name(name) => f.write_str(name),
            Identified::Callers { kind, functions } => {
                write!(f, "{kind} via {}", functions.join(", "))
            }
            Identified::Unidentified(kind) => write!(f, "unidentified {kind}"),
        }
    }
}

impl fmt::Display for LockIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.class {
            WaitClass::Lock => write!(f, "{}", self.by),
            class => write!(f, "[{class}] {}", self.by),
        }
    }
}

impl PartialOrd for LockIdentity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockIdentity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.to_string()
            .cmp(&other.to_string())
            .then_with(|| (self.class, &self.by).cmp(&(other.class, &other.by)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(class: WaitClass, by: Identified) -> LockIdentity {
        LockIdentity { class, by }
    }

    #[test]
    fn identities_are_written_as_before() {
        let callers = Identified::Callers {
            kind: LockKind::Mutex,
            functions: vec!["f".into(), "g".into()],
        };
        assert_eq!(
            identity(WaitClass::Lock, callers.clone()).to_string(),
            "mutex via f, g"
        );
        assert_eq!(
            identity(WaitClass::Lock, Identified::Unidentified(LockKind::Rwlock)).to_string(),
            "unidentified rwlock"
        );
        let name = Identified::Name("*g_stats->lock".into());
        assert_eq!(
            identity(WaitClass::Lock, name.clone()).to_string(),
            "*g_stats->lock"
        );
        let condvar = identity(WaitClass::Condvar, name.clone());
        assert_eq!(
            condvar.to_string(),
            format!("[{}] *g_stats->lock", WaitClass::Condvar)
        );
        assert_eq!(condvar.lock_name(), None);
        assert_eq!(
            identity(WaitClass::Lock, name).lock_name(),
            Some("*g_stats->lock")
        );
    }

    /// A name spelled like a callers identity is another lock.
    #[test]
    fn a_name_never_matches_callers_spelled_alike() {
        let name = identity(WaitClass::Lock, Identified::Name("mutex via f".into()));
        let callers = identity(
            WaitClass::Lock,
            Identified::Callers {
                kind: LockKind::Mutex,
                functions: vec!["f".into()],
            },
        );
        assert_eq!(name.to_string(), callers.to_string());
        assert_ne!(name, callers);
        assert_ne!(name.cmp(&callers), Ordering::Equal);
    }
}
