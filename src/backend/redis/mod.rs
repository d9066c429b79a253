//! [`RedisBackend`]: locks shared by every instance of a service through one
//! Redis server (or one cluster slot per lock).
//!
//! # Guarantees
//!
//! - **One round trip per operation**: acquire, release, extend, force
//!   release and status are each one Lua script, atomic on the server, called
//!   by hash (`EVALSHA`; reloaded after `SCRIPT FLUSH` or a restart).
//! - **Expiry on the server's clock**: TTLs are `PX`/`PEXPIRE` on the
//!   server, and waiters' deadlines and hand-offs use the server's `TIME`.
//!   A lock taken on the fast path (free, nobody waiting) reports
//!   `acquired_at`/`expires_at` from the caller's clock read just before the
//!   request, so the reported expiry errs early, never late; the server's TTL
//!   starts when the script runs.
//! - **Fencing tokens** come from a per-lock counter key without TTL, so they
//!   strictly increase across release, expiry and every instance.
//! - **Fair, direct hand-off**: waiters queue in Redis (FIFO). A release hands
//!   the lock straight to the oldest live waiter and wakes only that waiter
//!   through pub/sub, which returns without another round trip. Newcomers
//!   never barge ahead of the queue, and the releasing task cannot re-take
//!   the lock while others wait.
//! - **No polling**: a waiter sleeps until it is handed the lock, or until
//!   the holder's TTL runs out (the holder may have crashed), or its own max
//!   wait ends. A jittered, capped re-check is only a last safety net.
//! - **Fails closed, never hangs**: every call is bounded by the op timeout
//!   (connecting and pool checkout included), and `acquire` by its max wait
//!   plus the op timeout. Anything that prevents an answer is
//!   [`LockError::BackendUnavailable`]. A waiter learns at once that Redis
//!   died (its pub/sub connection closes).
//!
//! # Storage layout
//!
//! With the default prefix `lock:` and `E` = [`LockKey::encoded`]:
//!
//! | key | type | content |
//! |---|---|---|
//! | `lock:{E}` | string, TTL = the lock's | `"<flag> <fence> <acquired ms> <grant> <attempt> <owner>"` |
//! | `lock:{E}:fence` | integer, no TTL | fencing counter |
//! | `lock:{E}:q` | list, TTL | tickets of the waiters, oldest first |
//! | `lock:{E}:w` | hash, TTL | ticket → `"<deadline ms> <ttl ms> <attempt> <owner>"` |
//! | `lock:{E}:forced` | string, 60 s TTL | the last force release's nonce and answer |
//!
//! `flag` is `1` once someone queued behind the holder (so only then does a
//! release look at the queue). A waiter's ticket is `<waiter id>@<channel>`,
//! unique to one acquire call; `grant` is the ticket of the waiter a lock was
//! handed to, else `-`. `attempt` is [`AcquireRequest::attempt`]: an acquire
//! is a retry of the holder's own only when owner and attempt both match.
//! The queue keys expire one second after the last waiter's deadline. All
//! keys of one lock share the hash tag `{E}` (with `\`, `{`, `}` escaped in
//! `E`), so every script touches one cluster slot. Each backend (with its
//! clones) subscribes to one channel of its own, `tower-lock:wake:<uuid>`,
//! on a dedicated connection (pooled connections cannot subscribe); it is
//! opened the first time a waiter has to wait.
//!
//! # Limits
//!
//! - Without persistence, a Redis restart forgets every lock (inherent in a
//!   single-Redis lock): a later release then reports
//!   [`LockError::NotFound`].
//! - A waiter whose process dies stays in the queue until its own deadline
//!   (its max wait); if the lock is handed to it before then, the lock stays
//!   unused until that hand-off's TTL ends.
//! - The fence counter of a key is kept forever (one small key per lock
//!   name ever used).

