//! Single-flight: concurrent identical work runs once, across every
//! instance sharing a backend, and everyone gets its result.
//!
//! Everything of single-flight is here, with its own defaults
//! ([`DEFAULT_MAX_WAIT`], [`DEFAULT_LOCK_TTL`], [`DEFAULT_MAX_RESULT_BYTES`]:
//! a flight's, not a lock's, whose max wait is zero unless its spec says).
//!
//! Two forms: [`SingleFlight::run`] for a function, and
//! [`SingleFlightLayer`] for HTTP routes. Both rest on the same steps:
//!
//! 1. A caller asks the backend, in one atomic step, for the flight's
//!    result if one is still fresh (within its result TTL), else for the
//!    flight's lock if nobody holds it (this caller is then the **leader**
//!    and computes), else it registers for a wake-up with the next result.
//! 2. A waiting caller waits for whichever comes first: the leader's result
//!    (pushed to it: a channel in memory, pub/sub in Redis, `NOTIFY` in
//!    PostgreSQL; never polled), or the flight's lock, which is a normal
//!    tower-lock lock with its FIFO queue. The lock comes to a waiter when
//!    the leader gave up without a result (its computation failed, or the
//!    result must not be shared) or died (its TTL ran out): exactly one
//!    waiter, the oldest, then computes, and the others get its result.
//! 3. The leader publishes: the result is stored, every waiter is woken with
//!    it, and the lock is released, in one atomic step.
//!
//! The leader's lock is renewed by the watchdog while it computes, so a
//! computation may take longer than the lock's TTL; a leader whose process
//! dies stops renewing, and the lock passes on within one TTL.
//!
//! Results live in the backend beside the locks, under keys of their own
//! namespace (`f:<key>`, which no lock can name), for their result TTL (new
//! callers get them), and, when callers were waiting for them, at most the
//! max wait (for those that read them once they hold the lock; the memory
//! backend drops them once the last of these has its result). A result
//! nobody waits for is kept for its result TTL alone: with a zero TTL it is
//! not stored at all, so per-user keys do not pile results up. A result larger
//! than [`max_result_bytes`](SingleFlight::max_result_bytes) (1 MiB by
//! default) is returned to its own caller and not shared: the waiters then
//! compute one at a time.
//!
//! Format: [`SingleFlight::run`] stores JSON (`serde_json`): readable when
//! an operator looks into Redis or PostgreSQL, tolerant of added fields
//! between two versions of an app sharing a backend during a rolling
//! deploy, and already in every axum app's dependency tree. The HTTP layer
//! stores responses in a small binary frame of its own (status, headers,
//! body bytes), so bodies are not re-encoded.

mod body;
mod engine;
mod fit;
mod frame;
mod layer;
mod request;
mod response;
mod service;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use self::engine::{Role, Settings, join};
use crate::backend::{LockStatus, SharedBackend};
use crate::error::LockError;
use crate::key::LockKey;

pub use layer::{FlightFn, SingleFlightLayer};
pub use request::{FlightRequest, FlightSpec};
pub use service::{FlightBody, SingleFlightFuture, SingleFlightService};

/// How long a caller waits for a flight by default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);
/// The TTL of a leader's lock by default (renewed while it computes).
pub const DEFAULT_LOCK_TTL: Duration = Duration::from_secs(10);
/// The largest result shared by default: 1 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1 << 20;

