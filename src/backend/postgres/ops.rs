//! The operations: their statements' parameters and replies.
//!
//! Each operation is one prepared statement (`statements.rs`) calling a
//! function from `functions.sql`: one round trip, atomic (one implicit
//! transaction), the decision taken on the server with the server's clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use tokio_postgres::Row;

use super::PostgresBackend;
use super::conn::Caller;
use super::error::bad_reply;
use super::kinds::{holds, read_kind, stored_kind};
use super::statements::Statement;
use crate::backend::{Holder, Lease, LockStatus};
use crate::error::LockError;
use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::spec::{AcquireRequest, LockKind};

/// A server timestamp (µs since the Unix epoch) as a `SystemTime`, within
/// [epoch, end of year 9999]: a garbled reply must not overflow a
/// platform's `SystemTime`, nor that time plus a TTL.
pub(super) fn server_time(us: i64) -> SystemTime {
    const YEAR_9999_END_US: u64 = 253_402_300_799_999_999;
    let us = u64::try_from(us).unwrap_or(0).min(YEAR_9999_END_US);
    UNIX_EPOCH + Duration::from_micros(us)
}

/// A non-negative number of microseconds as a duration.
pub(super) fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// Whole milliseconds, rounded up (a lock never expires earlier than asked).
pub(super) fn ceil_ms(d: Duration) -> i64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Column `i` of `row`, or a bad reply.
pub(super) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    i: usize,
    what: &str,
) -> Result<T, LockError> {
    row.try_get(i).map_err(|_| bad_reply(what))
}

/// A fence (stored as a positive `bigint`).
pub(super) fn fence(row: &Row, i: usize, what: &str) -> Result<u64, LockError> {
    u64::try_from(col::<i64>(row, i, what)?).map_err(|_| bad_reply(what))
}

/// The acquisition's fence as stored (`NULL`: whatever the owner holds).
fn stored_fence(holder: Holder<'_>) -> Result<Option<i64>, LockError> {
    holder
        .fence()
        .map(|f| i64::try_from(f).map_err(|_| LockError::OwnershipMismatch))
        .transpose()
}

/// An attempt id as stored: the same 64 bits as a `bigint`.
pub(super) fn attempt(req: &AcquireRequest) -> i64 {
    i64::from_ne_bytes(req.attempt().to_ne_bytes())
}

/// The lease in an acquire's row (code 1): fence, acquired µs, now µs in
/// columns 1 to 3.
pub(super) fn granted(row: &Row, req: &AcquireRequest, what: &str) -> Result<Lease, LockError> {
    Ok(Lease::new(
        fence(row, 1, what)?,
        server_time(col(row, 2, what)?),
        server_time(col(row, 3, what)?),
        req.ttl(),
    ))
}

/// What one acquire call found.
pub(super) enum Attempt {
    Acquired(Lease),
    Busy {
        /// The holder's remaining TTL.
        retry_after: Duration,
        /// This call created a queue entry (it was not queued before).
        queued_anew: bool,
    },
}

/// What a waiter that leaves the queue found.
pub(super) enum Left {
    /// The lock had been handed to it: it keeps it.
    Claimed(Lease),
    /// The lock had been handed to it: it went on to the next waiter.
    Dropped,
    /// Not ours: the holder's remaining TTL.
    NotHeld(Duration),
}

/// A waiter's place: its backend's channel and its ticket there.
#[derive(Clone, Copy)]
pub(super) struct Ticket<'a> {
    pub(super) channel: &'a str,
    pub(super) id: i64,
}

