//! [`LockBody`]: the response body that releases the request's locks when
//! its last frame goes out, or when it is dropped.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::backend::BoxFuture;
use crate::locks::{Locks, release_detached_future};

/// Releases a request's auto-release locks exactly once: when started at
/// the end of the response, or on drop (client gone, body dropped early,
/// panic unwinding). `Drop` cannot wait, so there the release runs in a task;
/// if even that fails, the TTL frees the lock.
pub(crate) struct ReleaseGuard {
    locks: Option<Locks>,
}

impl ReleaseGuard {
    pub(crate) fn new(locks: Locks) -> Self {
        ReleaseGuard { locks: Some(locks) }
    }

    pub(crate) fn locks(&self) -> Option<&Locks> {
        self.locks.as_ref()
    }

    /// Release now; `None` if done synchronously, else the work to await.
    pub(crate) fn start(mut self) -> Option<BoxFuture<'static, ()>> {
        self.locks
            .take()
            .and_then(|locks| locks.release_auto())
            .map(|f| Box::pin(DetachOnDrop(Some(f))) as BoxFuture<'static, ()>)
    }
}

/// A started release that finishes in a task if it is dropped unfinished.
struct DetachOnDrop(Option<BoxFuture<'static, ()>>);

impl std::future::Future for DetachOnDrop {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(f) = self.0.as_mut() {
            ready!(f.as_mut().poll(cx));
            self.0 = None;
        }
        Poll::Ready(())
    }
}

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            release_detached_future(f);
        }
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        if let Some(locks) = self.locks.take()
            && let Some(fut) = locks.release_auto()
        {
            release_detached_future(fut);
        }
    }
}

pin_project! {
    /// Response body of [`LockService`](crate::LockService).
    ///
    /// Passes the handler's body through; the request's locks are released
    /// before its final frame is handed on (so a client that has read the
    /// whole response can take the lock again at once), or when the body is
    /// dropped unfinished. A rejection carries the JSON error body.
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
        Inner {
            #[pin]
            body: B,
            guard: Option<ReleaseGuard>,
            releasing: Option<BoxFuture<'static, ()>>,
            // The final frame (or end), held back until the release is done.
            pending: Option<Option<Result<Frame<B::Data>, B::Error>>>,
        },
        Rejection {
            bytes: Option<Bytes>,
        },
    }
}

impl<B: Body> LockBody<B> {
    pub(crate) fn new(body: B) -> Self {
        LockBody {
            kind: Kind::Inner {
                body,
                guard: None,
                releasing: None,
                pending: None,
            },
        }
    }

    pub(crate) fn guarded(body: B, guard: ReleaseGuard) -> Self {
        LockBody {
            kind: Kind::Inner {
                body,
                guard: Some(guard),
                releasing: None,
                pending: None,
            },
        }
    }

    pub(crate) fn rejection(bytes: Bytes) -> Self {
        LockBody {
            kind: Kind::Rejection {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }
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
            KindProj::Rejection { bytes } => {
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b.into()))))
            }
            KindProj::Inner {
                mut body,
                guard,
                releasing,
                pending,
            } => loop {
                if let Some(release) = releasing.as_mut() {
                    ready!(release.as_mut().poll(cx));
                    *releasing = None;
                }
                if let Some(frame) = pending.take() {
                    return Poll::Ready(frame);
                }
                let frame = ready!(body.as_mut().poll_frame(cx));
                let last = match &frame {
                    None | Some(Err(_)) => true,
                    Some(Ok(_)) => body.is_end_stream(),
                };
                if last && let Some(release) = guard.take().and_then(ReleaseGuard::start) {
                    *releasing = Some(release);
                    *pending = Some(frame);
                    continue;
                }
                return Poll::Ready(frame);
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner {
                body,
                guard,
                releasing,
                pending,
            } => {
                guard.is_none() && releasing.is_none() && pending.is_none() && body.is_end_stream()
            }
            Kind::Rejection { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejection { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

impl<B: Body> fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockBody").finish_non_exhaustive()
    }
}