/// Concurrent identical work runs once, and every caller gets its result:
/// in this process and in every process sharing the backend.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::time::Duration;
/// use tower_lock::MemoryBackend;
/// use tower_lock::flight::SingleFlight;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let flights = SingleFlight::new(MemoryBackend::new());
/// let computed = Arc::new(AtomicUsize::new(0));
/// // Ten callers at once: one computes, the nine others get its result.
/// let mut callers = tokio::task::JoinSet::new();
/// for _ in 0..10 {
///     let (flights, computed) = (flights.clone(), computed.clone());
///     callers.spawn(async move {
///         flights
///             .run("report:2026-11", Duration::from_secs(60), || async move {
///                 computed.fetch_add(1, Ordering::Relaxed);
///                 tokio::time::sleep(Duration::from_millis(50)).await; // the expensive part
///                 Ok::<_, std::io::Error>(vec![1, 2, 3])
///             })
///             .await
///     });
/// }
/// while let Some(report) = callers.join_next().await {
///     assert_eq!(report.unwrap().unwrap(), vec![1, 2, 3]);
/// }
/// assert_eq!(computed.load(Ordering::Relaxed), 1);
/// # }
/// ```
#[derive(Clone)]
pub struct SingleFlight {
    backend: SharedBackend,
    max_wait: Duration,
    lock_ttl: Duration,
    max_result_bytes: usize,
    watchdog: bool,
}

impl fmt::Debug for SingleFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlight")
            .field("max_wait", &self.max_wait)
            .field("lock_ttl", &self.lock_ttl)
            .field("max_result_bytes", &self.max_result_bytes)
            .field("watchdog", &self.watchdog)
            .finish_non_exhaustive()
    }
}

impl SingleFlight {
    /// Flights on `backend`, with the default max wait (30 s), lock TTL
    /// (10 s, renewed while the leader computes) and result cap (1 MiB).
    pub fn new(backend: impl Into<SharedBackend>) -> Self {
        SingleFlight {
            backend: backend.into(),
            max_wait: DEFAULT_MAX_WAIT,
            lock_ttl: DEFAULT_LOCK_TTL,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            watchdog: true,
        }
    }

    /// How long a caller waits for a busy flight before it fails with
    /// [`LockError::Timeout`] (the layer answers `429`). It also bounds how
    /// long a result is kept for callers that were already waiting.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The TTL of the leader's lock: the watchdog renews it while the
    /// leader computes; a leader whose process dies is replaced within it.
    pub fn lock_ttl(mut self, ttl: Duration) -> Self {
        self.lock_ttl = ttl;
        self
    }

    /// The largest encoded result that is shared; a larger one is returned
    /// to its own caller only, and the waiters compute one at a time.
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// Whether the watchdog renews the leader's lock while it computes (on
    /// by default). Off, a computation longer than the lock's TTL loses the
    /// lock: a waiter then computes too, and the first leader's result is
    /// not stored (its caller still gets it).
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// See [`watchdog`](SingleFlight::watchdog).
    pub fn get_watchdog(&self) -> bool {
        self.watchdog
    }

    /// The flight `key`'s lock: who computes (`None` when nobody does) and
    /// how many callers wait ([`LockStatus::waiters`]; callers that were
    /// already woken with a result may still be counted for a moment). For
    /// operators and tests.
    pub async fn status(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        let key = LockKey::flight(key)?;
        self.backend.status(&key).await
    }

    /// The same for the flight beside the GET flight `key` that the HTTP
    /// layer's requests refusing its stored result meet in
    /// (`Cache-Control: no-cache` or `max-age=0`, see
    /// [`SingleFlightLayer`]): one runs
    /// the handler, those that come while it runs share its answer. For
    /// operators and tests.
    pub async fn status_refreshing(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        let key = LockKey::flight(key)?.refreshing();
        self.backend.status(&key).await
    }

    /// See [`max_wait`](SingleFlight::max_wait).
    pub fn get_max_wait(&self) -> Duration {
        self.max_wait
    }

    /// See [`lock_ttl`](SingleFlight::lock_ttl).
    pub fn get_lock_ttl(&self) -> Duration {
        self.lock_ttl
    }

    /// See [`max_result_bytes`](SingleFlight::max_result_bytes).
    pub fn get_max_result_bytes(&self) -> usize {
        self.max_result_bytes
    }

