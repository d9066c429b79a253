//! [`LockBody`]: the response body that releases the request's locks when
//! its last frame goes out, or when it is dropped.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::layer::rejection::RejectionBody;
use crate::lock::release::{Finish, ReleaseGuard};

/// Bodies ready at once up to this size are read ahead, so the locks are
/// released before the response goes out and it leaves in one write.
const READ_AHEAD_LIMIT: u64 = 64 * 1024;

pin_project! {
    /// Response body of [`LockService`](crate::layer::LockService).
    ///
    /// Passes the handler's body through. The request's locks are released
    /// before its final frame is handed on (so a client that has read the
    /// whole response can take the lock again at once), or when the body is
    /// dropped unfinished. A body that is complete at once (a string, JSON;
    /// up to 64 KiB) is read ahead and the locks released before the
    /// response is returned, so it leaves in one write; a streamed body keeps
    /// the locks until its last frame. A rejection carries the JSON error.
    pub struct LockBody<B>
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
        // No locks to release: the body as it is.
        Plain {
            #[pin]
            body: B,
        },
        // Boxed, so the service future can read it ahead before handing the
        // response on, whatever `B` is; the rest of the state goes in the
        // same box, which keeps the response small to move.
        Guarded {
            inner: Pin<Box<Guarded<B>>>,
        },
        Rejection {
            body: RejectionBody,
        },
    }
}

pin_project! {
    struct Guarded<B>
    where
        B: Body,
    {
        #[pin]
        body: B,
        guard: Option<ReleaseGuard>,
        releasing: Option<Finish<()>>,
        // Frames read ahead, not yet handed on.
        queued: VecDeque<Frame<B::Data>>,
        // Data bytes in `queued` and `last`.
        buffered: u64,
        // The final frame (or end, or error), held back until the release
        // is done.
        last: Option<Option<Result<Frame<B::Data>, B::Error>>>,
        done: bool,
        // Data bytes the response still declares (its `Content-Length`, or
        // an exact size): a server stops reading a body at that length and
        // drops it unpolled, so the frame that reaches it is the last.
        left: Option<u64>,
    }
}

impl<B: Body> LockBody<B> {
    pub(crate) fn new(body: B) -> Self {
        LockBody {
            kind: Kind::Plain { body },
        }
    }

    /// `body` releasing `guard`'s locks with its last frame; `left`: the
    /// data bytes after which the server reads no further, if it stops at a
    /// declared length (see `Guarded::left`).
    pub(crate) fn guarded(body: B, guard: ReleaseGuard, left: Option<u64>) -> Self {
        LockBody {
            kind: Kind::Guarded {
                inner: Box::pin(Guarded {
                    body,
                    guard: Some(guard),
                    releasing: None,
                    queued: VecDeque::new(),
                    buffered: 0,
                    last: None,
                    done: false,
                    left,
                }),
            },
        }
    }

    pub(crate) fn rejection(body: axum::body::Body) -> Self {
        LockBody {
            kind: Kind::Rejection {
                body: RejectionBody::new(body),
            },
        }
    }

    /// Read the body ahead while it is ready at once (up to
    /// [`READ_AHEAD_LIMIT`]); if it ends, release the locks. Ready when the
    /// response can go out: the body is complete and the locks released, or
    /// it is still streaming (then the locks wait for its last frame).
    pub(crate) fn read_ahead(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Kind::Guarded { inner } = &mut self.kind else {
            return Poll::Ready(());
        };
        let mut g = inner.as_mut().project();
        loop {
            if let Some(release) = g.releasing.as_mut() {
                ready!(Pin::new(release).poll(cx));
                *g.releasing = None;
                return Poll::Ready(());
            }
            if g.last.is_some() || g.guard.is_none() || *g.buffered > READ_AHEAD_LIMIT {
                return Poll::Ready(());
            }
            let Poll::Ready(frame) = g.body.as_mut().poll_frame(cx) else {
                // Streaming: the headers go now, the locks stay.
                return Poll::Ready(());
            };
            let is_last = ends_stream(&frame, &*g.body, g.left);
            match frame {
                Some(Ok(frame)) if !is_last => {
                    *g.buffered += data_len(&frame);
                    g.queued.push_back(frame);
                }
                frame => {
                    if let Some(Ok(f)) = &frame {
                        *g.buffered += data_len(f);
                    }
                    *g.last = Some(frame);
                    *g.releasing = g.guard.take().and_then(ReleaseGuard::start);
                }
            }
        }
    }
}