mod conn;
mod scripts;
mod wake;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use deadpool_redis::redis::{Client, IntoConnectionInfo, ScriptInvocation, Value};
use deadpool_redis::{Config, Pool, Runtime};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use self::conn::Pinned;
use self::scripts::{
    SCRIPTS, array, bad_reply, ceil_ms, int, int_at, remaining, server_time, string_at, uint_at,
};
use self::wake::{Grant, Wakeups};
use super::{BoxFuture, ExtendRequest, Lease, LockBackend, LockStatus, join_all};
use crate::error::LockError;
use crate::key::LockKey;
use crate::locks::unix_ms;
use crate::spec::{AcquireRequest, MAX_TTL, validate_ttl};

/// The longest stored key, in bytes: longer encodings are hashed.
const MAX_STORED_KEY: usize = 1024;
/// The longest suffix appended to a lock's key (`:forced`).
const LONGEST_SUFFIX: usize = ":forced".len();
/// The suffixes of a lock's other keys: fence counter, queue, waiters.
const ALL: &[&str] = &[":fence", ":q", ":w"];
/// First and largest interval of the safety-net re-check while waiting.
const RECHECK_FIRST: Duration = Duration::from_millis(250);
const RECHECK_MAX: Duration = Duration::from_secs(2);

/// Locks in Redis, through a [`deadpool_redis`] pool. Cheap to clone (clones
/// share connections and waiters).
///
/// See the [module documentation](self) for guarantees and the storage
/// layout.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_lock::backend::redis::RedisBackend;
/// use tower_lock::{AcquireRequest, LockBackend, LockKey};
///
/// # async fn demo() -> Result<(), tower_lock::LockError> {
/// let backend = RedisBackend::from_url("redis://:secret@127.0.0.1:6379")?
///     .with_prefix("myapp:lock:")
///     .with_op_timeout(Duration::from_secs(1));
///
/// let key = LockKey::global("nightly-report")?;
/// let req = AcquireRequest::new(key.clone(), "worker-1", Duration::from_secs(30), Duration::from_secs(5))?;
/// let lease = backend.acquire(&req).await?;
/// println!("fence {}", lease.fence);
/// backend.release(&key, "worker-1").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
    prefix: Arc<str>,
    op_timeout: Duration,
}

struct Shared {
    conn: Pinned,
    wake: Wakeups,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No connection info: it may hold a password.
        f.debug_struct("RedisBackend")
            .field("prefix", &self.prefix)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// The default key prefix, `lock:`.
    pub const DEFAULT_PREFIX: &'static str = "lock:";
    /// The default bound on one backend call, 2 s.
    pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

