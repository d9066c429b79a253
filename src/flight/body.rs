//! [`FlightBody`]: the response body of the HTTP layer, and the leader's
//! tee that shares its body once it has ended.
//!
//! The leader's body goes to its own client as it comes, never held back
//! behind the cap; a copy of it is kept up to the cap. When the body ends
//! within the cap (and within one lock TTL of the response's head), the
//! copy is published before the last frame is handed on. A body that grows
//! past the cap, or is still open a lock TTL after the head (a stream), is
//! not shared: the followers are told to run the handler on their own, at
//! once. A body with trailers or that fails is not shared either: the next
//! waiter runs the handler, as after a failed response.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::engine::Leader;
use super::frame;
use crate::layer::rejection::RejectionBody;

pin_project! {
    /// Response body of [`SingleFlightService`](crate::flight::SingleFlightService):
    /// the handler's body, or a stored copy of one, or a rejection.
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
        Rejection {
            body: RejectionBody,
        },
        // The leader's body: handed on as it comes, copied while it may
        // still be shared. Boxed with its state, so the response stays small
        // to move.
        Tee {
            tee: Pin<Box<Tee<B>>>,
        },
    }
}

/// A response the leader may still share: what its frame needs, and the
/// copy of its body so far.
pub(crate) struct Sharing {
    leader: Box<Leader>,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    varied: Vec<(HeaderName, HeaderValue)>,
    copy: BytesMut,
    cap: usize,
    result_ttl: Duration,
    // The body must end before this, or it is a stream: not shared.
    deadline: Pin<Box<Sleep>>,
}

impl Sharing {
    /// The leader's response with `status`, copied with `headers` and the
    /// leader's request field lines `varied`; its body is shared if it ends
    /// within `cap` bytes and `within` of now, for `result_ttl`.
    pub(crate) fn new(
        leader: Box<Leader>,
        status: StatusCode,
        headers: Vec<(HeaderName, HeaderValue)>,
        varied: Vec<(HeaderName, HeaderValue)>,
        limits: (usize, Duration),
        result_ttl: Duration,
    ) -> Self {
        let (cap, within) = limits;
        Sharing {
            leader,
            status,
            headers,
            varied,
            copy: BytesMut::new(),
            cap,
            result_ttl,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }

    /// Publish the copy: every follower gets the response.
    fn publish(self) -> Op {
        let frame = frame::encode(self.status, &self.headers, &self.varied, &self.copy);
        Box::pin(self.leader.publish(Arc::from(frame), self.result_ttl))
    }

    /// Not shared, nor will any follower's be: they run on their own.
    fn alone(self, why: &'static str) -> Op {
        tracing::debug!(fence = self.leader.fence(), why, "response not shared");
        release_followers(self.leader)
    }

    /// Not shared: the next waiter runs the handler.
    fn next(self, why: &'static str) -> Op {
        tracing::debug!(fence = self.leader.fence(), why, "response not shared");
        Box::pin(self.leader.abandon())
    }
}

/// Tell `leader`'s followers to run the handler on their own, at once.
pub(crate) fn release_followers(leader: Box<Leader>) -> Op {
    Box::pin(leader.publish(Arc::from(frame::alone()), Duration::ZERO))
}

/// A publish or a release, run before the frame after which it started is
/// handed on.
pub(crate) type Op = Pin<Box<dyn Future<Output = ()> + Send>>;

type Item<E> = Option<Result<Frame<Bytes>, E>>;

pin_project! {
    struct Tee<B>
    where
        B: Body,
    {
        #[pin]
        body: B,
        // Frames read ahead, not yet handed on.
        queued: VecDeque<Frame<Bytes>>,
        // Some while the response may still be shared.
        sharing: Option<Sharing>,
        op: Option<Op>,
        // The frame (or end, or error) held back until `op` is done.
        held: Option<Item<B::Error>>,
        done: bool,
    }
}

impl<B: Body> FlightBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        FlightBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(bytes: Bytes) -> Self {
        FlightBody {
            kind: Kind::Full {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }

    pub(crate) fn rejection(body: axum::body::Body) -> Self {
        FlightBody {
            kind: Kind::Rejection {
                body: RejectionBody::new(body),
            },
        }
    }

    /// The leader's `body`, shared as `sharing` says once it has ended.
    pub(crate) fn tee(body: B, sharing: Sharing) -> Self {
        FlightBody {
            kind: Kind::Tee {
                tee: Box::pin(Tee {
                    body,
                    queued: VecDeque::new(),
                    sharing: Some(sharing),
                    op: None,
                    held: None,
                    done: false,
                }),
            },
        }
    }

    /// Read the leader's body ahead while it is ready at once (up to the
    /// cap), and share it if it ends: a body complete at once (a string,
    /// JSON) is then shared before the response goes out, whether or not
    /// its client reads it (a HEAD's is not read). Ready when the response
    /// can go out: the body is shared, not shared, or still streaming.
    pub(crate) fn read_ahead(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Kind::Tee { tee } = &mut self.kind else {
            return Poll::Ready(());
        };
        let mut t = tee.as_mut().project();
        loop {
            if let Some(op) = t.op.as_mut() {
                ready!(op.as_mut().poll(cx));
                *t.op = None;
                return Poll::Ready(());
            }
            if t.sharing.is_none() || t.held.is_some() {
                return Poll::Ready(());
            }
            let Poll::Ready(item) = t.body.as_mut().poll_frame(cx) else {
                // Streaming: the head goes now, the rest as it comes.
                return Poll::Ready(());
            };
            let item = bytes_item(item);
            let end = ends(&item, &*t.body);
            *t.op = copy(t.sharing, &item, end);
            match item {
                Some(Ok(frame)) if t.op.is_none() => t.queued.push_back(frame),
                item => *t.held = Some(item),
            }
        }
    }
}

/// Whether `item`, just polled from `body`, is its last (the end, an error,
/// or a frame after which the body says it has ended).
fn ends<B: Body, E>(item: &Item<E>, body: &B) -> bool {
    match item {
        None | Some(Err(_)) => true,
        Some(Ok(_)) => body.is_end_stream(),
    }
}

fn bytes_item<D: Buf, E>(item: Option<Result<Frame<D>, E>>) -> Item<E> {
    item.map(|r| r.map(|frame| frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))))
}

