//! What the crate tells operators: metrics (feature `metrics`, on the
//! [`metrics`](https://docs.rs/metrics) facade) and the acquisition span.
//!
//! A [`Meter`] carries the labels of one request's locks: the backend's
//! static name and the matched route pattern. Without the feature it is a
//! zero-sized type whose methods are empty, so every recording call
//! compiles to nothing. With it, label values are a `&'static str` and an
//! interned `Arc<str>` (one per route pattern): recording allocates nothing
//! beyond what the facade and the installed recorder do.

use std::time::Duration;

use crate::error::LockError;

/// The outcome label of an acquisition: one of `acquired`, `busy`,
/// `timeout`, `unavailable`, `invalid`, or `error` for anything else.
pub(crate) fn outcome<T>(result: &Result<T, LockError>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(e) => error_outcome(e),
    }
}

/// The outcome label of a failed acquisition (see [`outcome`]).
pub(crate) fn error_outcome(e: &LockError) -> &'static str {
    match e {
        LockError::AcquisitionFailed { .. } => "busy",
        LockError::Timeout { .. } => "timeout",
        LockError::BackendUnavailable(_) => "unavailable",
        LockError::InvalidKey(_) | LockError::InvalidTtl(_) | LockError::InvalidOwner(_) => {
            "invalid"
        }
        _ => "error",
    }
}

/// The tracing span of one acquisition, with the hashed key (never the key
/// itself) and the outcome and wait once known. Disabled (and free) unless
/// DEBUG is on for this crate: building a span costs more than an in-memory
/// acquisition.
pub(crate) fn acquire_span(key: &crate::key::LockKey, max_wait: Duration) -> tracing::Span {
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug_span!(
            "tower_lock.acquire",
            key = %key.digest(),
            max_wait_ms = max_wait.as_millis() as u64,
            outcome = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
        )
    } else {
        tracing::Span::none()
    }
}

/// Record the outcome and the wait on an [`acquire_span`].
pub(crate) fn close_span(span: &tracing::Span, outcome: &'static str, wait: Duration) {
    if !span.is_disabled() {
        span.record("outcome", outcome);
        span.record("wait_ms", wait.as_secs_f64() * 1e3);
    }
}

/// The labels of a request's locks, and the recording calls. See the module
/// docs; [`Meter::none`] records nothing (the locks of single-flights, which
/// have metrics of their own).
#[derive(Clone, Default)]
pub(crate) struct Meter {
    #[cfg(feature = "metrics")]
    labels: Option<imp::Labels>,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter").finish_non_exhaustive()
    }
}

/// When a lock was taken, for the held-time histogram (nothing without the
/// feature).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Since {
    #[cfg(feature = "metrics")]
    at: tokio::time::Instant,
}

