//! Single-flight on Redis (see [`FlightStart`]): the flight's lock is an
//! ordinary lock under its `f:` key, with three more keys beside it in its
//! slot: `{E}:r` (hash: `seq`, `value`; the latest result, kept for the
//! callers that were waiting), `{E}:rf` (the result's `seq` while it
//! answers new callers: its TTL is the result TTL) and `{E}:fw` (the
//! tickets, `<watcher id>@<channel>`, of the callers waiting for a result).
//!
//! A begin is one script: a fresh result, else acquire's own script
//! without queueing, and when busy the caller's ticket joins the watchers.
//! A publish is one script: check the leader's lock (owner and fence),
//! store the result unless a newer one is, send it to each channel with
//! watchers in one message (`"f <seq> <id>,<id>…\n<value>"`), then release
//! the lock as a release does (the oldest queued caller gets it and reads
//! the stored result).

use std::time::Duration;

use deadpool_redis::redis::Value;

use super::RedisBackend;
use super::error::bad_reply;
use super::keys::Keys;
use super::ops::{acquire_args, granted};
use super::scripts::{array, ceil_ms, int, int_at, uint_at};
use super::trail::Trail;
use crate::backend::{FlightPublish, FlightResult, FlightStart, FlightWait, Lease};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, MAX_TTL};

/// How long a flight's watchers set outlives the longest wait (it expires
/// then, should no result come).
const WATCHERS_GRACE: Duration = Duration::from_secs(1);

impl RedisBackend {
    pub(super) async fn flight_begin_inner(
        &self,
        req: &AcquireRequest,
    ) -> Result<FlightStart, LockError> {
        const WHAT: &str = "flight begin";
        let end = self.deadline();
        let wake = &self.shared.wake;
        let id = wake.next_id();
        let slot = self.slot(req.key());
        // Registered before the script runs: a result published right after
        // it reaches this caller.
        let mut watch = wake.watch_flight(id, slot, end, self.op_timeout).await?;
        let mut inv = self.scripts().flight_begin.prepare_invoke();
        self.keys(&mut inv, req.key(), Keys::Flight);
        let sent = acquire_args(&mut inv, req, ceil_ms(req.ttl()), None);
        inv.arg(0)
            .arg(id)
            .arg(wake.channel(slot).as_ref())
            .arg(ceil_ms(req.max_wait().min(MAX_TTL) + WATCHERS_GRACE));
        // Cleaned up with the owner token after a lost reply: behind it.
        let mut trail = Trail::new(&self.shared.trails, req.owner());
        let reply = match self
            .shared
            .conn
            .eval_traced(&inv, end, &mut trail.sent)
            .await?
            .0
        {
            // Acquire's fast path: free and nobody waiting.
            Value::Int(fence) => {
                let fence = u64::try_from(fence).map_err(|_| bad_reply(WHAT))?;
                return Ok(FlightStart::Leader(Lease::new(
                    fence,
                    sent,
                    sent,
                    req.ttl(),
                )));
            }
            other => array(other, WHAT)?,
        };
        match int_at(&reply, 0, WHAT)? {
            2 => Ok(FlightStart::Fresh(result_at(&reply, 1, WHAT)?)),
            1 => Ok(FlightStart::Leader(granted(&reply, req, WHAT)?)),
            0 => {
                let seen = uint_at(&reply, 2, WHAT)?;
                Ok(FlightStart::Busy(FlightWait {
                    seen,
                    result: Box::pin(async move {
                        match watch.news().await {
                            Some(result) if result.seq > seen => Ok(result),
                            _ => Err(LockError::BackendUnavailable(
                                "the flight's wake-up is gone".into(),
                            )),
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
        let mut inv = self.scripts().flight_result.prepare_invoke();
        self.keys(&mut inv, key, Keys::FlightResult);
        let reply = array(self.shared.conn.eval(&inv, self.deadline()).await?, WHAT)?;
        match reply.first() {
            None | Some(Value::Nil) => Ok(None),
            Some(_) => result_at(&reply, 0, WHAT).map(Some),
        }
    }

    pub(super) async fn flight_publish_inner(
        &self,
        key: &LockKey,
        owner: &str,
        publish: &FlightPublish,
    ) -> Result<(), LockError> {
        const WHAT: &str = "flight publish";
        let mut inv = self.scripts().flight_publish.prepare_invoke();
        self.keys(&mut inv, key, Keys::Flight);
        inv.arg(owner)
            .arg(publish.fence)
            .arg(&publish.value[..])
            .arg(ceil_ms(publish.result_ttl.min(MAX_TTL)))
            .arg(ceil_ms(publish.keep.max(publish.result_ttl).min(MAX_TTL)).max(1));
        match int(&self.shared.conn.eval(&inv, self.deadline()).await?, WHAT)? {
            1 => Ok(()),
            0 => Err(LockError::NotFound),
            -1 => Err(LockError::OwnershipMismatch),
            _ => Err(bad_reply(WHAT)),
        }
    }
}

/// The result at `items[i]` (its `seq`) and `items[i + 1]` (its value).
fn result_at(items: &[Value], i: usize, what: &str) -> Result<FlightResult, LockError> {
    let seq = uint_at(items, i, what)?;
    match items.get(i + 1) {
        Some(Value::BulkString(bytes)) => Ok(FlightResult {
            seq,
            value: bytes.as_slice().into(),
        }),
        _ => Err(bad_reply(what)),
    }
}