    /// The backend the flights run on.
    pub fn backend(&self) -> &SharedBackend {
        &self.backend
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings {
            max_wait: self.max_wait,
            lock_ttl: self.lock_ttl,
            watchdog: self.watchdog,
        }
    }

    /// Run `compute` for `key` unless another caller (here or in another
    /// process on the same backend) is running it: then wait for its
    /// result. A result stays available to new callers for `result_ttl`
    /// after it was computed; with zero, only the callers already waiting
    /// get it.
    ///
    /// A failed computation (`Err`) is not shared: its caller gets
    /// [`FlightError::Failed`], and the oldest waiting caller computes in
    /// its place. Waiting longer than the max wait is
    /// [`FlightError::Lock`]`(`[`LockError::Timeout`]`)`.
    pub async fn run<T, E, F, Fut>(
        &self,
        key: &str,
        result_ttl: Duration,
        compute: F,
    ) -> Result<T, FlightError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let key = LockKey::flight(key).map_err(FlightError::Lock)?;
        let leader = match join(&self.backend, key, self.settings(), false)
            .await
            .map_err(FlightError::Lock)?
        {
            Role::Shared { result, .. } => {
                return serde_json::from_slice(&result.value).map_err(FlightError::Decode);
            }
            Role::Leader(leader) => leader,
        };
        match compute().await {
            Ok(value) => {
                match serde_json::to_vec(&value) {
                    Ok(bytes) if bytes.len() <= self.max_result_bytes => {
                        leader.publish(Arc::from(bytes), result_ttl).await;
                    }
                    Ok(bytes) => {
                        tracing::debug!(
                            bytes = bytes.len(),
                            "a single-flight result over the cap is not shared"
                        );
                        leader.abandon().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "a single-flight result does not encode as JSON; not shared");
                        leader.abandon().await;
                    }
                }
                Ok(value)
            }
            Err(e) => {
                leader.abandon().await;
                Err(FlightError::Failed(e))
            }
        }
    }
}

/// Why [`SingleFlight::run`] returned no value.
///
/// Its `Display` says which step failed; the error of that step is its
/// [`source`](std::error::Error::source). As an axum response
/// ([`IntoResponse`](axum::response::IntoResponse), when `E` is one): the
/// computation's own error as it answers, a lock error as the layers
/// answer it, a result that does not decode `500` with
/// `FLIGHT_RESULT_UNDECODABLE`.
#[derive(Debug)]
#[non_exhaustive]
pub enum FlightError<E> {
    /// This caller computed, and the computation failed: nothing was
    /// shared, and a waiting caller computes in its place.
    Failed(E),
    /// The flight could not be joined: waited longer than the max wait
    /// ([`LockError::Timeout`]), the backend is unreachable
    /// ([`LockError::BackendUnavailable`]), or the key is invalid.
    Lock(LockError),
    /// The shared result does not decode as the type asked for (another
    /// caller stores another type under the same key).
    Decode(serde_json::Error),
}

impl<E> fmt::Display for FlightError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlightError::Failed(_) => f.write_str("single-flight: the computation failed"),
            FlightError::Lock(_) => f.write_str("single-flight: the flight could not be joined"),
            FlightError::Decode(_) => {
                f.write_str("single-flight: the shared result does not decode")
            }
        }
    }
}

impl<E: axum::response::IntoResponse> axum::response::IntoResponse for FlightError<E> {
    fn into_response(self) -> axum::response::Response {
        match self {
            FlightError::Failed(e) => e.into_response(),
            FlightError::Lock(e) => e.into_response(),
            FlightError::Decode(_) => crate::layer::rejection::json_error(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "FLIGHT_RESULT_UNDECODABLE",
                "the shared result does not decode as the type asked for",
            )
            .map(axum::body::Body::from),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for FlightError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FlightError::Failed(e) => Some(e),
            FlightError::Lock(e) => Some(e),
            FlightError::Decode(e) => Some(e),
        }
    }
}
