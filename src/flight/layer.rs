//! [`SingleFlightLayer`]: the tower layer.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use axum::response::IntoResponse;
use http::Request;
use tower_layer::Layer;

use super::SingleFlight;
use super::request::{FlightRequest, FlightSpec};
use super::service::SingleFlightService;
use crate::error::LockError;
use crate::layer::rejection::{Rejecter, SharedRejection, default_hook, hook};

/// Wraps services with [`SingleFlightService`]: per request, asks the
/// [`FlightRequest`](crate::flight::FlightRequest) `F` for a flight. A request
/// without one goes through untouched. Of the requests of one flight that
/// overlap (in this process and every process on the same backend), the
/// first runs the handler (its response carries `single-flight: leader`);
/// the others wait, and get a copy of that response (status, headers, body;
/// `single-flight: shared`) without running the handler.
///
/// Sharing a response is caching it for the length of a flight (and its
/// result TTL), so the layer keeps to what an HTTP cache must (RFC 9111):
///
/// - **Method**: it is part of the flight. A GET's flight is the key
///   itself ([`SingleFlight::status`] names it); a HEAD (whose body axum
///   strips, keeping the GET's `content-length`), and any other method,
///   has a flight of its own under the same key.
/// - **Stored responses** (a result TTL above zero): a request that says
///   `Cache-Control: no-cache` or `max-age=0` (or `Pragma: no-cache`
///   without a `Cache-Control`) is not answered with a response published
///   before it came. Such requests meet in a flight of their own beside the
///   key's ([`SingleFlight::status_refreshing`]): one runs the handler and
///   those that come while it runs share its answer, which is kept for
///   nobody (the stored response stays). Such a request still joins a
///   flight under way.
/// - **Conditional and range requests** (`If-None-Match`,
///   `If-Modified-Since`, `If-Match`, `If-Unmodified-Since`, `If-Range`,
///   `Range`) neither lead nor follow: they go to the handler untouched, as
///   a request without a flight, so a `304` or a `206` never reaches a
///   client that asked for the whole.
/// - **`Vary`**: the leader's request headers that its response's `Vary`
///   names are kept with it; a follower whose own differ (another
///   `Accept-Encoding` with a `CompressionLayer` inside, another `Origin`
///   with a CORS layer inside) runs the handler on its own instead. When
///   clients differ much in such a header, put it (normalised) in the key,
///   so each variant has a flight of its own.
/// - **Never shared**, the next waiter then running the handler itself, one
///   at a time: a response that sets a cookie, says `Cache-Control:
///   private` or `no-store`, carries a kept lock's owner token
///   (`lock-owner`), says `Vary: *`, is a `206` or a `304`, has a status
///   other than 2xx or 3xx (a failure: the next waiter tries for itself),
///   or whose body has trailers or fails.
/// - **Streams**: the leader's client gets the head and then the body as it
///   comes, never held back; the layer keeps a copy up to the cap
///   ([`SingleFlight::max_result_bytes`], 1 MiB by default) and shares it
///   when the body ends within the cap and within one lock TTL
///   ([`SingleFlight::lock_ttl`]) of the head. A body ready at once (a
///   string, JSON) is shared before the response goes out, whether or not
///   its client reads it. A body that grows past the cap, or is still open
///   one lock TTL after the head, and any `text/event-stream`, is not
///   shared: every follower waiting then runs the handler on its own, at
///   once (not one after another, and without a `429`).
/// - **Headers of a copy**: the leader's, less the hop-by-hop ones
///   (`Connection` and those it lists, `Keep-Alive`, `Transfer-Encoding`,
///   `TE`, `Trailer`, `Upgrade`, `Proxy-*`) and the leader's lock headers
///   (`lock-*`, from a [`LockLayer`](crate::LockLayer) inside that ran for
///   the leader alone).
/// - **Identity**: the flight key must name everything the response depends
///   on. When it depends on who asks, put the caller's identity in the key,
///   so that requests of one caller share and no two callers meet in a
///   flight. As a safety net (RFC 9111 §3.5), a response reaches only the
///   followers whose `Authorization` is the leader's (none where it had
///   none), unless it says it may answer anyone's request as it is
///   (`Cache-Control: s-maxage` above zero, or `public` or
///   `must-revalidate` with a `max-age` above zero, and no `no-cache`: kept
///   no longer than that lifetime, whatever the result TTL); a follower
///   with other credentials runs the handler on its own. `Authorization`, `Proxy-Authorization` and `Cookie` (when
///   a `Vary` names it) are kept with the shared result only as a SHA-256
///   digest, never as they are.
/// - A request that runs the handler outside a flight (conditional, range,
///   a `Vary` or credentials that do not fit it, or released from a stream)
///   has no `single-flight` header.
/// - A request that waits longer than the max wait gets `429` with
///   `Retry-After`, an unreachable backend `503`, an invalid key `400`, with
///   the same JSON error bodies as [`LockLayer`](crate::LockLayer), or what
///   [`rejection`](SingleFlightLayer::rejection) makes of them.
/// - With a [`LockLayer`](crate::LockLayer) on the same route, put this
///   layer outside it: only the leader then takes the locks, and the
///   [`Locks`](crate::Locks) extractor works in the handler as usual. Stack
///   the two in one `tower::ServiceBuilder`, outermost first (see the
///   second example).
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use tower_lock::path_params;
/// use tower_lock::MemoryBackend;
/// use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
///
/// let flights = SingleFlight::new(MemoryBackend::new());
/// let layer = SingleFlightLayer::from_fn(flights, |req| {
///     let id = path_params(req).get("id")?.to_owned();
///     Some(FlightSpec::new(format!("statement:{id}")).result_ttl(Duration::from_secs(2)))
/// });
/// let app: Router = Router::new()
///     .route("/accounts/{id}/statement", get(|| async { "an expensive statement" }).layer(layer));
/// # let _ = app;
/// ```
///
/// With a lock on the same route: single-flight outside, the lock inside,
/// in one `ServiceBuilder` (outermost first). The handler, run by the
/// leader alone, extracts its lock.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use tower::ServiceBuilder;
/// use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
/// use tower_lock::{HeldLock, LockLayer, LockSpec, MemoryBackend, SharedBackend};
///
/// let backend = SharedBackend::new(MemoryBackend::new());
/// let flight = SingleFlightLayer::from_fn(SingleFlight::new(backend.clone()), |_| {
///     Some(FlightSpec::new("ledger-report"))
/// });
/// let lock = LockLayer::from_fn(backend, |_| LockSpec::global("ledger", Duration::from_secs(30)));
/// async fn report(lock: HeldLock) -> String {
///     format!("built under fence {}", lock.fence())
/// }
/// let app: Router = Router::new().route(
///     "/report",
///     get(report).layer(ServiceBuilder::new().layer(flight).layer(lock)),
/// );
/// # let _ = app;
/// ```
pub struct SingleFlightLayer<F> {
    pub(crate) flights: SingleFlight,
    pub(crate) hook: Arc<F>,
    pub(crate) rejection: SharedRejection,
}