/// Whether `frame`, just polled from `body`, is its last item: the end, an
/// error, a frame after which the body reports its end, or one that brings
/// the data bytes `left` (counted down here) to the length after which the
/// server reads no further.
fn ends_stream<B: Body>(
    frame: &Option<Result<Frame<B::Data>, B::Error>>,
    body: &B,
    left: &mut Option<u64>,
) -> bool {
    match frame {
        None | Some(Err(_)) => true,
        Some(Ok(frame)) => fills(frame, left) | body.is_end_stream(),
    }
}

/// Whether `frame` brings `left` to 0 (a frame without data, trailers,
/// never does).
fn fills<D: Buf>(frame: &Frame<D>, left: &mut Option<u64>) -> bool {
    let (len, Some(n)) = (data_len(frame), left.as_mut()) else {
        return false;
    };
    if len == 0 {
        return false;
    }
    *n = n.saturating_sub(len);
    *n == 0
}

fn data_len<D: Buf>(frame: &Frame<D>) -> u64 {
    frame.data_ref().map_or(0, |d| d.remaining() as u64)
}

impl<B> Body for LockBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Plain { body } => body.poll_frame(cx),
            KindProj::Rejection { body } => body
                .poll_frame(cx)
                .map(|frame| frame.map(|f| Ok(f.map_data(Into::into)))),
            KindProj::Guarded { inner } => {
                let mut g = inner.as_mut().project();
                loop {
                    if let Some(frame) = g.queued.pop_front() {
                        *g.buffered -= data_len(&frame);
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    if let Some(release) = g.releasing.as_mut() {
                        ready!(Pin::new(release).poll(cx));
                        *g.releasing = None;
                    }
                    if let Some(frame) = g.last.take() {
                        *g.buffered = 0;
                        *g.done = !matches!(frame, Some(Ok(_)));
                        return Poll::Ready(frame);
                    }
                    if *g.done {
                        return Poll::Ready(None);
                    }
                    let frame = ready!(g.body.as_mut().poll_frame(cx));
                    let is_last = ends_stream(&frame, &*g.body, g.left);
                    if is_last && let Some(release) = g.guard.take().and_then(ReleaseGuard::start) {
                        *g.releasing = Some(release);
                        *g.last = Some(frame);
                        continue;
                    }
                    *g.done = !matches!(frame, Some(Ok(_)));
                    return Poll::Ready(frame);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Plain { body } => body.is_end_stream(),
            Kind::Guarded { inner } => {
                let g = &**inner;
                g.queued.is_empty()
                    && g.guard.is_none()
                    && g.releasing.is_none()
                    && g.last.is_none()
                    && (g.done || g.body.is_end_stream())
            }
            Kind::Rejection { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Plain { body } => body.size_hint(),
            Kind::Guarded { inner } => {
                let g = &**inner;
                // Read-ahead bytes plus what the body still has.
                let rest = if g.done || g.last.is_some() {
                    SizeHint::with_exact(0)
                } else {
                    g.body.size_hint()
                };
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + g.buffered);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + g.buffered);
                }
                hint
            }
            Kind::Rejection { body } => body.size_hint(),
        }
    }
}

/// An empty body, as the responses middleware like tower-http's
/// `TimeoutLayer` build themselves (so it can sit on a `LockLayer` in one
/// `ServiceBuilder`).
impl<B: Body> Default for LockBody<B> {
    fn default() -> Self {
        LockBody::rejection(axum::body::Body::empty())
    }
}

impl<B: Body> fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockBody").finish_non_exhaustive()
    }
}
