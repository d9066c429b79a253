//! [`FlightRequest`]: the per-route hook that names a request's flight.

use std::time::Duration;

use http::Request;

/// One request's flight: its key, and how long its result answers new
/// requests.
///
/// The key names the work, and everything its response depends on: two
/// requests with one key get one response. **When responses depend on who
/// asks** (a user's statement, anything behind authentication), put the
/// caller's identity in the key, or the first caller's response goes to
/// every caller the layer cannot tell apart: a session cookie, a client
/// certificate or an address is invisible to it.
///
/// The layer adds what HTTP itself says a response depends on (see
/// [`SingleFlightLayer`](crate::flight::SingleFlightLayer)): the method is part of
/// the flight (a HEAD never shares a GET's), conditional and range requests
/// stay out of flights, a response reaches only the requests its `Vary`
/// fits, and only those with the leader's `Authorization` unless it says
/// `Cache-Control: public`. With a result TTL of zero, a response nobody waited for is
/// not stored at all; otherwise it is kept for the result TTL.
///
/// ```
/// use std::time::Duration;
/// use tower_lock::flight::FlightSpec;
///
/// let spec = FlightSpec::new("statement:42:user-7").result_ttl(Duration::from_secs(5));
/// assert_eq!(spec.get_key(), "statement:42:user-7");
/// assert_eq!(spec.get_result_ttl(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightSpec {
    key: String,
    result_ttl: Duration,
}

impl FlightSpec {
    /// A flight under `key` whose result answers only the requests already
    /// waiting (result TTL zero). The key is compared byte for byte: unlike
    /// a lock's, it is not normalised to Unicode NFC (two canonically
    /// equivalent paths may be two resources, and would share answers).
    pub fn new(key: impl Into<String>) -> Self {
        FlightSpec {
            key: key.into(),
            result_ttl: Duration::ZERO,
        }
    }

    /// How long after it was computed the result answers new requests too.
    pub fn result_ttl(mut self, result_ttl: Duration) -> Self {
        self.result_ttl = result_ttl;
        self
    }

    /// The key.
    pub fn get_key(&self) -> &str {
        &self.key
    }

    /// See [`result_ttl`](FlightSpec::result_ttl).
    pub fn get_result_ttl(&self) -> Duration {
        self.result_ttl
    }
}

/// Decides, per request, whether it joins a flight, and which.
///
/// Implemented for closures `Fn(&Request<B>) -> Option<FlightSpec>`;
/// `None` lets the request through untouched.
///
/// ```
/// use axum::body::Body;
/// use http::Request;
/// use tower_lock::path_params;
/// use tower_lock::flight::FlightSpec;
///
/// fn statement(req: &Request<Body>) -> Option<FlightSpec> {
///     let id = path_params(req).get("id")?.to_owned();
///     Some(FlightSpec::new(format!("statement:{id}")))
/// }
/// # let _ = statement;
/// ```
pub trait FlightRequest<B>: Send + Sync + 'static {
    /// The flight of `request`, if any.
    fn flight_request(&self, request: &Request<B>) -> Option<FlightSpec>;
}

impl<B, F> FlightRequest<B> for F
where
    F: Fn(&Request<B>) -> Option<FlightSpec> + Send + Sync + 'static,
{
    fn flight_request(&self, request: &Request<B>) -> Option<FlightSpec> {
        self(request)
    }
}
