//! [`LockKind`]: exclusive, shared (reader/writer) or one of N permits.

use std::fmt;

use super::LockSpec;
use crate::error::LockError;

/// The most permits a key can have: a bound that keeps every backend's
/// list of holders small enough to scan in one atomic step.
pub const MAX_PERMITS: u32 = 1024;

/// What kind of hold an acquisition asks for.
///
/// - [`Exclusive`](LockKind::Exclusive) (the default): one holder at a time.
/// - [`Shared`](LockKind::Shared): a read hold. Any number of shared holders
///   at once, never beside an exclusive one (a reader/writer lock: shared
///   holds are the readers, exclusive ones the writers).
/// - [`Permits(n)`](LockKind::Permits): at most `n` holders at once, each an
///   acquisition of its own (a distributed semaphore). Every holder of the
///   key must ask for the same `n`.
///
/// Each holder has its own TTL, fence, release and extension: a holder that
/// crashes frees only its own hold, when its TTL ends.
///
/// **Fairness.** Acquirers queue in arrival order across kinds. Consecutive
/// shared acquirers at the head of the queue are granted together; an
/// exclusive acquirer queued behind readers blocks the shared acquirers that
/// arrive after it (no writer starvation); a permit request waits behind
/// earlier ones even when a permit is free (no barging).
///
/// **Kinds that cannot meet.** A key's holders fix its family: exclusive
/// and shared holds share keys; permits share a key only with permits of the
/// same `n`. A request of another family than the key's current holders
/// (permits beside shared or exclusive holders, or `Permits(3)` beside
/// holders of `Permits(2)`) is refused at once with
/// [`LockError::KindMismatch`] (`409 LOCK_KIND_MISMATCH` from the layer); it
/// never waits.
///
/// **No upgrade.** A shared holder cannot turn its hold into an exclusive
/// one: two readers that both wait to upgrade would wait for each other
/// forever. Take the exclusive lock from the start when the work may write,
/// or release the shared hold and acquire exclusive (re-reading what was
/// read, since another writer may have come in between).
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{LockKind, LockSpec};
///
/// let read = LockSpec::global("doc:7", Duration::from_secs(10)).shared();
/// assert_eq!(read.get_kind(), LockKind::Shared);
/// let export = LockSpec::global("exports:acme", Duration::from_secs(60)).permits(2);
/// assert_eq!(export.get_kind(), LockKind::Permits(2));
/// assert_eq!("permits=2".parse::<LockKind>().unwrap(), LockKind::Permits(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Many shared holders at once, never beside an exclusive holder.
    Shared,
    /// At most this many holders at once (1 to [`MAX_PERMITS`]).
    Permits(u32),
}

impl LockKind {
    /// Check the number of permits: [`LockError::InvalidKind`] outside 1 to
    /// [`MAX_PERMITS`].
    pub fn validate(self) -> Result<(), LockError> {
        match self {
            LockKind::Permits(0) => Err(LockError::InvalidKind("permits must be at least 1")),
            LockKind::Permits(n) if n > MAX_PERMITS => {
                Err(LockError::InvalidKind("permits must be at most 1024"))
            }
            _ => Ok(()),
        }
    }

    /// Whether a hold of kind `self` and one of kind `other` can be on one
    /// key (held together or queued one behind the other).
    pub fn same_family(self, other: LockKind) -> bool {
        match (self, other) {
            (LockKind::Permits(a), LockKind::Permits(b)) => a == b,
            (LockKind::Permits(_), _) | (_, LockKind::Permits(_)) => false,
            _ => true,
        }
    }

    /// Whether a new hold of kind `self` fits beside `holders` holds of kind
    /// `held` (of the same family).
    pub fn fits_beside(self, held: LockKind, holders: usize) -> bool {
        if holders == 0 {
            return true;
        }
        match (self, held) {
            (LockKind::Shared, LockKind::Shared) => true,
            (LockKind::Permits(n), LockKind::Permits(m)) => n == m && holders < n as usize,
            _ => false,
        }
    }
}

/// The wire form: `exclusive`, `shared` or `permits=N` (as in the
/// `Lock-Mode` header and the admin API).
impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockKind::Exclusive => f.write_str("exclusive"),
            LockKind::Shared => f.write_str("shared"),
            LockKind::Permits(n) => write!(f, "permits={n}"),
        }
    }
}

