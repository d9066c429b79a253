//! The operations, one Lua script each (one round trip, atomic on the
//! server), and what their replies mean.

use std::time::{Duration, SystemTime};

use deadpool_redis::redis::Value;
use tokio::time::Instant;

use super::RedisBackend;
use super::error::bad_reply;
use super::invoke::Invocation;
use super::keys::Keys;
use super::scripts::{array, ceil_ms, int, int_at, remaining, server_time, string_at, uint_at};
use super::trail::{TRAIL_LIFE, Trail};
use crate::backend::{Hold, Holder, Lease, LockStatus};
use crate::error::LockError;
use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::spec::{AcquireRequest, LockKind, validate_ttl};
use crate::time::unix_ms;

pub(super) enum Attempt {
    Acquired(Lease),
    /// Held by a kind that cannot meet the request's (never queued).
    Mismatch,
    Busy {
        /// The holder's remaining TTL.
        retry_after: Duration,
        /// This attempt created a queue entry (it was not queued before).
        queued_anew: bool,
        /// The attempt was sent twice (its first run's reply lost): the
        /// entry the second run found may be the first run's.
        sent_twice: bool,
    },
}

#[derive(Clone, Copy)]
pub(super) enum LeaveMode {
    /// Keep a lock handed over meanwhile.
    Claim,
    /// Release a lock handed over meanwhile.
    Drop,
    /// `Drop`, sent on the current connection rather than behind a call of
    /// the waiter that may still be in flight (see `WaitGuard`).
    DropNow,
}

pub(super) enum Left {
    Claimed(Lease),
    Dropped,
    NotHeld(Duration),
}

/// Acquire's first two arguments (a flight's begin's too): the TTL and the
/// stored value's tail, "<acquired ms> <grant> <attempt> <owner>" (one
/// argument for all: each argument costs the server time), where `grant` is
/// the caller's queue ticket when it waits ("<id>@<channel>": a hold it takes
/// is then its ticket's to give back, should the call be dropped before it
/// reads the reply), else "-". Returns when it was sent: our
/// clock is only stored for `status` to show; the lease counts from it too,
/// which errs on the early side (the server's TTL starts when the script
/// runs, after this).
pub(super) fn acquire_args(
    inv: &mut Invocation<'_>,
    req: &AcquireRequest,
    ttl_ms: u64,
    ticket: Option<&str>,
) -> SystemTime {
    let sent_ms = unix_ms(SystemTime::now());
    let grant = ticket.unwrap_or("-");
    inv.arg(ttl_ms).arg(format!(
        "{sent_ms} {grant} {} {}",
        req.attempt(),
        req.owner()
    ));
    server_time(sent_ms)
}

/// The lease in acquire's `{1, fence, acquired ms, now ms}`.
pub(super) fn granted(
    reply: &[Value],
    req: &AcquireRequest,
    what: &str,
) -> Result<Lease, LockError> {
    Ok(Lease::new(
        uint_at(reply, 1, what)?,
        server_time(uint_at(reply, 2, what)?),
        server_time(uint_at(reply, 3, what)?),
        req.ttl(),
    ))
}

