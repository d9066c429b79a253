//! [`ResponseFuture`]: the future of [`LockService`](crate::layer::LockService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::backend::BoxFuture;
use crate::error::LockError;
use crate::layer::body::LockBody;
use crate::layer::rejection::SharedRejection;
use crate::lock::Locks;
use crate::lock::extract::NoLockNamed;
use crate::lock::release::{Finish, ReleaseGuard};

pin_project! {
    /// Response future of [`LockService`](crate::layer::LockService).
    pub struct ResponseFuture<S, B, ResB>
    where
        S: Service<Request<B>>,
        ResB: Body,
    {
        #[pin]
        state: State<S, B, ResB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, ResB>
    where
        S: Service<Request<B>>,
        ResB: Body,
    {
        // No lock asked for: the inner future, untouched.
        Passthrough {
            #[pin]
            future: S::Future,
        },
        // Taking the locks; the handler has not been called.
        Acquiring {
            acquire: BoxFuture<'static, Result<Locks, LockError>>,
            request: Option<Request<B>>,
            inner: Option<S>,
            rejection: SharedRejection,
        },
        // Handler running with the locks; the guard releases them if this
        // future is dropped (client gone, timeout, panic unwinding).
        Calling {
            #[pin]
            future: S::Future,
            guard: Option<ReleaseGuard>,
            // HTTP/1.x: a server stops reading a body at its declared length.
            http1: bool,
            // A HEAD request: its response's body is never sent.
            head: bool,
        },
        // Response without a body left to send (or an error): release before
        // handing it on, so a client that has it can take the lock again.
        Releasing {
            release: Finish<()>,
            result: Option<Result<S::Response, S::Error>>,
            unsent: Unsent,
        },
        // Reading a body that is ready at once ahead, then releasing, so the
        // complete response leaves in one write. Also a rejection decided
        // in `call`, with nothing to read.
        ReadingAhead {
            response: Option<Response<LockBody<ResB>>>,
            unsent: Unsent,
        },
        Done,
    }
}

impl<S, B, ResB> ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>>,
    ResB: Body,
{
    pub(crate) fn passthrough(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Passthrough { future },
        }
    }

    /// The locks are held already: call the handler.
    pub(crate) fn calling(
        request: Request<B>,
        inner: &mut S,
        locks: Locks,
        rejection: &SharedRejection,
    ) -> Self {
        ResponseFuture {
            state: call_with(inner, request, locks, rejection),
        }
    }

    /// The locks could not be taken: answer with the rejection.
    pub(crate) fn rejected(rejection: &SharedRejection, error: &LockError) -> Self {
        ResponseFuture {
            state: State::ReadingAhead {
                response: Some(reject(rejection, error)),
                unsent: Unsent(None),
            },
        }
    }

    pub(crate) fn acquiring(
        acquire: BoxFuture<'static, Result<Locks, LockError>>,
        request: Request<B>,
        inner: S,
        rejection: SharedRejection,
    ) -> Self {
        ResponseFuture {
            state: State::Acquiring {
                acquire,
                request: Some(request),
                inner: Some(inner),
                rejection,
            },
        }
    }
}

