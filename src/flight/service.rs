//! [`SingleFlightService`]: the middleware service, its future and body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

pub use super::body::FlightBody;
use super::body::{Sharing, release_followers};
use super::engine::{Role, join};
use super::fit::{crossing_lifetime, fits, keyed_by, varied};
use super::frame::{Shared, decode};
use super::layer::SingleFlightLayer;
use super::request::{FlightRequest, FlightSpec};
use super::response::{
    LEADER, SHARED, SINGLE_FLIGHT, Verdict, refuses_stored, shared_headers, stays_out, verdict,
};
use crate::key::LockKey;
use crate::layer::rejection::SharedRejection;

/// Middleware that runs a request's handler once per flight and gives the
/// other requests of the flight a copy of its response. See
/// [`SingleFlightLayer`].
pub struct SingleFlightService<S, F> {
    inner: S,
    layer: SingleFlightLayer<F>,
}

impl<S, F> SingleFlightService<S, F> {
    pub(crate) fn from_layer(inner: S, layer: SingleFlightLayer<F>) -> Self {
        SingleFlightService { inner, layer }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, F> Clone for SingleFlightService<S, F> {
    fn clone(&self) -> Self {
        SingleFlightService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, F> fmt::Debug for SingleFlightService<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlightService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, F, ReqB, ResB> Service<Request<ReqB>> for SingleFlightService<S, F>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    F: FlightRequest<ReqB>,
    ReqB: Send + 'static,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Send,
{
    type Response = Response<FlightBody<ResB>>;
    type Error = S::Error;
    type Future = SingleFlightFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let spec = self.layer.hook.flight_request(&req);
        let Some(spec) = spec.filter(|_| stays_out(req.headers()).is_none()) else {
            return SingleFlightFuture {
                state: State::Passthrough {
                    future: self.inner.call(req),
                },
            };
        };
        // The ready service goes with this request; a clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let flights = self.layer.flights.clone();
        let reject = self.layer.rejection.clone();
        SingleFlightFuture {
            state: State::Flight {
                future: Box::pin(fly(flights, reject, spec, inner, req)),
            },
        }
    }
}

/// One request's flight: a copy of the leader's response, or the handler's
/// own (shared if it may be).
async fn fly<S, ReqB, ResB>(
    flights: super::SingleFlight,
    reject: SharedRejection,
    spec: FlightSpec,
    mut inner: S,
    req: Request<ReqB>,
) -> Result<Response<FlightBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
{
    // The method is part of the flight: a HEAD's response (no body, and
    // the GET's `content-length`) must never answer a GET.
    let mut key = match LockKey::flight_of_method(spec.get_key(), req.method()) {
        Ok(key) => key,
        Err(e) => return Ok(rejection(&reject, &e)),
    };
    let mut result_ttl = spec.get_result_ttl();
    let mut refreshing = false;
    // (Whether it refuses a stored result, decided before it is found: such
    // a result is counted by the flight this request then joins, not as
    // `fresh`.)
    let refuses = refuses_stored(req.headers());
    let leader = loop {
        let settings = flights.settings();
        let joined = join(flights.backend(), key.clone(), settings, refuses.is_some()).await;
        let (result, stored) = match joined {
            Ok(Role::Leader(leader)) => break leader,
            Ok(Role::Shared { result, stored }) => (result, stored),
            Err(e) => return Ok(rejection(&reject, &e)),
        };
        let refused = stored.then_some(refuses).flatten();
        match refused {
            Some(why) if !refreshing => {
                // Published before this request came, and it asks for an
                // answer made for it (RFC 9111 §5.2.1): not for it. Such
                // requests meet in a flight of their own, whose answer
                // (made after each of them came) is kept for nobody: a
                // burst of them (a browser's reloads) runs the handler
                // once, and the stored answer stays for the others.
                tracing::debug!(why, "a stored single-flight response not used");
                (key, result_ttl, refreshing) = (key.refreshing(), Duration::ZERO, true);
                continue;
            }
            // (Kept for nobody, a refreshing flight's answer is never a
            // stored one; should another version store one, it is not used.)
            Some(_) => {}
            None => {
                match decode(Bytes::from_owner(SharedBytes(result.value))) {
                    Some(Shared::Response { response, varied })
                        if fits(response.headers(), &varied, req.headers()) =>
                    {
                        let (mut parts, body) = (*response).into_parts();
                        parts.headers.insert(SINGLE_FLIGHT, SHARED);
                        return Ok(Response::from_parts(parts, FlightBody::full(body)));
                    }
                    // The response varies on a header this request has another
                    // value of (`Vary`): not for it.
                    Some(Shared::Response { .. }) => {
                        tracing::debug!("a shared single-flight response varies; not used");
                    }
                    Some(Shared::Alone) => {}
                    // Not a response frame (another program, or another version,
                    // stored something else under this key).
                    None => {
                        tracing::warn!("a shared single-flight result is not a response; not used")
                    }
                }
            }
        }
        // This request runs the handler on its own, outside the flight.
        let res = inner.call(req).await?;
        return Ok(res.map(FlightBody::inner));
    };
    // What the response's `Vary` may name (and the credentials), to be
    // checked against each follower's request.
    let asked = req.headers().clone();
    let res = match inner.call(req).await {
        Ok(res) => res,
        Err(e) => {
            leader.abandon().await;
            return Err(e);
        }
    };
    let (mut parts, body) = res.into_parts();
    parts.headers.insert(SINGLE_FLIGHT, LEADER);
    match verdict(&parts) {
        Verdict::Share => {}
        Verdict::Next(why) => {
            tracing::debug!(fence = leader.fence(), why, "response not shared");
            leader.abandon().await;
            return Ok(Response::from_parts(parts, FlightBody::inner(body)));
        }
        Verdict::Alone(why) => {
            tracing::debug!(fence = leader.fence(), why, "response not shared");
            release_followers(leader).await;
            return Ok(Response::from_parts(parts, FlightBody::inner(body)));
        }
    }
    let owned = |list: Vec<(&HeaderName, &HeaderValue)>| -> Vec<(HeaderName, HeaderValue)> {
        list.into_iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect()
    };
    let names = keyed_by(&parts.headers).unwrap_or_default();
    // Shared across credentials, a response is kept only while it may be
    // reused without asking the origin: never longer than its lifetime.
    let result_ttl = match crossing_lifetime(&parts.headers) {
        Some(lifetime) if !names.contains(&http::header::AUTHORIZATION) => result_ttl.min(lifetime),
        _ => result_ttl,
    };
    let sharing = Sharing::new(
        leader,
        parts.status,
        owned(shared_headers(&parts.headers)),
        varied(&names, &asked),
        (flights.get_max_result_bytes(), flights.get_lock_ttl()),
        result_ttl,
    );
    let mut body = FlightBody::tee(body, sharing);
    std::future::poll_fn(|cx| body.read_ahead(cx)).await;
    Ok(Response::from_parts(parts, body))
}

/// The layer's rejection of `error`, as the layer's response.
fn rejection<B: Body>(
    reject: &SharedRejection,
    error: &crate::LockError,
) -> Response<FlightBody<B>> {
    tracing::info!(
        code = error.code(),
        status = error.status().as_u16(),
        "request rejected: single-flight not joined"
    );
    reject.reject(error).map(FlightBody::rejection)
}

/// Lets `Bytes` share a stored result's memory.
struct SharedBytes(Arc<[u8]>);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

pin_project! {
    /// Response future of [`SingleFlightService`].
    pub struct SingleFlightFuture<Fut, ResB, E>
    where
        ResB: Body,
    {
        #[pin]
        state: State<Fut, ResB, E>,
    }
}

type Flying<ResB, E> = Pin<Box<dyn Future<Output = Result<Response<FlightBody<ResB>>, E>> + Send>>;

pin_project! {
    #[project = StateProj]
    enum State<Fut, ResB, E>
    where
        ResB: Body,
    {
        // No flight for this request: the inner future, untouched.
        Passthrough {
            #[pin]
            future: Fut,
        },
        Flight {
            future: Flying<ResB, E>,
        },
    }
}

impl<Fut, ResB, E> Future for SingleFlightFuture<Fut, ResB, E>
where
    Fut: Future<Output = Result<Response<ResB>, E>>,
    ResB: Body,
{
    type Output = Result<Response<FlightBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Passthrough { future } => future
                .poll(cx)
                .map(|res| res.map(|res| res.map(FlightBody::inner))),
            StateProj::Flight { future } => future.as_mut().poll(cx),
        }
    }
}
