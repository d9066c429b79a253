//! [`SingleFlightLayer`]: the tower layer.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::SingleFlight;
use super::service::SingleFlightService;

/// Wraps services with [`SingleFlightService`]: per request, asks the
/// [`FlightRequest`](crate::FlightRequest) `F` for a flight. A request
/// without one goes through untouched. Of the requests of one flight that
/// overlap (in this process and every process on the same backend), the
/// first runs the handler (its response carries `single-flight: leader`);
/// the others wait, and get a copy of that response (status, headers, body;
/// `single-flight: shared`) without running the handler.
///
/// - **Never shared**: a response that sets a cookie, says
///   `Cache-Control: private` or `no-store`, carries a kept lock's owner
///   token (`lock-owner`), has a status other than 2xx or 3xx (a failure:
///   the next waiter runs the handler itself), has trailers, or whose body
///   is larger than the cap ([`SingleFlight::max_result_bytes`], 1 MiB by
///   default; the leader's body then streams on, unbuffered beyond the
///   cap). The waiters then run the handler themselves, one at a time.
/// - **Identity**: the flight key must name everything the response depends
///   on. When it depends on who asks, put the caller's identity in the key,
///   or one user's response goes to another.
/// - A shared response is buffered whole by the leader before it is sent.
/// - A request that waits longer than the max wait gets `429` with
///   `Retry-After`, an unreachable backend `503`, an invalid key `400`, with
///   the same JSON error bodies as [`LockLayer`](crate::LockLayer).
/// - With a [`LockLayer`](crate::LockLayer) on the same route, put this
///   layer outside it (`.layer(lock).layer(flight)`): only the leader then
///   takes the locks, and the [`Locks`](crate::Locks) extractor works in the
///   handler as usual.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, routing::get};
/// use http::Request;
/// use tower_lock::{FlightSpec, MemoryBackend, SingleFlight, SingleFlightLayer, path_params};
///
/// let flights = SingleFlight::new(MemoryBackend::new());
/// let layer = SingleFlightLayer::new(flights, |req: &Request<Body>| {
///     let id = path_params(req).get("id")?.to_owned();
///     Some(FlightSpec::new(format!("statement:{id}")).result_ttl(Duration::from_secs(2)))
/// });
/// let app: Router = Router::new()
///     .route("/accounts/{id}/statement", get(|| async { "an expensive statement" }).layer(layer));
/// # let _ = app;
/// ```
pub struct SingleFlightLayer<F> {
    pub(crate) flights: SingleFlight,
    pub(crate) hook: Arc<F>,
}

impl<F> SingleFlightLayer<F> {
    /// A layer running flights with `flights`' backend and settings, as
    /// `hook` decides per request.
    pub fn new(flights: SingleFlight, hook: F) -> Self {
        SingleFlightLayer {
            flights,
            hook: Arc::new(hook),
        }
    }

    /// The flights' backend and settings.
    pub fn get_flights(&self) -> &SingleFlight {
        &self.flights
    }
}

impl<F> Clone for SingleFlightLayer<F> {
    fn clone(&self) -> Self {
        SingleFlightLayer {
            flights: self.flights.clone(),
            hook: self.hook.clone(),
        }
    }
}

impl<F> fmt::Debug for SingleFlightLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlightLayer")
            .field("flights", &self.flights)
            .finish_non_exhaustive()
    }
}

impl<S, F> Layer<S> for SingleFlightLayer<F> {
    type Service = SingleFlightService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        SingleFlightService::from_layer(inner, self.clone())
    }
}