    /// A backend with its own pool, from a URL: `redis://[user:password@]host[:port][/db]`,
    /// `rediss://…` (TLS: needs this crate's feature `tls`; append
    /// `#insecure` to skip certificate checks, for tests only) or
    /// `unix:///path`.
    ///
    /// Nothing is connected yet: connection errors show up as
    /// [`LockError::BackendUnavailable`] from the first calls.
    ///
    /// # Errors
    ///
    /// [`LockError::BackendUnavailable`] if the URL is invalid.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::from_config(&Config::from_url(url))
    }

    /// A backend with its own pool, from a [`deadpool_redis::Config`] (URL or
    /// connection info, pool size and timeouts).
    ///
    /// # Errors
    ///
    /// [`LockError::BackendUnavailable`] if the configuration is invalid.
    pub fn from_config(config: &Config) -> Result<Self, LockError> {
        let pool = config
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| config_error(&e))?;
        let info = match (&config.url, &config.connection) {
            (Some(url), _) => url.as_str().into_connection_info(),
            (None, Some(connection)) => connection.clone().into_connection_info(),
            (None, None) => deadpool_redis::ConnectionInfo::default().into_connection_info(),
        }
        .map_err(|e| config_error(&e))?;
        Self::from_pool(pool, info)
    }

    /// A backend on the application's existing pool.
    ///
    /// Operations run on one multiplexed connection taken from `pool` (the
    /// pool opens another in its place when needed); `pool` also replaces it
    /// when it breaks. Waiting needs a pub/sub connection, which pooled
    /// connections cannot be, so `connection_info` (the pool's URL or
    /// [`ConnectionInfo`](deadpool_redis::redis::ConnectionInfo)) says where
    /// to open that one.
    ///
    /// # Errors
    ///
    /// [`LockError::BackendUnavailable`] if `connection_info` is invalid.
    pub fn from_pool(
        pool: Pool,
        connection_info: impl IntoConnectionInfo,
    ) -> Result<Self, LockError> {
        let client = Client::open(connection_info).map_err(|e| config_error(&e))?;
        Ok(RedisBackend {
            shared: Arc::new(Shared {
                conn: Pinned::new(pool),
                wake: Wakeups::new(client),
            }),
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            op_timeout: Self::DEFAULT_OP_TIMEOUT,
        })
    }

    /// Put every key under `prefix` instead of `lock:`.
    ///
    /// Keep it short, and without `{` or `}`: braces in the prefix would
    /// become the cluster hash tag and put every lock in one slot.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// Bound every backend call by `op_timeout` (default 2 s), connecting and
    /// pool checkout included; at least 1 ms, at most a year (longer is as
    /// good as forever). `acquire` with a max wait returns within max wait +
    /// `op_timeout`.
    pub fn with_op_timeout(mut self, op_timeout: Duration) -> Self {
        self.op_timeout = op_timeout.clamp(Duration::from_millis(1), MAX_TTL);
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound on one backend call.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// The pool connections come from.
    pub fn pool(&self) -> &Pool {
        self.shared.conn.pool()
    }

    /// `{prefix}{<tag>}`: the lock's own key, whose `{<tag>}` every other key
    /// of the lock shares. The tag is [`LockKey::encoded`] with `\`, `{` and
    /// `}` escaped, so a brace in the key (route patterns like
    /// `/orders/{id}` have them) cannot shorten the cluster hash tag.
    fn lock_key(&self, key: &LockKey) -> String {
        let room = MAX_STORED_KEY.saturating_sub(self.prefix.len() + 2 + LONGEST_SUFFIX);
        let mut encoded = key.encoded(room);
        if encoded.contains(['{', '}', '\\']) {
            let escaped = escape_braces(&encoded);
            // Too long once escaped: the hashed form (`h:<sha256>`) never
            // needs escaping and cannot equal an unhashed encoding.
            encoded = if escaped.len() <= room {
                escaped
            } else {
                key.encoded(0)
            };
        }
        let mut buf = String::with_capacity(self.prefix.len() + encoded.len() + 2 + LONGEST_SUFFIX);
        buf.push_str(&self.prefix);
        buf.push('{');
        buf.push_str(&encoded);
        buf.push('}');
        buf
    }

    /// Add the lock's key to `inv`, then its keys with each of `suffixes`.
    fn keys(&self, inv: &mut ScriptInvocation<'_>, key: &LockKey, suffixes: &[&str]) {
        let mut buf = self.lock_key(key);
        inv.key(buf.as_str());
        let base = buf.len();
        for suffix in suffixes {
            buf.truncate(base);
            buf.push_str(suffix);
            inv.key(buf.as_str());
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.op_timeout
    }

    /// One acquire attempt; `queue` = (remaining wait ms, waiter id) of a
    /// waiter, which joins the queue when the lock is busy and the wait is
    /// not zero.
    async fn attempt(
        &self,
        req: &AcquireRequest,
        ttl_ms: u64,
        queue: Option<(u64, u64)>,
        end: Instant,
    ) -> Result<Attempt, LockError> {
        const WHAT: &str = "acquire";
        let mut inv = SCRIPTS.acquire.prepare_invoke();
        self.keys(&mut inv, req.key(), ALL);
        // Our clock is only stored for `status` to show; the lease counts
        // from it too, which errs on the early side: the server's TTL starts
        // when the script runs, after this.
        let sent_ms = unix_ms(SystemTime::now());
        let sent = server_time(sent_ms);
        // The stored value's tail, "<acquired ms> - <attempt> <owner>": one
        // argument for all (each argument costs the server time).
        inv.arg(ttl_ms)
            .arg(format!("{sent_ms} - {} {}", req.attempt(), req.owner()));
        if let Some((wait_ms, id)) = queue {
            inv.arg(wait_ms).arg(id).arg(self.shared.wake.channel());
        }
        let reply = match self.shared.conn.eval(&inv, end).await? {
            // The fast path: free and nobody waiting.
            Value::Int(fence) => {
                let fence = u64::try_from(fence).map_err(|_| bad_reply(WHAT))?;
                return Ok(Attempt::Acquired(Lease::new(fence, sent, sent, req.ttl())));
            }
            other => array(other, WHAT)?,
        };
        match int_at(&reply, 0, WHAT)? {
            1 => Ok(Attempt::Acquired(Lease::new(
                uint_at(&reply, 1, WHAT)?,
                server_time(uint_at(&reply, 2, WHAT)?),
                server_time(uint_at(&reply, 3, WHAT)?),
                req.ttl(),
            ))),
            0 => Ok(Attempt::Busy {
                retry_after: remaining(int_at(&reply, 1, WHAT)?),
                queued_anew: int_at(&reply, 2, WHAT)? == 1,
            }),
            _ => Err(bad_reply(WHAT)),
        }
    }

    async fn acquire_inner(&self, req: &AcquireRequest) -> Result<Lease, LockError> {
        let start = Instant::now();
        let ttl_ms = ceil_ms(req.ttl());
        if req.max_wait().is_zero() {
            return match self.attempt(req, ttl_ms, None, self.deadline()).await? {
                Attempt::Acquired(lease) => Ok(lease),
                Attempt::Busy { retry_after, .. } => Err(LockError::AcquisitionFailed {
                    retry_after: Some(retry_after),
                }),
            };
        }
        // (A wait longer than a year is as good as forever and keeps the
        // arithmetic far from overflow.)
        let deadline = start + req.max_wait().min(MAX_TTL);
        let hard_end = deadline + self.op_timeout;
        let wake = &self.shared.wake;
        let mut guard = WaitGuard {
            backend: self,
            key: req.key(),
            owner: req.owner(),
            id: wake.next_id(),
            queued: false,
        };
        // Registered before the first attempt when the subscription is live,
        // so that attempt can already join the queue.
        let mut grant_rx: Option<oneshot::Receiver<Grant>> = wake.register(guard.id);
        let mut recheck = RECHECK_FIRST;
        // Queue entries this call created. After a hand-off the lock can be
        // taken back (its TTL ran out before we read the grant, a force
        // release) and a re-check queues us again; a grant read after that
        // may be the old one, so from the second entry on a grant is
        // checked against the lock before it is believed.
        let mut entries = 0u32;
        loop {
            let now = Instant::now();
            let end = (now + self.op_timeout).min(hard_end);
            let queue = grant_rx.as_ref().map(|_| {
                (
                    ceil_ms(deadline.saturating_duration_since(now)).max(1),
                    guard.id,
                )
            });
            guard.queued |= queue.is_some();
            let retry_after = match self.attempt(req, ttl_ms, queue, end).await? {
                Attempt::Acquired(lease) => {
                    // The script took us out of the queue.
                    guard.queued = false;
                    return Ok(lease);
                }
                Attempt::Busy {
                    retry_after,
                    queued_anew,
                } => {
                    entries += u32::from(queued_anew);
                    retry_after
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return self
                    .give_up(&mut guard, req, start, retry_after, hard_end)
                    .await;
            }
            let Some(rx) = grant_rx.as_mut() else {
                // Subscribe, then try again at once: a release between the
                // failed attempt and the subscription is not missed.
                let end = (now + self.op_timeout).min(hard_end);
                grant_rx = Some(wake.subscribe(guard.id, end, self.op_timeout).await?);
                continue;
            };
            // Wake when handed the lock, when the holder's TTL runs out (it
            // may have died without releasing), at our own deadline, or, as
            // a safety net only, after a capped, jittered interval.
            let holder_expires = now + retry_after + Duration::from_millis(1);
            let safety_net = now + jitter(recheck);
            recheck = (recheck * 2).min(RECHECK_MAX);
            let wake_at = holder_expires.min(safety_net).min(deadline);
            tokio::select! {
                biased;
                granted = rx => match granted {
                    Ok(grant) if entries <= 1 => {
                        // The hand-off took us out of the queue.
                        guard.queued = false;
                        let at = server_time(grant.acquired_ms);
                        return Ok(Lease::new(grant.fence, at, at, req.ttl()));
                    }
                    Ok(_) => {
                        // Maybe a stale grant: leave the queue, keeping the
                        // lock only if it is ours now. Never left behind: a
                        // later hand-off to a finished request would idle
                        // the lock for a whole TTL.
                        let end = (Instant::now() + self.op_timeout).min(hard_end);
                        let left = self
                            .leave(req.key(), req.owner(), guard.id, LeaveMode::Claim, req.ttl(), end)
                            .await?;
                        guard.queued = false;
                        match left {
                            Left::Claimed(lease) => return Ok(lease),
                            Left::NotHeld(_) => {
                                entries = 0;
                                grant_rx = wake.register(guard.id);
                            }
                            Left::Dropped => return Err(bad_reply("leave")),
                        }
                    }
                    // The subscription died: re-check now (the lock may be
                    // ours already), subscribing again if still busy.
                    Err(_) => grant_rx = None,
                },
                () = sleep_until(wake_at) => {}
            }
        }
    }

    /// The max wait is over: leave the queue, unless the lock was handed to
    /// us at the last moment, in which case it is ours.
    async fn give_up(
        &self,
        guard: &mut WaitGuard<'_>,
        req: &AcquireRequest,
        start: Instant,
        retry_after: Duration,
        hard_end: Instant,
    ) -> Result<Lease, LockError> {
        if !guard.queued {
            return Err(LockError::Timeout {
                waited: start.elapsed(),
                retry_after: Some(retry_after),
            });
        }
        let end = self.deadline().min(hard_end);
        let left = self
            .leave(
                req.key(),
                req.owner(),
                guard.id,
                LeaveMode::Claim,
                req.ttl(),
                end,
            )
            .await?;
        guard.queued = false;
        match left {
            Left::Claimed(lease) => Ok(lease),
            Left::NotHeld(holder_remaining) => Err(LockError::Timeout {
                waited: start.elapsed(),
                retry_after: Some(holder_remaining),
            }),
            Left::Dropped => Err(bad_reply("leave")),
        }
    }

    async fn leave(
        &self,
        key: &LockKey,
        owner: &str,
        id: u64,
        mode: LeaveMode,
        ttl: Duration,
        end: Instant,
    ) -> Result<Left, LockError> {
        const WHAT: &str = "leave";
        let mut inv = SCRIPTS.leave.prepare_invoke();
        self.keys(&mut inv, key, ALL);
        inv.arg(owner).arg(id).arg(self.shared.wake.channel());
        inv.arg(match mode {
            LeaveMode::Claim => "claim",
            LeaveMode::Drop => "drop",
        });
        let reply = array(self.shared.conn.eval(&inv, end).await?, WHAT)?;
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

    async fn release_inner(&self, key: &LockKey, owner: &str) -> Result<(), LockError> {
        let mut inv = SCRIPTS.release.prepare_invoke();
        self.keys(&mut inv, key, ALL);
        // The script finds the holder as the value's tail after a space, which
        // is exact only for owners without spaces; no holder has one (see
        // `validate_owner`), so such an owner (or an empty one) goes as " ",
        // which is never a holder's tail either: same answer, same effects.
        inv.arg(if owner.is_empty() || owner.contains(' ') {
            " "
        } else {
            owner
        });
        let reply = self.shared.conn.eval(&inv, self.deadline()).await?;
        match int(&reply, "release")? {
            1 => Ok(()),
            0 => Err(LockError::NotFound),
            -1 => Err(LockError::OwnershipMismatch),
            _ => Err(bad_reply("release")),
        }
    }

    async fn extend_inner(
        &self,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, LockError> {
        const WHAT: &str = "extend";
        validate_ttl(ttl)?;
        let mut inv = SCRIPTS.extend.prepare_invoke();
        self.keys(&mut inv, key, &[]);
        inv.arg(owner).arg(ceil_ms(ttl));
        let reply = array(self.shared.conn.eval(&inv, self.deadline()).await?, WHAT)?;
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

    async fn force_release_inner(&self, key: &LockKey) -> Result<bool, LockError> {
        let mut inv = SCRIPTS.force_release.prepare_invoke();
        self.keys(&mut inv, key, &[":fence", ":q", ":w", ":forced"]);
        // Names this call, so that a run repeated after a lost reply only
        // repeats the first run's answer (see force_release.lua).
        inv.arg(uuid::Uuid::new_v4().simple().to_string());
        let reply = self.shared.conn.eval(&inv, self.deadline()).await?;
        Ok(int(&reply, "force release")? > 0)
    }

    async fn status_inner(&self, key: &LockKey) -> Result<Option<LockStatus>, LockError> {
        const WHAT: &str = "status";
        let mut inv = SCRIPTS.status.prepare_invoke();
        self.keys(&mut inv, key, ALL);
        let reply = array(self.shared.conn.eval(&inv, self.deadline()).await?, WHAT)?;
        if reply.is_empty() {
            return Ok(None);
        }
        let left = remaining(int_at(&reply, 3, WHAT)?);
        let now: SystemTime = server_time(uint_at(&reply, 4, WHAT)?);
        Ok(Some(
            LockStatus::new(
                string_at(&reply, 0, WHAT)?,
                uint_at(&reply, 1, WHAT)?,
                server_time(uint_at(&reply, 2, WHAT)?),
                now + left,
                left,
            )
            .with_waiters(usize::try_from(int_at(&reply, 5, WHAT)?).unwrap_or(0)),
        ))
    }
}

enum Attempt {
    Acquired(Lease),
    Busy {
        /// The holder's remaining TTL.
        retry_after: Duration,
        /// This attempt created a queue entry (it was not queued before).
        queued_anew: bool,
    },
}

#[derive(Clone, Copy)]
enum LeaveMode {
    /// Keep a lock handed over meanwhile.
    Claim,
    /// Release a lock handed over meanwhile.
    Drop,
}

enum Left {
    Claimed(Lease),
    Dropped,
    NotHeld(Duration),
}

/// A waiter's registration and (once `queued`) its queue entry in Redis.
/// Dropped without being cleared (the acquire future was cancelled, or it
/// failed), it leaves the queue in the background, releasing the lock if it
/// was handed over meanwhile: nobody would ever release it otherwise.
struct WaitGuard<'a> {
    backend: &'a RedisBackend,
    key: &'a LockKey,
    owner: &'a str,
    id: u64,
    queued: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.backend.shared.wake.unregister(self.id);
        if !self.queued {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: the entry expires at its deadline.
            return;
        };
        let backend = self.backend.clone();
        let key = self.key.clone();
        let owner = self.owner.to_owned();
        let id = self.id;
        runtime.spawn(async move {
            let end = backend.deadline();
            let outcome = backend
                .leave(&key, &owner, id, LeaveMode::Drop, Duration::ZERO, end)
                .await;
            if let Err(e) = outcome {
                tracing::debug!(key = %key.digest(), error = %e, "leaving the lock queue failed");
            }
        });
    }
}

/// `d` scaled by a random factor in [0.5, 1).
fn jitter(d: Duration) -> Duration {
    use std::cell::Cell;
    use std::hash::{BuildHasher, RandomState};
    thread_local! {
        static STATE: Cell<u64> = Cell::new(RandomState::new().hash_one(0x5eed_u64) | 1);
    }
    let r = STATE.with(|s| {
        // xorshift64
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    let fraction = 0.5 + (r >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
    d.mul_f64(fraction)
}

/// Injective escaping of `\`, `{` and `}` (as `\\`, `\(`, `\)`).
fn escape_braces(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '{' => out.push_str("\\("),
            '}' => out.push_str("\\)"),
            c => out.push(c),
        }
    }
    out
}

fn config_error(e: &dyn fmt::Display) -> LockError {
    LockError::BackendUnavailable(format!("invalid Redis configuration: {e}"))
}

impl LockBackend for RedisBackend {
    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.acquire_inner(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(self.release_inner(key, owner))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.extend_inner(key, owner, ttl))
    }

    /// All extensions go out together on the one multiplexed connection, so
    /// a watchdog tick costs one pipelined round trip however many locks it
    /// renews.
    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        Box::pin(join_all(
            batch
                .iter()
                .map(|r| self.extend_inner(&r.key, &r.owner, r.ttl))
                .collect(),
        ))
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.force_release_inner(key))
    }

    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        Box::pin(self.status_inner(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_traits<T: Clone + Send + Sync + 'static + LockBackend>() {}

    #[test]
    fn is_clone_send_sync_backend() {
        assert_traits::<RedisBackend>();
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_millis(100));
            assert!(j >= Duration::from_millis(50) && j < Duration::from_millis(100));
        }
    }

    #[test]
    fn keys_share_one_brace_free_hash_tag_and_fit() {
        let backend = RedisBackend::from_url("redis://127.0.0.1:1").unwrap();
        let key = LockKey::route("/orders/{id}", "a}b").unwrap();
        let stored = backend.lock_key(&key);
        assert_eq!(stored, r"lock:{r12:/orders/\(id\):a\)b}");
        // The hash tag is everything between the first `{` and the next `}`.
        let tag = &stored[stored.find('{').unwrap() + 1..stored.find('}').unwrap()];
        assert_eq!(tag.len() + "lock:{}".len(), stored.len());

        let long = LockKey::route("/r/{x}", "}".repeat(512)).unwrap();
        let stored = backend.lock_key(&long);
        assert!(
            stored.starts_with("lock:{h:") && stored.len() < 100,
            "{stored}"
        );
        let longest = LockKey::global("k".repeat(512)).unwrap();
        assert!(backend.lock_key(&longest).len() + LONGEST_SUFFIX <= MAX_STORED_KEY);
    }

    /// Every call's future is boxed and moved once; connecting (large and
    /// rare) is boxed separately so it does not bloat them. A guard against
    /// regressions, with generous room for dependency changes.
    #[test]
    fn operation_futures_stay_small() {
        let backend = RedisBackend::from_url("redis://127.0.0.1:1").unwrap();
        let req = AcquireRequest::new(key_for_size(), "o", Duration::from_secs(1), Duration::ZERO)
            .unwrap();
        let acquire = std::mem::size_of_val(&backend.acquire_inner(&req));
        let release = std::mem::size_of_val(&backend.release_inner(req.key(), "o"));
        assert!(
            acquire < 3072 && release < 3072,
            "{acquire} / {release} bytes"
        );
    }

    fn key_for_size() -> LockKey {
        LockKey::global("k").unwrap()
    }

    #[test]
    fn escaping_is_injective() {
        let inputs = ["a{b", "a\\(b", "a\\{b", "a}", "a\\)", "\\", "{}"];
        let escaped: Vec<_> = inputs.iter().map(|s| escape_braces(s)).collect();
        for (i, a) in escaped.iter().enumerate() {
            assert!(!a.contains(['{', '}']));
            for b in &escaped[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