impl RedisBackend {
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.op_timeout
    }

    /// Run a cleanup of `owner`'s acquisition (a release without fence, a
    /// leave): behind that acquisition if it may still be in flight (see
    /// `trail.rs`).
    async fn cleanup(
        &self,
        inv: &Invocation<'_>,
        owner: &str,
        end: Instant,
    ) -> Result<Value, LockError> {
        match self.shared.trails.of(owner) {
            Some(conn) => self.shared.conn.eval_behind(inv, conn, end).await,
            None => self.shared.conn.eval(inv, end).await,
        }
    }

    /// One acquire attempt; `queue` = (remaining wait ms, waiter id) of a
    /// waiter, which joins the queue when the lock is busy and the wait is
    /// not zero.
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        ttl_ms: u64,
        queue: Option<(u64, u64)>,
        end: Instant,
    ) -> Result<Attempt, LockError> {
        const WHAT: &str = "acquire";
        let kind = kind_arg(req.kind());
        let script = match kind {
            None => &self.scripts().acquire,
            Some(_) => &self.scripts().acquire_kind,
        };
        let mut inv = script.prepare_invoke();
        let keys = match kind {
            None => Keys::All,
            Some(_) => Keys::AllAndIndex,
        };
        let slot = self.keys(&mut inv, req.key(), keys);
        // (The channel only for a waiter: a cluster's is made per slot.)
        let channel = queue.map(|_| self.shared.wake.channel(slot));
        let ticket = match (queue, &channel) {
            (Some((wait_ms, id)), Some(channel)) if wait_ms > 0 => Some(format!("{id}@{channel}")),
            _ => None,
        };
        let sent = acquire_args(&mut inv, req, ttl_ms, ticket.as_deref());
        if let (Some((wait_ms, id)), Some(channel)) = (queue, &channel) {
            inv.arg(wait_ms).arg(id).arg(channel.as_ref());
        } else if kind.is_some() {
            // No wait, no ticket: the kind comes sixth.
            inv.arg(0).arg("").arg("");
        }
        if let Some(kind) = &kind {
            inv.arg(kind.as_str());
        }
        let mut trail = Trail::new(&self.shared.trails, req.owner());
        let (reply, sent_twice) = self
            .shared
            .conn
            .eval_traced(&inv, end, &mut trail.sent)
            .await?;
        let reply = match reply {
            // The fast path: free and nobody waiting.
            Value::Int(fence) => {
                let fence = u64::try_from(fence).map_err(|_| bad_reply(WHAT))?;
                return Ok(Attempt::Acquired(Lease::new(fence, sent, sent, req.ttl())));
            }
            other => array(other, WHAT)?,
        };
        match int_at(&reply, 0, WHAT)? {
            1 => Ok(Attempt::Acquired(granted(&reply, req, WHAT)?)),
            0 => Ok(Attempt::Busy {
                retry_after: remaining(int_at(&reply, 1, WHAT)?),
                queued_anew: int_at(&reply, 2, WHAT)? == 1,
                sent_twice,
            }),
            2 => Ok(Attempt::Mismatch),
            // This waiter left the queue for good (its drop guard's leave
            // ran first): only a late attempt of a gone caller gets this.
            3 => Err(LockError::BackendUnavailable(
                "the waiter had left the queue".into(),
            )),
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn leave(
        &self,
        key: &LockKey,
        owner: &str,
        id: u64,
        mode: LeaveMode,
        ttl: Duration,
        end: Instant,
    ) -> Result<Left, LockError> {
        const WHAT: &str = "leave";
        let mut inv = self.scripts().leave.prepare_invoke();
        let slot = self.keys(&mut inv, key, Keys::AllAndIndex);
        inv.arg(owner)
            .arg(id)
            .arg(self.shared.wake.channel(slot).as_ref());
        inv.arg(match mode {
            LeaveMode::Claim => "claim",
            LeaveMode::Drop | LeaveMode::DropNow => "drop",
        });
        // How long a dropped waiter's ticket stays marked: as long as a call
        // of it may still land (its trail's life, or two op timeouts).
        inv.arg(ceil_ms(TRAIL_LIFE.max(self.op_timeout.saturating_mul(2))));
        let reply = match mode {
            LeaveMode::DropNow => self.shared.conn.eval(&inv, end).await?,
            _ => self.cleanup(&inv, owner, end).await?,
        };
        let reply = array(reply, WHAT)?;
        match int_at(&reply, 0, WHAT)? {
            1 => {
                let at = server_time(uint_at(&reply, 2, WHAT)?);
                Ok(Left::Claimed(Lease::new(
                    uint_at(&reply, 1, WHAT)?,
                    at,
                    at,
                    ttl,
                )))
            }
            2 => Ok(Left::Dropped),
            0 => Ok(Left::NotHeld(remaining(int_at(&reply, 1, WHAT)?))),
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn release_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
    ) -> Result<(), LockError> {
        let mut inv = self.scripts().release.prepare_invoke();
        self.keys(&mut inv, key, Keys::All);
        // The script finds the holder as the value's tail after a space, which
        // is exact only for owners without spaces; no holder has one (see
        // `validate_owner`), so such an owner (or an empty one) goes as " ",
        // which is never a holder's tail either: same answer, same effects.
        let owner = holder.owner();
        inv.arg(if owner.is_empty() || owner.contains(' ') {
            " "
        } else {
            owner
        });
        fence_arg(&mut inv, holder);
        let reply = match holder.fence() {
            Some(_) => self.shared.conn.eval(&inv, self.deadline()).await?,
            // Without a fence: the cleanup of an acquisition whose reply
            // never came, behind it.
            None => self.cleanup(&inv, owner, self.deadline()).await?,
        };
        match int(&reply, "release")? {
            1 => Ok(()),
            0 => Err(LockError::NotFound),
            -1 => Err(LockError::OwnershipMismatch),
            _ => Err(bad_reply("release")),
        }
    }

    pub(super) async fn extend_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ttl: Duration,
    ) -> Result<Lease, LockError> {
        validate_ttl(ttl)?;
        let inv = extend_invocation(self, key, holder, ttl);
        extended(self.shared.conn.eval(&inv, self.deadline()).await?, ttl)
    }

    pub(super) async fn claim_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        attempt: u64,
    ) -> Result<Lease, LockError> {
        const WHAT: &str = "claim";
        let Some(fence) = holder.fence() else {
            return Err(LockError::OwnershipMismatch);
        };
        let mut inv = self.scripts().claim.prepare_invoke();
        self.keys(&mut inv, key, Keys::AllAndMeta);
        inv.arg(holder.owner()).arg(fence).arg(attempt);
        let reply = array(self.shared.conn.eval(&inv, self.deadline()).await?, WHAT)?;
        match int_at(&reply, 0, WHAT)? {
            1 => {
                let left = remaining(int_at(&reply, 3, WHAT)?);
                let now = server_time(uint_at(&reply, 4, WHAT)?);
                Ok(Lease {
                    fence: uint_at(&reply, 1, WHAT)?,
                    acquired_at: server_time(uint_at(&reply, 2, WHAT)?),
                    expires_at: now + left,
                    ttl: left,
                })
            }
            0 => Err(LockError::NotFound),
            -1 => Err(LockError::OwnershipMismatch),
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn force_release_inner(&self, key: &LockKey) -> Result<bool, LockError> {
        let mut inv = self.scripts().force_release.prepare_invoke();
        self.keys(&mut inv, key, Keys::AllAndForced);
        // Names this call, so that a run repeated after a lost reply only
        // repeats the first run's answer (see force_release.lua).
        inv.arg(uuid::Uuid::new_v4().simple().to_string());
        let reply = self.shared.conn.eval(&inv, self.deadline()).await?;
        Ok(int(&reply, "force release")? > 0)
    }

    pub(super) async fn status_inner(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockStatus>, LockError> {
        const WHAT: &str = "status";
        let mut inv = self.scripts().status.prepare_invoke();
        self.keys(&mut inv, key, Keys::AllAndMeta);
        let reply = array(self.shared.conn.eval(&inv, self.deadline()).await?, WHAT)?;
        if reply.is_empty() {
            return Ok(None);
        }
        if let Some(Value::Int(0)) = reply.first() {
            return held_together(&reply).map(Some);
        }
        let left = remaining(int_at(&reply, 3, WHAT)?);
        let now: SystemTime = server_time(uint_at(&reply, 4, WHAT)?);
        let status = LockStatus::new(
            string_at(&reply, 0, WHAT)?,
            uint_at(&reply, 1, WHAT)?,
            server_time(uint_at(&reply, 2, WHAT)?),
            now + left,
            left,
        )
        .with_waiters(usize::try_from(int_at(&reply, 5, WHAT)?).unwrap_or(0));
        Ok(Some(super::extras::with_metadata(status, &reply)))
    }
}

/// A kind as the scripts spell it: `None` for exclusive, `s` shared, `p<n>`
/// for `n` permits (see common.lua).
pub(super) fn kind_arg(kind: LockKind) -> Option<String> {
    match kind {
        LockKind::Shared => Some("s".to_owned()),
        LockKind::Permits(n) => Some(format!("p{n}")),
        _ => None,
    }
}

/// The kind the scripts spell `s` or `p<n>`.
fn kind_of(spelled: &str) -> Option<LockKind> {
    match spelled.strip_prefix('p') {
        Some(n) => n.parse().ok().map(LockKind::Permits),
        None => (spelled == "s").then_some(LockKind::Shared),
    }
}

/// The status of a key held shared or under permits: status.lua's
/// `{0, kind, now ms, waiters, (owner, fence, acquired ms, remaining ms,
/// metadata)...}`.
fn held_together(reply: &[Value]) -> Result<LockStatus, LockError> {
    const WHAT: &str = "status";
    let kind = kind_of(&string_at(reply, 1, WHAT)?).ok_or_else(|| bad_reply(WHAT))?;
    let now = server_time(uint_at(reply, 2, WHAT)?);
    let waiters = usize::try_from(int_at(reply, 3, WHAT)?).unwrap_or(0);
    let mut holds = Vec::new();
    for i in (4..reply.len()).step_by(5) {
        let left = remaining(int_at(reply, i + 3, WHAT)?);
        let metadata = string_at(reply, i + 4, WHAT)?;
        let hold = Hold::new(
            string_at(reply, i, WHAT)?,
            uint_at(reply, i + 1, WHAT)?,
            server_time(uint_at(reply, i + 2, WHAT)?),
            now + left,
            left,
        )
        .with_metadata(LockMetadata::from_json(&metadata).ok());
        holds.push(hold);
    }
    LockStatus::of_holders(kind, holds)
        .map(|s| s.with_waiters(waiters))
        .ok_or_else(|| bad_reply(WHAT))
}

/// The acquisition's fence as a script argument: `''` for any (see
/// [`Holder::owner_only`]).
fn fence_arg(inv: &mut Invocation<'_>, holder: Holder<'_>) {
    match holder.fence() {
        Some(fence) => inv.arg(fence),
        None => inv.arg(""),
    };
}

/// The extend script's call for `holder`: KEYS lock and meta, ARGV owner,
/// ttl ms, fence.
pub(super) fn extend_invocation(
    backend: &RedisBackend,
    key: &LockKey,
    holder: Holder<'_>,
    ttl: Duration,
) -> Invocation<'static> {
    let mut inv = backend.scripts().extend.prepare_invoke();
    backend.keys(&mut inv, key, Keys::LockAndMeta);
    inv.arg(holder.owner()).arg(ceil_ms(ttl));
    fence_arg(&mut inv, holder);
    inv
}

/// The lease in an extend script's reply.
pub(super) fn extended(reply: Value, ttl: Duration) -> Result<Lease, LockError> {
    const WHAT: &str = "extend";
    let reply = array(reply, WHAT)?;
    match int_at(&reply, 0, WHAT)? {
        1 => Ok(Lease::new(
            uint_at(&reply, 1, WHAT)?,
            server_time(uint_at(&reply, 2, WHAT)?),
            server_time(uint_at(&reply, 3, WHAT)?),
            ttl,
        )),
        0 => Err(LockError::NotFound),
        -1 => Err(LockError::OwnershipMismatch),
        _ => Err(bad_reply(WHAT)),
    }
}