/// A closure as a [`FlightRequest`], for the request body type `B`: what
/// [`SingleFlightLayer::from_fn`] wraps the closure in.
pub struct FlightFn<F, B> {
    f: F,
    // `fn(&B)`: `Send + Sync` whatever `B` is.
    body: PhantomData<fn(&B)>,
}

impl<F, B> fmt::Debug for FlightFn<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightFn").finish_non_exhaustive()
    }
}

impl<F, B, O> FlightRequest<B> for FlightFn<F, B>
where
    F: Fn(&Request<B>) -> O + Send + Sync + 'static,
    O: Into<Option<FlightSpec>>,
    B: 'static,
{
    fn flight_request(&self, request: &Request<B>) -> Option<FlightSpec> {
        (self.f)(request).into()
    }
}

impl<F, B> SingleFlightLayer<FlightFn<F, B>> {
    /// A layer running flights with `flights`' backend and settings, as the
    /// closure `f` names them per request: `None` for none, a
    /// [`FlightSpec`] or `Some` spec. Its argument is the request
    /// (`&Request<B>`), inferred: no annotation needed.
    pub fn from_fn<O>(flights: SingleFlight, f: F) -> Self
    where
        F: Fn(&Request<B>) -> O + Send + Sync + 'static,
        O: Into<Option<FlightSpec>>,
    {
        SingleFlightLayer::new(
            flights,
            FlightFn {
                f,
                body: PhantomData,
            },
        )
    }
}

impl<F> SingleFlightLayer<F> {
    /// A layer running flights with `flights`' backend and settings, as the
    /// [`FlightRequest`] `hook` decides per request. For a closure, use
    /// [`from_fn`](SingleFlightLayer::from_fn): its argument's type is
    /// inferred.
    pub fn new(flights: SingleFlight, hook: F) -> Self {
        SingleFlightLayer {
            flights,
            hook: Arc::new(hook),
            rejection: Rejecter::new(default_hook(), None),
        }
    }

    /// Shape the response sent when a request cannot join its flight (it
    /// waited longer than the max wait, the backend is unreachable, the key
    /// is invalid): any [`IntoResponse`], as
    /// [`LockLayer::rejection`](crate::LockLayer::rejection). Default:
    /// [`default_rejection`](crate::default_rejection).
    pub fn rejection<R, T>(mut self, rejection: R) -> Self
    where
        R: Fn(&LockError) -> T + Send + Sync + 'static,
        T: IntoResponse,
    {
        self.rejection = Rejecter::new(hook(rejection), None);
        self
    }

    /// The flights' backend and settings.
    pub fn flights(&self) -> &SingleFlight {
        &self.flights
    }
}

impl<F> Clone for SingleFlightLayer<F> {
    fn clone(&self) -> Self {
        SingleFlightLayer {
            flights: self.flights.clone(),
            hook: self.hook.clone(),
            rejection: self.rejection.clone(),
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
