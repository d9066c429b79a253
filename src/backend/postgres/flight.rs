//! Single-flight on PostgreSQL (see [`FlightStart`]): the flight's lock is
//! a row of the locks table under its `f:` key; its latest result is a row
//! of `<table>_flights` and the callers waiting for it are rows of
//! `<table>_flight_watchers` (see `schema.sql`). A begin and a publish are
//! one function call each (`flight.sql`); a watcher hears the result
//! through its backend's `LISTEN` channel: its `seq`, and its value when
//! that is at most 3800 bytes (in hex: a `NOTIFY` payload is limited to
//! 8000 bytes); a larger one it reads with one more statement.

use std::time::Duration;

use super::PostgresBackend;
use super::conn::Caller;
use super::error::bad_reply;
use super::ops::{attempt, ceil_ms, col, fence, granted};
use super::statements::Statement;
use crate::backend::{FlightPublish, FlightResult, FlightStart, FlightWait};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, MAX_TTL};

/// How long a flight's watcher row outlives its max wait.
const WATCHER_GRACE: Duration = Duration::from_secs(1);

fn gone() -> LockError {
    LockError::BackendUnavailable("the flight's wake-up is gone".into())
}

impl PostgresBackend {
    pub(super) async fn flight_begin_inner(
        &self,
        req: &AcquireRequest,
    ) -> Result<FlightStart, LockError> {
        const WHAT: &str = "flight begin";
        let end = self.deadline();
        let listener = &self.shared.listener;
        let ticket = listener.next_ticket();
        // Registered before the call: a result published right after it
        // reaches this caller.
        let mut watch = listener.watch_flight(ticket, end, self.op_timeout).await?;
        let key = self.stored_key(req.key());
        let keep_ms = ceil_ms(req.max_wait().min(MAX_TTL) + WATCHER_GRACE);
        let row = self
            .shared
            .conns
            .query_one(
                Statement::FlightBegin,
                &[
                    &key,
                    &req.owner(),
                    &attempt(req),
                    &ceil_ms(req.ttl()),
                    &listener.channel(),
                    &ticket,
                    &keep_ms,
                ],
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
            2 => Ok(FlightStart::Fresh(FlightResult {
                seq: fence(&row, 5, WHAT)?,
                value: col::<Vec<u8>>(&row, 6, WHAT)?.into(),
            })),
            1 => Ok(FlightStart::Leader(granted(&row, req, WHAT)?)),
            0 => {
                let seen =
                    u64::try_from(col::<i64>(&row, 5, WHAT)?).map_err(|_| bad_reply(WHAT))?;
                let backend = self.clone();
                let key = req.key().clone();
                Ok(FlightStart::Busy(FlightWait {
                    seen,
                    result: Box::pin(async move {
                        let news = watch.news().await.ok_or_else(gone)?;
                        if let Some(value) = news.value.filter(|_| news.seq > seen) {
                            return Ok(FlightResult {
                                seq: news.seq,
                                value: value.into(),
                            });
                        }
                        match backend.flight_result_inner(&key).await? {
                            Some(result) if result.seq > seen && result.seq >= news.seq => {
                                Ok(result)
                            }
                            _ => Err(gone()),
                        }
                    }),
                }))
            }
            _ => Err(bad_reply(WHAT)),
        }
    }

    pub(super) async fn flight_result_inner(
        &self,
        key: &LockKey,
    ) -> Result<Option<FlightResult>, LockError> {
        const WHAT: &str = "flight result";
        let stored = self.stored_key(key);
        let row = self
            .shared
            .conns
            .query_one(
                Statement::FlightResult,
                &[&stored],
                None,
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        let Some(seq) = col::<Option<i64>>(&row, 0, WHAT)? else {
            return Ok(None);
        };
        Ok(Some(FlightResult {
            seq: u64::try_from(seq).map_err(|_| bad_reply(WHAT))?,
            value: col::<Vec<u8>>(&row, 1, WHAT)?.into(),
        }))
    }

    pub(super) async fn flight_publish_inner(
        &self,
        key: &LockKey,
        owner: &str,
        publish: &FlightPublish,
    ) -> Result<(), LockError> {
        const WHAT: &str = "flight publish";
        let stored = self.stored_key(key);
        let fence = i64::try_from(publish.fence).map_err(|_| LockError::OwnershipMismatch)?;
        let row = self
            .shared
            .conns
            .query_one(
                Statement::FlightPublish,
                &[
                    &stored,
                    &owner,
                    &fence,
                    &&publish.value[..],
                    &ceil_ms(publish.result_ttl.min(MAX_TTL)),
                    &ceil_ms(publish.keep.max(publish.result_ttl).min(MAX_TTL)),
                ],
                Some(Caller {
                    key: &stored,
                    owner,
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
}
