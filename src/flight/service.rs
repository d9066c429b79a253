//! [`SingleFlightService`]: the middleware service, its future and body.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::engine::{Leader, Role, join};
use super::layer::SingleFlightLayer;
use super::request::{FlightRequest, FlightSpec};
use super::response::{LEADER, SHARED, SINGLE_FLIGHT, decode, encode, unshareable};
use crate::key::LockKey;
use crate::rejection::default_rejection;

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
        let Some(spec) = self.layer.hook.flight_request(&req) else {
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
        SingleFlightFuture {
            state: State::Flight {
                future: Box::pin(fly(flights, spec, inner, req)),
            },
        }
    }
}

/// One request's flight: a copy of the leader's response, or the handler's
/// own (shared if it may be).
async fn fly<S, ReqB, ResB>(
    flights: crate::SingleFlight,
    spec: FlightSpec,
    mut inner: S,
    req: Request<ReqB>,
) -> Result<Response<FlightBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
{
    let key = match LockKey::flight(spec.get_key()) {
        Ok(key) => key,
        Err(e) => return Ok(rejection(&e)),
    };
    let leader = match join(flights.get_backend(), key, flights.settings()).await {
        Ok(Role::Shared(result)) => match decode(Bytes::from_owner(SharedBytes(result.value))) {
            Some(res) => {
                let (mut parts, body) = res.into_parts();
                parts.headers.insert(SINGLE_FLIGHT, SHARED);
                return Ok(Response::from_parts(parts, FlightBody::full(body)));
            }
            // Not a response frame (another program stored something else
            // under this key): run the handler for this request alone.
            None => {
                tracing::warn!("a shared single-flight result is not a response; not used");
                None
            }
        },
        Ok(Role::Leader(leader)) => Some(leader),
        Err(e) => return Ok(rejection(&e)),
    };
    let res = match inner.call(req).await {
        Ok(res) => res,
        Err(e) => {
            if let Some(leader) = leader {
                leader.abandon().await;
            }
            return Err(e);
        }
    };
    let (mut parts, body) = res.into_parts();
    parts.headers.insert(SINGLE_FLIGHT, LEADER);
    let Some(leader) = leader else {
        return Ok(Response::from_parts(parts, FlightBody::inner(body)));
    };
    if let Some(why) = unshareable(&parts) {
        tracing::debug!(fence = leader.fence(), why, "response not shared");
        leader.abandon().await;
        return Ok(Response::from_parts(parts, FlightBody::inner(body)));
    }
    let body = match collect(body, flights.get_max_result_bytes()).await {
        Collected::Whole(bytes) => bytes,
        Collected::Partial(body) => {
            tracing::debug!(
                fence = leader.fence(),
                "response over the cap or not plain; not shared"
            );
            leader.abandon().await;
            return Ok(Response::from_parts(parts, body));
        }
    };
    share(leader, &parts, &body, spec).await;
    Ok(Response::from_parts(parts, FlightBody::full(body)))
}

async fn share(leader: Box<Leader>, parts: &http::response::Parts, body: &Bytes, spec: FlightSpec) {
    let frame = encode(parts, body);
    leader
        .publish(Arc::from(frame), spec.get_result_ttl())
        .await;
}

fn rejection<B: Body>(error: &crate::LockError) -> Response<FlightBody<B>> {
    let (parts, body) = default_rejection(error).into_parts();
    Response::from_parts(parts, FlightBody::full(body))
}

/// Lets `Bytes` share a stored result's memory.
struct SharedBytes(Arc<[u8]>);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

enum Collected<B: Body> {
    /// The whole body, within the cap.
    Whole(Bytes),
    /// Over the cap, with trailers, or failed: what was read, then the rest.
    Partial(FlightBody<B>),
}

/// Read `body` whole if it stays within `cap` bytes of data and has no
/// trailers; else hand back what was read followed by the rest.
async fn collect<B: Body>(body: B, cap: usize) -> Collected<B> {
    let mut body = Box::pin(body);
    let mut read: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0usize;
    loop {
        match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    len += bytes.len();
                    read.push_back(Frame::data(bytes));
                    if len > cap {
                        return Collected::Partial(FlightBody::chain(read, body, None));
                    }
                }
                Err(frame) => {
                    let trailers = frame.into_trailers().ok();
                    read.extend(trailers.map(Frame::trailers));
                    return Collected::Partial(FlightBody::chain(read, body, None));
                }
            },
            Some(Err(e)) => return Collected::Partial(FlightBody::chain(read, body, Some(e))),
        }
    }
    let mut whole = bytes::BytesMut::with_capacity(len);
    for frame in read {
        if let Ok(data) = frame.into_data() {
            whole.extend_from_slice(&data);
        }
    }
    Collected::Whole(whole.freeze())
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

pin_project! {
    /// Response body of [`SingleFlightService`]: the handler's body, or a
    /// stored copy of one, or a rejection.
    pub struct FlightBody<B>
    where
        B: Body,
    {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B>
    where
        B: Body,
    {
        Inner {
            #[pin]
            body: B,
        },
        Full {
            bytes: Option<Bytes>,
        },
        // What the leader read before it gave up sharing, then the rest.
        Chain {
            read: VecDeque<Frame<Bytes>>,
            rest: Pin<Box<B>>,
            error: Option<B::Error>,
            done: bool,
        },
    }
}

impl<B: Body> FlightBody<B> {
    fn inner(body: B) -> Self {
        FlightBody {
            kind: Kind::Inner { body },
        }
    }

    fn full(bytes: Bytes) -> Self {
        FlightBody {
            kind: Kind::Full {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }

    fn chain(read: VecDeque<Frame<Bytes>>, rest: Pin<Box<B>>, error: Option<B::Error>) -> Self {
        FlightBody {
            kind: Kind::Chain {
                read,
                rest,
                error,
                done: false,
            },
        }
    }
}

impl<B: Body> fmt::Debug for FlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightBody").finish_non_exhaustive()
    }
}

impl<B: Body> Body for FlightBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map(|frame| {
                frame.map(|r| r.map(|frame| frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))))
            }),
            KindProj::Full { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            KindProj::Chain {
                read,
                rest,
                error,
                done,
            } => {
                if let Some(frame) = read.pop_front() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(e) = error.take() {
                    *done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                if *done {
                    return Poll::Ready(None);
                }
                rest.as_mut().poll_frame(cx).map(|frame| {
                    frame.map(|r| {
                        r.map(|frame| frame.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                    })
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { bytes } => bytes.is_none(),
            Kind::Chain {
                read,
                rest,
                error,
                done,
            } => *done || (read.is_empty() && error.is_none() && rest.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Kind::Chain { .. } => SizeHint::default(),
        }
    }
}