impl std::str::FromStr for LockKind {
    type Err = LockError;

    /// `exclusive`, `shared` or `permits=N` (ASCII case ignored).
    fn from_str(s: &str) -> Result<Self, LockError> {
        const BAD: LockError =
            LockError::InvalidKind("a lock mode is exclusive, shared or permits=N");
        let lower = s.trim().to_ascii_lowercase();
        let kind = match lower.as_str() {
            "exclusive" => LockKind::Exclusive,
            "shared" => LockKind::Shared,
            other => {
                let n = other.strip_prefix("permits=").ok_or(BAD)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(BAD);
                }
                // Leading zeros name the same number.
                let n = match n.trim_start_matches('0') {
                    "" => "0",
                    digits if digits.len() > 10 => return Err(BAD),
                    digits => digits,
                };
                LockKind::Permits(n.parse().map_err(|_| BAD)?)
            }
        };
        kind.validate()?;
        Ok(kind)
    }
}

/// The kind on the spec's builder (here beside the kinds themselves).
impl LockSpec {
    /// Take a shared (read) hold: held together with other shared holds of
    /// the key, never beside an exclusive one (see [`LockKind`]). The
    /// default is exclusive.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::{LockKind, LockSpec};
    ///
    /// // GETs of one document run together; a PUT (exclusive) waits for them.
    /// let read = LockSpec::new("doc:7", Duration::from_secs(10)).shared();
    /// assert_eq!(read.get_kind(), LockKind::Shared);
    /// ```
    pub fn shared(self) -> Self {
        self.kind(LockKind::Shared)
    }

    /// Take one of `n` permits of the key: at most `n` holders at once,
    /// across every instance (see [`LockKind::Permits`]). `n` is 1 to
    /// [`MAX_PERMITS`]; every holder of the key must ask for the same `n`.
    /// Checked where the spec is used: [`LockError::InvalidKind`] (`400`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::{LockKind, LockSpec};
    ///
    /// // At most two report exports per tenant at once.
    /// let spec = LockSpec::global("exports:acme", Duration::from_secs(120)).permits(2);
    /// assert_eq!(spec.get_kind(), LockKind::Permits(2));
    /// ```
    pub fn permits(self, n: u32) -> Self {
        self.kind(LockKind::Permits(n))
    }

    /// Set the kind of hold (default [`LockKind::Exclusive`]).
    pub fn kind(mut self, kind: LockKind) -> Self {
        self.kind = kind;
        self
    }

    /// The kind of hold.
    pub fn get_kind(&self) -> LockKind {
        self.kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_forms_round_trip_and_bad_ones_are_refused() {
        for kind in [
            LockKind::Exclusive,
            LockKind::Shared,
            LockKind::Permits(1),
            LockKind::Permits(MAX_PERMITS),
        ] {
            assert_eq!(kind.to_string().parse::<LockKind>().unwrap(), kind);
        }
        assert_eq!("Shared".parse::<LockKind>().unwrap(), LockKind::Shared);
        assert_eq!(
            "permits=00000000004".parse::<LockKind>().unwrap(),
            LockKind::Permits(4)
        );
        for bad in [
            "",
            "read",
            "permits",
            "permits=",
            "permits=0",
            "permits=000",
            "permits=1025",
            "permits=-1",
            "permits=+2",
            "permits=99999999999",
        ] {
            assert!(
                matches!(bad.parse::<LockKind>(), Err(LockError::InvalidKind(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn families_and_room() {
        use LockKind::*;
        assert!(Shared.same_family(Exclusive));
        assert!(!Permits(2).same_family(Shared));
        assert!(!Permits(2).same_family(Permits(3)));
        assert!(Shared.fits_beside(Shared, 10));
        assert!(!Exclusive.fits_beside(Shared, 1));
        assert!(!Shared.fits_beside(Exclusive, 1));
        assert!(Exclusive.fits_beside(Shared, 0));
        assert!(Permits(2).fits_beside(Permits(2), 1));
        assert!(!Permits(2).fits_beside(Permits(2), 2));
    }
}