impl<S, B, ResB> Future for ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Body,
{
    type Output = Result<Response<LockBody<ResB>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut state = self.as_mut().project().state;
            match state.as_mut().project() {
                StateProj::Passthrough { future } => {
                    // The handler's extractors run in this poll: they learn
                    // that the layer named no lock (`LOCK_NOT_REQUESTED`).
                    let named = NoLockNamed::enter();
                    let res = ready!(future.poll(cx));
                    drop(named);
                    state.set(State::Done);
                    return Poll::Ready(res.map(|r| r.map(LockBody::new)));
                }
                StateProj::Acquiring {
                    acquire,
                    request,
                    inner,
                    rejection,
                } => {
                    let locks = match ready!(acquire.as_mut().poll(cx)) {
                        Ok(locks) => locks,
                        Err(error) => {
                            let res = reject(rejection, &error);
                            state.set(State::Done);
                            return Poll::Ready(Ok(res));
                        }
                    };
                    let (Some(req), Some(mut svc)) = (request.take(), inner.take()) else {
                        unreachable!("ResponseFuture polled after it was taken apart");
                    };
                    let calling = call_with(&mut svc, req, locks, rejection);
                    state.set(calling);
                }
                StateProj::Calling {
                    future,
                    guard,
                    http1,
                    head,
                } => {
                    let mut result = ready!(future.poll(cx));
                    let http1 = *http1;
                    // A response an HTTP/1 server sends no body with (to a
                    // HEAD request; 1xx, 204, 304): whatever body the
                    // handler attached, hyper never reads it, and dropped
                    // unread it released from a task of its own after the
                    // client had the response. Released before it is
                    // returned. (hyper's HTTP/2 server sends such a body.)
                    let bodiless = |status: http::StatusCode| {
                        http1
                            && (*head
                                || status.is_informational()
                                || status == http::StatusCode::NO_CONTENT
                                || status == http::StatusCode::NOT_MODIFIED)
                    };
                    let mut guard = guard.take().expect("guard present until the response");
                    // Kept locks stay held after a response that leaves
                    // this future; until it does (the release of the others
                    // still under way), they go with it if it is dropped.
                    let mut unsent = Unsent(None);
                    if result.is_ok() {
                        guard = guard.answered();
                        unsent = Unsent(guard.locks().cloned());
                    }
                    if let Ok(res) = &mut result {
                        for (lock, kept) in guard.locks().map(Locks::described).unwrap_or_default()
                        {
                            crate::layer::headers::append(res.headers_mut(), &lock, kept);
                        }
                    }
                    match result {
                        Ok(res) if !res.body().is_end_stream() && !bodiless(res.status()) => {
                            // Where an HTTP/1 server stops reading: the
                            // body's length (hyper frames a body of known
                            // size by it), else the declared one; none when
                            // it is sent chunked, read to its end, trailers
                            // included (HTTP/2 reads a body to its end, too).
                            let headers = res.headers();
                            let left = res
                                .body()
                                .size_hint()
                                .exact()
                                .or_else(|| {
                                    let declared = headers.get(http::header::CONTENT_LENGTH)?;
                                    declared.to_str().ok()?.parse::<u64>().ok()
                                })
                                .filter(|_| {
                                    http1 && !headers.contains_key(http::header::TRANSFER_ENCODING)
                                });
                            let response = res.map(|b| LockBody::guarded(b, guard, left));
                            state.set(State::ReadingAhead {
                                response: Some(response),
                                unsent,
                            });
                        }
                        result => match guard.start() {
                            None => {
                                unsent.disarm();
                                state.set(State::Done);
                                return Poll::Ready(result.map(|r| r.map(LockBody::new)));
                            }
                            Some(release) => state.set(State::Releasing {
                                release,
                                result: Some(result),
                                unsent,
                            }),
                        },
                    }
                }
                StateProj::Releasing {
                    release,
                    result,
                    unsent,
                } => {
                    ready!(Pin::new(release).poll(cx));
                    let result = result.take().expect("result present until released");
                    unsent.disarm();
                    state.set(State::Done);
                    return Poll::Ready(result.map(|r| r.map(LockBody::new)));
                }
                StateProj::ReadingAhead { response, unsent } => {
                    if let Some(res) = response.as_mut() {
                        ready!(res.body_mut().read_ahead(cx));
                    }
                    let response = response.take().expect("response present until returned");
                    unsent.disarm();
                    state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// A response's locks until it leaves the layer's future: dropped before
/// then (the client gone, an outer timeout), the kept ones go too, as their
/// owner token never reached anyone.
struct Unsent(Option<Locks>);

impl Unsent {
    /// The response left: kept locks stay kept.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(locks) = self.0.take() {
            // Dropping the unfinished release detaches it.
            drop(locks.close_and_release_all());
        }
    }
}

/// Call `inner` with the request's locks in its extensions; the guard
/// releases them if the call's future is dropped.
fn call_with<S, B, ResB>(
    inner: &mut S,
    mut request: Request<B>,
    locks: Locks,
    rejection: &SharedRejection,
) -> State<S, B, ResB>
where
    S: Service<Request<B>>,
    ResB: Body,
{
    let http1 = request.version() <= http::Version::HTTP_11;
    let head = request.method() == http::Method::HEAD;
    request.extensions_mut().insert(locks.clone());
    let guard = Some(ReleaseGuard::new(locks, rejection.learning()));
    State::Calling {
        future: inner.call(request),
        guard,
        http1,
        head,
    }
}

/// The response for a request whose locks could not be taken.
fn reject<ResB: Body>(rejection: &SharedRejection, error: &LockError) -> Response<LockBody<ResB>> {
    tracing::info!(
        code = error.code(),
        status = error.status().as_u16(),
        "request rejected: lock not acquired"
    );
    rejection.reject(error).map(LockBody::rejection)
}