/// Copy `item` (the body's last if `end`) while the response may be
/// shared; the publish or release to run before it is handed on, if its
/// sharing ends with it.
fn copy<E>(sharing: &mut Option<Sharing>, item: &Item<E>, end: bool) -> Option<Op> {
    let s = sharing.as_mut()?;
    match item {
        Some(Ok(frame)) => match frame.data_ref() {
            Some(data) if s.copy.len() + data.len() > s.cap => {
                return sharing.take().map(|s| s.alone("the body is over the cap"));
            }
            Some(data) => s.copy.extend_from_slice(data),
            None => return sharing.take().map(|s| s.next("the body has trailers")),
        },
        Some(Err(_)) => return sharing.take().map(|s| s.next("the body failed")),
        None => {}
    }
    end.then(|| sharing.take().map(Sharing::publish)).flatten()
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
            KindProj::Inner { body } => body.poll_frame(cx).map(bytes_item),
            KindProj::Full { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            KindProj::Rejection { body } => body.poll_frame(cx).map(|f| f.map(Ok)),
            KindProj::Tee { tee } => {
                let mut t = tee.as_mut().project();
                loop {
                    if let Some(frame) = t.queued.pop_front() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    if let Some(op) = t.op.as_mut() {
                        ready!(op.as_mut().poll(cx));
                        *t.op = None;
                    }
                    if let Some(item) = t.held.take() {
                        *t.done = !matches!(item, Some(Ok(_)));
                        return Poll::Ready(item);
                    }
                    if *t.done {
                        return Poll::Ready(None);
                    }
                    let late = t
                        .sharing
                        .as_mut()
                        .is_some_and(|s| s.deadline.as_mut().poll(cx).is_ready());
                    if late {
                        let why = "the body did not end within the lock TTL";
                        *t.op = t.sharing.take().map(|s| s.alone(why));
                        continue;
                    }
                    let item = bytes_item(ready!(t.body.as_mut().poll_frame(cx)));
                    let end = ends(&item, &*t.body);
                    *t.op = copy(t.sharing, &item, end);
                    if t.op.is_some() {
                        *t.held = Some(item);
                        continue;
                    }
                    *t.done = !matches!(item, Some(Ok(_)));
                    return Poll::Ready(item);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { bytes } => bytes.is_none(),
            Kind::Rejection { body } => body.is_end_stream(),
            Kind::Tee { tee } => {
                let t = &**tee;
                t.queued.is_empty()
                    && t.op.is_none()
                    && t.held.is_none()
                    && t.sharing.is_none()
                    && (t.done || t.body.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Kind::Rejection { body } => body.size_hint(),
            Kind::Tee { tee } => {
                let t = &**tee;
                // Frames read ahead plus what the body still has.
                let ahead: u64 = t
                    .queued
                    .iter()
                    .chain(t.held.iter().flatten().flatten())
                    .map(|f| f.data_ref().map_or(0, |d| d.len() as u64))
                    .sum();
                let rest = if t.done {
                    SizeHint::with_exact(0)
                } else {
                    t.body.size_hint()
                };
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + ahead);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + ahead);
                }
                hint
            }
        }
    }
}