impl PostgresBackend {
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.op_timeout
    }

    /// One acquire call; `queue` = (remaining wait ms, ticket) of a waiter,
    /// which joins the queue when the lock is busy.
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        queue: Option<(i64, Ticket<'_>)>,
        end: Instant,
    ) -> Result<Attempt, LockError> {
        const WHAT: &str = "acquire";
        let key = self.stored_key(req.key());
        let ttl_ms = ceil_ms(req.ttl());
        let (wait_ms, channel, ticket) = match queue {
            Some((wait_ms, t)) => (wait_ms, Some(t.channel), Some(t.id)),
            None => (0, None, None),
        };
        // Exclusive: the statement with the fast path in front; another
        // kind: the function alone.
        let (kind, permits) = stored_kind(req.kind());
        let owner = req.owner();
        let attempt = attempt(req);
        let exclusive: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&key, &owner, &attempt, &ttl_ms, &wait_ms, &channel, &ticket];
        let other: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
            &key, &owner, &attempt, &ttl_ms, &wait_ms, &channel, &ticket, &kind, &permits,
        ];
        let (statement, params): (_, &[&(dyn tokio_postgres::types::ToSql + Sync)]) = if kind == 0 {
            (Statement::Acquire, &exclusive)
        } else {
            (Statement::AcquireKind, &other)
        };
        let row = self
            .shared
            .conns
            .query_one(
                statement,
                params,
                Some(Caller {
                    key: &key,
                    owner: req.owner(),
                }),
                end,
                self.op_timeout,
            )
            .await?;
        self.after_op();
        match col::<i32>(&row, 0, WHAT)? {
            1 => Ok(Attempt::Acquired(granted(&row, req, WHAT)?)),
            0 => Ok(Attempt::Busy {
                retry_after: micros(col(&row, 4, WHAT)?),
                queued_anew: col(&row, 5, WHAT)?,
            }),
            2 => Err(LockError::KindMismatch),
            _ => Err(bad_reply(WHAT)),
        }
    }

    /// Leave the queue; `claim` keeps a lock handed over meanwhile, else it
    /// goes on to the next waiter.
    pub(super) async fn leave(
        &self,
        key: &LockKey,
        owner: &str,
        ticket: Ticket<'_>,
        claim: bool,
        ttl: Duration,
        end: Instant,
    ) -> Result<Left, LockError> {
        const WHAT: &str = "leave";
        let stored = self.stored_key(key);
        let row = self
            .shared
            .conns
            .query_one(
                Statement::Leave,
                &[&stored, &owner, &ticket.channel, &ticket.id, &claim],
                Some(Caller {
                    key: &stored,
                    owner,
                }),
                end,
                self.op_timeout,
            )
            .await?;
        match col::<i32>(&row, 0, WHAT)? {
            1 => {
                let at = server_time(col(&row, 2, WHAT)?);
                Ok(Left::Claimed(Lease::new(
                    fence(&row, 1, WHAT)?,
                    at,
                    at,
                    ttl,
                )))
            }
            2 => Ok(Left::Dropped),
            0 => Ok(Left::NotHeld(micros(col(&row, 3, WHAT)?))),
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn release_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
    ) -> Result<(), LockError> {
        const WHAT: &str = "release";
        let stored = self.stored_key(key);
        let fence = stored_fence(holder)?;
        let row = self
            .shared
            .conns
            .query_one(
                Statement::Release,
                &[&stored, &holder.owner(), &fence],
                Some(Caller {
                    key: &stored,
                    owner: holder.owner(),
                }),
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        self.after_op();
        match col::<i32>(&row, 0, WHAT)? {
            1 => Ok(()),
            0 => Err(LockError::NotFound),
            -1 => Err(LockError::OwnershipMismatch),
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn extend_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ttl: Duration,
    ) -> Result<Lease, LockError> {
        const WHAT: &str = "extend";
        crate::spec::validate_ttl(ttl)?;
        let stored = self.stored_key(key);
        let held = stored_fence(holder)?;
        let row = self
            .shared
            .conns
            .query_one(
                Statement::Extend,
                &[&stored, &holder.owner(), &held, &ceil_ms(ttl)],
                Some(Caller {
                    key: &stored,
                    owner: holder.owner(),
                }),
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        match col::<i32>(&row, 0, WHAT)? {
            1 => Ok(Lease::new(
                fence(&row, 1, WHAT)?,
                server_time(col(&row, 2, WHAT)?),
                server_time(col(&row, 3, WHAT)?),
                ttl,
            )),
            0 => Err(LockError::NotFound),
            -1 => Err(LockError::OwnershipMismatch),
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn claim_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        attempt: u64,
    ) -> Result<Lease, LockError> {
        const WHAT: &str = "claim";
        let stored = self.stored_key(key);
        let Some(held) = stored_fence(holder)? else {
            return Err(LockError::OwnershipMismatch);
        };
        let attempt = i64::from_ne_bytes(attempt.to_ne_bytes());
        let row = self
            .shared
            .conns
            .query_one(
                Statement::Claim,
                &[&stored, &holder.owner(), &held, &attempt],
                Some(Caller {
                    key: &stored,
                    owner: holder.owner(),
                }),
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        match col::<i32>(&row, 0, WHAT)? {
            1 => {
                let expires_us: i64 = col(&row, 3, WHAT)?;
                let now_us: i64 = col(&row, 4, WHAT)?;
                let left = micros(expires_us.saturating_sub(now_us));
                Ok(Lease {
                    fence: fence(&row, 1, WHAT)?,
                    acquired_at: server_time(col(&row, 2, WHAT)?),
                    expires_at: server_time(expires_us),
                    ttl: left,
                })
            }
            0 => Err(LockError::NotFound),
            -1 => Err(LockError::OwnershipMismatch),
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn force_release_inner(&self, key: &LockKey) -> Result<bool, LockError> {
        const WHAT: &str = "force release";
        let stored = self.stored_key(key);
        let row = self
            .shared
            .conns
            .query_one(
                Statement::ForceRelease,
                &[&stored],
                None,
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        Ok(col::<i32>(&row, 0, WHAT)? == 1)
    }

    pub(super) async fn status_inner(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockStatus>, LockError> {
        const WHAT: &str = "status";
        let stored = self.stored_key(key);
        let row = self
            .shared
            .conns
            .query_one(
                Statement::Status,
                &[&stored],
                None,
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        let Some(owner) = col::<Option<String>>(&row, 0, WHAT)? else {
            return Ok(None);
        };
        let expires_us: i64 = col(&row, 3, WHAT)?;
        let now_us: i64 = col(&row, 4, WHAT)?;
        let waiters: i64 = col(&row, 5, WHAT)?;
        let metadata: Option<String> = col(&row, 6, WHAT)?;
        let waiters = usize::try_from(waiters).unwrap_or(0);
        let kind = read_kind(col(&row, 7, WHAT)?, col(&row, 8, WHAT)?, WHAT)?;
        if kind != LockKind::Exclusive {
            return holds(&row, now_us, WHAT)
                .map(|holds| LockStatus::of_holders(kind, holds).map(|s| s.with_waiters(waiters)));
        }
        Ok(Some(
            LockStatus::new(
                owner,
                fence(&row, 1, WHAT)?,
                server_time(col(&row, 2, WHAT)?),
                server_time(expires_us),
                micros(expires_us.saturating_sub(now_us)),
            )
            .with_waiters(waiters)
            .with_metadata(metadata.and_then(|m| LockMetadata::from_json(&m).ok())),
        ))
    }

    /// Store `metadata` with `req`'s acquisition `fence`, if it still holds.
    pub(super) async fn store_metadata(
        &self,
        req: &AcquireRequest,
        fence: u64,
        metadata: &LockMetadata,
    ) -> Result<(), LockError> {
        let stored = self.stored_key(req.key());
        let fence = i64::try_from(fence).map_err(|_| bad_reply("metadata"))?;
        self.shared
            .conns
            .query_one(
                Statement::StoreMetadata,
                &[&stored, &req.owner(), &fence, &metadata.as_json()],
                Some(Caller {
                    key: &stored,
                    owner: req.owner(),
                }),
                self.deadline(),
                self.op_timeout,
            )
            .await
            .map(drop)
    }

    /// One bounded sweep step from `from_block`: (next block, rows removed).
    pub(super) async fn sweep_step(
        &self,
        from_block: i64,
        blocks: i64,
    ) -> Result<(i64, i64), LockError> {
        const WHAT: &str = "sweep";
        let row = self
            .shared
            .conns
            .query_one(
                Statement::Sweep,
                &[&from_block, &blocks],
                None,
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        Ok((col(&row, 0, WHAT)?, col(&row, 1, WHAT)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_times_are_capped() {
        assert_eq!(
            server_time(1_700_000_000_123_456),
            UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456)
        );
        assert_eq!(server_time(-5), UNIX_EPOCH);
        let capped = server_time(i64::MAX);
        let _ = capped + Duration::from_secs(366 * 24 * 3600);
    }

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(ceil_ms(Duration::from_millis(5)), 5);
        assert_eq!(ceil_ms(Duration::from_micros(5_001)), 6);
        assert_eq!(ceil_ms(Duration::from_micros(999)), 1);
    }

    #[test]
    fn attempts_keep_all_64_bits() {
        let key = LockKey::global("k").unwrap();
        let req = AcquireRequest::new(key, "o", Duration::from_secs(1), Duration::ZERO).unwrap();
        assert_eq!(attempt(&req) as u64, req.attempt());
    }
}
