//! What the crate tells operators: metrics (feature `metrics`, on the
//! [`metrics`](https://docs.rs/metrics) facade) and the acquisition span.
//!
//! A [`Meter`] carries the labels of one request's locks: the backend's
//! static name and the matched route pattern. Without the feature it is a
//! zero-sized type whose methods are empty, so every recording call
//! compiles to nothing. With it, the metric keys of each (backend, route
//! pattern) are built once and shared: a request's recordings hand ready
//! keys to the recorder and allocate nothing themselves (the installed
//! recorder may; failures, which are rare, use the facade's macros).

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
        LockError::InvalidKey(_)
        | LockError::InvalidTtl(_)
        | LockError::InvalidOwner(_)
        | LockError::InvalidKind(_)
        | LockError::InvalidMetadata(_)
        | LockError::InvalidHeader(_)
        | LockError::NotAllowed(_) => "invalid",
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
    labels: Option<std::sync::Arc<imp::Keys>>,
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
    pub(crate) fn acquisition_of(
        &self,
        _kind: crate::spec::LockKind,
        _outcome: &'static str,
        _wait: Option<Duration>,
    ) {
    }
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

    use metrics::{
        Key, Label, Level, Metadata, SharedString, Unit, counter, describe_counter,
        describe_histogram,
    };

    use super::{Meter, Since};
    use crate::backend::SharedBackend;
    use crate::error::LockError;
    use crate::spec::LockKind;

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

    /// The outcomes of an acquisition, in the order of [`Keys`]' arrays.
    const OUTCOMES: [&str; 6] = [
        "acquired",
        "busy",
        "timeout",
        "unavailable",
        "invalid",
        "error",
    ];

    fn outcome_index(outcome: &str) -> usize {
        OUTCOMES.iter().position(|o| *o == outcome).unwrap_or(5)
    }

    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// The metric keys of one (backend, route pattern), built once: the
    /// frequent recordings hand the recorder a ready key, so they allocate
    /// nothing (the macros would build a label vector per call). The rare
    /// ones (failures, by error code) use the macros with these labels.
    pub(super) struct Keys {
        backend: &'static str,
        route: SharedString,
        /// Exclusive acquisitions, by outcome.
        acquisitions: [Key; 6],
        wait: [Key; 6],
        /// Shared and permit acquisitions (`[shared, permits]`), made the
        /// first time a route takes one.
        other_kinds: OnceLock<Box<[[[Key; 6]; 2]; 2]>>,
        held: Key,
        renewals: Key,
        lost: Key,
    }

    impl Keys {
        #[cfg(test)]
        pub(super) fn route(&self) -> &str {
            &self.route
        }

        fn new(backend: &'static str, route: SharedString) -> Self {
            let labels = labels(backend, &route);
            let by_outcome = |name| by_outcome(&labels, name, "exclusive");
            Keys {
                acquisitions: by_outcome(ACQUISITIONS),
                wait: by_outcome(WAIT),
                other_kinds: OnceLock::new(),
                held: Key::from_parts(HELD, labels.clone()),
                renewals: Key::from_parts(RENEWALS, labels.clone()),
                lost: Key::from_parts(LOST, labels),
                backend,
                route,
            }
        }

        /// The acquisition and wait keys of `kind`, by outcome.
        fn of_kind(&self, kind: LockKind) -> (&[Key; 6], &[Key; 6]) {
            let i = match kind {
                LockKind::Shared => 0,
                LockKind::Permits(_) => 1,
                _ => return (&self.acquisitions, &self.wait),
            };
            let other = self.other_kinds.get_or_init(|| {
                let labels = labels(self.backend, &self.route);
                let of = |kind| {
                    [
                        by_outcome(&labels, ACQUISITIONS, kind),
                        by_outcome(&labels, WAIT, kind),
                    ]
                };
                Box::new([of("shared"), of("permits")])
            });
            (&other[i][0], &other[i][1])
        }
    }

    fn labels(backend: &'static str, route: &SharedString) -> Vec<Label> {
        vec![
            Label::new("backend", backend),
            Label::new("route", route.clone()),
        ]
    }

    /// The keys of metric `name` by outcome, for acquisitions of `kind`
    /// (`exclusive`, `shared` or `permits`: the number of permits is left
    /// out, so the series stay few).
    fn by_outcome(labels: &[Label], name: &'static str, kind: &'static str) -> [Key; 6] {
        OUTCOMES.map(|o| {
            let mut labels = labels.to_vec();
            labels.push(Label::new("kind", kind));
            labels.push(Label::new("outcome", o));
            Key::from_parts(name, labels)
        })
    }

    /// The keys of `backend` and the route pattern `route`: made the first
    /// time the pair is seen, then shared (a clone is a reference count).
    fn keys(backend: &'static str, route: &str) -> Arc<Keys> {
        type Routes = HashMap<&'static str, HashMap<Box<str>, Arc<Keys>>>;
        static ROUTES: OnceLock<RwLock<Routes>> = OnceLock::new();
        let routes = ROUTES.get_or_init(RwLock::default);
        let found = |routes: &Routes, route: &str| routes.get(backend)?.get(route).cloned();
        if let Some(keys) = found(&routes.read().unwrap_or_else(|e| e.into_inner()), route) {
            return keys;
        }
        let mut routes = routes.write().unwrap_or_else(|e| e.into_inner());
        let count: usize = routes.values().map(HashMap::len).sum();
        let route = if count >= MAX_ROUTES && found(&routes, route).is_none() {
            "other"
        } else {
            route
        };
        if let Some(keys) = found(&routes, route) {
            return keys;
        }
        let label = if route.is_empty() {
            SharedString::const_str("")
        } else {
            SharedString::from(Arc::<str>::from(route))
        };
        let keys = Arc::new(Keys::new(backend, label));
        routes
            .entry(backend)
            .or_default()
            .insert(Box::from(route), keys.clone());
        keys
    }

    #[cfg(test)]
    pub(super) fn keys_for_test(backend: &'static str, route: &str) -> Arc<Keys> {
        keys(backend, route)
    }

    impl Meter {
        /// The labels of locks taken through `backend` for the route
        /// pattern `route` (empty outside a matched route).
        pub(crate) fn new(backend: &SharedBackend, route: &str) -> Self {
            Meter {
                labels: Some(keys(backend.name(), route)),
            }
        }

        /// Records nothing.
        pub(crate) fn none() -> Self {
            Meter { labels: None }
        }

        /// One acquisition ended with `outcome`; `wait` is how long the
        /// backend took to answer (`None`: it was not asked).
        pub(crate) fn acquisition(&self, outcome: &'static str, wait: Option<Duration>) {
            self.acquisition_of(LockKind::Exclusive, outcome, wait);
        }

        /// [`acquisition`](Meter::acquisition) of a lock of `kind`.
        pub(crate) fn acquisition_of(
            &self,
            kind: LockKind,
            outcome: &'static str,
            wait: Option<Duration>,
        ) {
            let Some(k) = &self.labels else { return };
            let i = outcome_index(outcome);
            let (acquisitions, waits) = k.of_kind(kind);
            metrics::with_recorder(|r| {
                r.register_counter(&acquisitions[i], &METADATA).increment(1);
                if let Some(wait) = wait {
                    r.register_histogram(&waits[i], &METADATA)
                        .record(wait.as_secs_f64());
                }
            });
        }

        /// `e` came from the backend during `op`; counted when the backend
        /// could not be reached (the other errors are answers).
        pub(crate) fn backend_error(&self, op: &'static str, e: &LockError) {
            let Some(k) = &self.labels else { return };
            if matches!(e, LockError::BackendUnavailable(_)) {
                counter!(BACKEND_ERRORS, "backend" => k.backend, "route" => k.route.clone(), "op" => op)
                    .increment(1);
            }
        }

        /// A lock taken at `since` is being released.
        pub(crate) fn held(&self, since: Since) {
            let Some(k) = &self.labels else { return };
            let held = since.at.elapsed().as_secs_f64();
            metrics::with_recorder(|r| r.register_histogram(&k.held, &METADATA).record(held));
        }

        /// A release failed with `e`.
        pub(crate) fn release_failed(&self, e: &LockError) {
            let Some(k) = &self.labels else { return };
            counter!(RELEASE_FAILURES, "backend" => k.backend, "route" => k.route.clone(), "code" => e.code())
                .increment(1);
            self.backend_error("release", e);
        }

        /// The watchdog renewed a lock.
        pub(crate) fn renewed(&self) {
            let Some(k) = &self.labels else { return };
            metrics::with_recorder(|r| r.register_counter(&k.renewals, &METADATA).increment(1));
        }

        /// A watchdog renewal failed with `e`.
        pub(crate) fn renewal_failed(&self, e: &LockError) {
            let Some(k) = &self.labels else { return };
            counter!(RENEWAL_FAILURES, "backend" => k.backend, "route" => k.route.clone(), "code" => e.code())
                .increment(1);
            self.backend_error("extend", e);
        }

        /// A lock was found lost while its holder still had it.
        pub(crate) fn lost(&self) {
            let Some(k) = &self.labels else { return };
            metrics::with_recorder(|r| r.register_counter(&k.lost, &METADATA).increment(1));
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
            "Lock acquisitions by kind (exclusive, shared, permits) and outcome: acquired, busy, timeout, unavailable, invalid, error."
        );
        describe_histogram!(
            WAIT,
            Unit::Seconds,
            "Time from asking the backend for a lock to its answer, by kind and outcome."
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

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::imp::keys_for_test as keys;
    use std::sync::Arc;

    #[test]
    fn keys_are_built_once_per_backend_and_route_and_bounded() {
        let a = keys("memory", "/orders/{id}");
        assert!(Arc::ptr_eq(&a, &keys("memory", "/orders/{id}")));
        assert!(!Arc::ptr_eq(&a, &keys("redis", "/orders/{id}")));
        // An app that puts raw paths where patterns belong stops growing
        // the series at the cap: the rest share `other`.
        for i in 0..1100 {
            keys("custom", &format!("/raw/{i}"));
        }
        let other = keys("custom", "/raw/999999");
        assert_eq!(other.route(), "other");
        assert!(Arc::ptr_eq(&other, &keys("custom", "/raw/1000000")));
        // Those seen before the cap keep theirs.
        assert_eq!(keys("custom", "/raw/0").route(), "/raw/0");
    }
}