impl Since {
    #[inline]
    pub(crate) fn now() -> Self {
        Since {
            #[cfg(feature = "metrics")]
            at: tokio::time::Instant::now(),
        }
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::unused_self)]
impl Meter {
    #[inline(always)]
    pub(crate) fn new(_backend: &crate::backend::SharedBackend, _route: &str) -> Self {
        Meter {}
    }
    #[inline(always)]
    pub(crate) fn none() -> Self {
        Meter {}
    }
    #[inline(always)]
    pub(crate) fn acquisition(&self, _outcome: &'static str, _wait: Option<Duration>) {}
    #[inline(always)]
    pub(crate) fn backend_error(&self, _op: &'static str, _e: &LockError) {}
    #[inline(always)]
    pub(crate) fn held(&self, _since: Since) {}
    #[inline(always)]
    pub(crate) fn release_failed(&self, _e: &LockError) {}
    #[inline(always)]
    pub(crate) fn renewed(&self) {}
    #[inline(always)]
    pub(crate) fn renewal_failed(&self, _e: &LockError) {}
    #[inline(always)]
    pub(crate) fn lost(&self) {}
}

/// Single-flight outcomes: `leader`, `shared`, `fresh`, or an acquisition
/// error outcome.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn flight(_backend: &crate::backend::SharedBackend, _outcome: &'static str) {}

/// A single-flight leader could not publish its result.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn flight_publish_failed(_backend: &crate::backend::SharedBackend, _e: &LockError) {}

#[cfg(feature = "metrics")]
pub use imp::describe_metrics;
#[cfg(feature = "metrics")]
pub(crate) use imp::{flight, flight_publish_failed};

#[cfg(feature = "metrics")]
mod imp {
    use std::collections::HashMap;
    use std::sync::{Arc, OnceLock, RwLock};
    use std::time::Duration;

    use metrics::{SharedString, Unit, counter, describe_counter, describe_histogram, histogram};

    use super::{Meter, Since};
    use crate::backend::SharedBackend;
    use crate::error::LockError;

    pub(super) const ACQUISITIONS: &str = "tower_lock_acquisitions_total";
    pub(super) const WAIT: &str = "tower_lock_acquire_wait_seconds";
    pub(super) const HELD: &str = "tower_lock_held_seconds";
    pub(super) const RELEASE_FAILURES: &str = "tower_lock_release_failures_total";
    pub(super) const RENEWALS: &str = "tower_lock_watchdog_renewals_total";
    pub(super) const RENEWAL_FAILURES: &str = "tower_lock_watchdog_renewal_failures_total";
    pub(super) const LOST: &str = "tower_lock_locks_lost_total";
    pub(super) const BACKEND_ERRORS: &str = "tower_lock_backend_errors_total";
    pub(super) const FLIGHTS: &str = "tower_lock_flights_total";
    pub(super) const FLIGHT_PUBLISH_FAILURES: &str = "tower_lock_flight_publish_failures_total";

    /// Route patterns are few (an app's routes); past this many distinct
    /// ones the rest share the label `other`, so a misuse cannot grow the
    /// series without bound.
    const MAX_ROUTES: usize = 1024;

    #[derive(Clone)]
    pub(super) struct Labels {
        backend: &'static str,
        route: SharedString,
    }

    /// The route pattern as a label value: one `Arc<str>` per pattern, made
    /// the first time it is seen, then shared (a clone is a reference count).
    fn route_label(route: &str) -> SharedString {
        static ROUTES: OnceLock<RwLock<HashMap<Box<str>, Arc<str>>>> = OnceLock::new();
        if route.is_empty() {
            return SharedString::const_str("");
        }
        let routes = ROUTES.get_or_init(RwLock::default);
        if let Some(label) = routes.read().unwrap_or_else(|e| e.into_inner()).get(route) {
            return SharedString::from(label.clone());
        }
        let mut routes = routes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(label) = routes.get(route) {
            return SharedString::from(label.clone());
        }
        if routes.len() >= MAX_ROUTES {
            return SharedString::const_str("other");
        }
        let label: Arc<str> = Arc::from(route);
        routes.insert(Box::from(route), label.clone());
        SharedString::from(label)
    }

    impl Meter {
        /// The labels of locks taken through `backend` for the route
        /// pattern `route` (empty outside a matched route).
        pub(crate) fn new(backend: &SharedBackend, route: &str) -> Self {
            Meter {
                labels: Some(Labels {
                    backend: backend.name(),
                    route: route_label(route),
                }),
            }
        }

        /// Records nothing.
        pub(crate) fn none() -> Self {
            Meter { labels: None }
        }

        /// One acquisition ended with `outcome`; `wait` is how long the
        /// backend took to answer (`None`: it was not asked).
        pub(crate) fn acquisition(&self, outcome: &'static str, wait: Option<Duration>) {
            let Some(l) = &self.labels else { return };
            counter!(ACQUISITIONS, "backend" => l.backend, "route" => l.route.clone(), "outcome" => outcome)
                .increment(1);
            if let Some(wait) = wait {
                histogram!(WAIT, "backend" => l.backend, "route" => l.route.clone(), "outcome" => outcome)
                    .record(wait);
            }
        }

        /// `e` came from the backend during `op`; counted when the backend
        /// could not be reached (the other errors are answers).
        pub(crate) fn backend_error(&self, op: &'static str, e: &LockError) {
            let Some(l) = &self.labels else { return };
            if matches!(e, LockError::BackendUnavailable(_)) {
                counter!(BACKEND_ERRORS, "backend" => l.backend, "route" => l.route.clone(), "op" => op)
                    .increment(1);
            }
        }

        /// A lock taken at `since` is being released.
        pub(crate) fn held(&self, since: Since) {
            let Some(l) = &self.labels else { return };
            histogram!(HELD, "backend" => l.backend, "route" => l.route.clone())
                .record(since.at.elapsed());
        }

        /// A release failed with `e`.
        pub(crate) fn release_failed(&self, e: &LockError) {
            let Some(l) = &self.labels else { return };
            counter!(RELEASE_FAILURES, "backend" => l.backend, "route" => l.route.clone(), "code" => e.code())
                .increment(1);
            self.backend_error("release", e);
        }

        /// The watchdog renewed a lock.
        pub(crate) fn renewed(&self) {
            let Some(l) = &self.labels else { return };
            counter!(RENEWALS, "backend" => l.backend, "route" => l.route.clone()).increment(1);
        }

        /// A watchdog renewal failed with `e`.
        pub(crate) fn renewal_failed(&self, e: &LockError) {
            let Some(l) = &self.labels else { return };
            counter!(RENEWAL_FAILURES, "backend" => l.backend, "route" => l.route.clone(), "code" => e.code())
                .increment(1);
            self.backend_error("extend", e);
        }

        /// A lock was found lost while its holder still had it.
        pub(crate) fn lost(&self) {
            let Some(l) = &self.labels else { return };
            counter!(LOST, "backend" => l.backend, "route" => l.route.clone()).increment(1);
        }
    }

    /// A caller joined a single-flight through `backend` with `outcome`.
    pub(crate) fn flight(backend: &SharedBackend, outcome: &'static str) {
        counter!(FLIGHTS, "backend" => backend.name(), "outcome" => outcome).increment(1);
    }

    /// A single-flight leader could not publish its result.
    pub(crate) fn flight_publish_failed(backend: &SharedBackend, e: &LockError) {
        counter!(FLIGHT_PUBLISH_FAILURES, "backend" => backend.name(), "code" => e.code())
            .increment(1);
        if matches!(e, LockError::BackendUnavailable(_)) {
            counter!(BACKEND_ERRORS, "backend" => backend.name(), "route" => "", "op" => "flight")
                .increment(1);
        }
    }

    /// Describe every metric of this crate (help text and unit) to the
    /// installed recorder. Optional: recording works without it, but
    /// exporters then have no help text (Prometheus' `# HELP` lines). Call
    /// it once, after installing the recorder.
    ///
    /// ```
    /// tower_lock::describe_metrics();
    /// ```
    pub fn describe_metrics() {
        describe_counter!(
            ACQUISITIONS,
            Unit::Count,
            "Lock acquisitions by outcome: acquired, busy, timeout, unavailable, invalid, error."
        );
        describe_histogram!(
            WAIT,
            Unit::Seconds,
            "Time from asking the backend for a lock to its answer, by outcome."
        );
        describe_histogram!(
            HELD,
            Unit::Seconds,
            "Time from acquiring a lock to starting its release."
        );
        describe_counter!(
            RELEASE_FAILURES,
            Unit::Count,
            "Releases that failed (the lock is then freed by its TTL), by error code."
        );
        describe_counter!(RENEWALS, Unit::Count, "Successful watchdog renewals.");
        describe_counter!(
            RENEWAL_FAILURES,
            Unit::Count,
            "Failed watchdog renewals, by error code."
        );
        describe_counter!(
            LOST,
            Unit::Count,
            "Locks found lost while held: a renewal found them gone, their TTL passed without renewal, or they ran out before the handler could run."
        );
        describe_counter!(
            BACKEND_ERRORS,
            Unit::Count,
            "Backend calls that could not reach the backend in time, by operation."
        );
        describe_counter!(
            FLIGHTS,
            Unit::Count,
            "Single-flight joins by outcome: leader, shared, fresh, or an acquisition error outcome."
        );
        describe_counter!(
            FLIGHT_PUBLISH_FAILURES,
            Unit::Count,
            "Single-flight results a leader could not publish (the next waiter computes), by error code."
        );
    }
}
