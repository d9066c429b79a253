//! Rejection responses: 429 for a busy lock, 503 for an unreachable backend,
//! 400 for a bad spec; the hook that shapes them, and [`LockError`] as an
//! axum response.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body as AxumBody;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body::{Body, Frame, SizeHint};

use crate::error::LockError;
use crate::layer::retry::RetryPolicy;

/// The hook that turns a [`LockError`] into the response sent instead of
/// calling the handler (see [`LockLayer::rejection`](crate::LockLayer::rejection)).
pub(crate) type Hook = Arc<dyn Fn(&LockError) -> Response + Send + Sync>;

/// How a layer rejects: its hook, and the `Retry-After` policy applied to
/// the error first (with the hold times it learns from). One `Arc` for
/// both, so a request carries one pointer.
pub(crate) struct Rejecter {
    hook: Hook,
    retry: Option<Arc<RetryPolicy>>,
}

pub(crate) type SharedRejection = Arc<Rejecter>;

impl Rejecter {
    pub(crate) fn new(hook: Hook, retry: Option<Arc<RetryPolicy>>) -> SharedRejection {
        Arc::new(Rejecter { hook, retry })
    }

    /// The response for `error`, its `Retry-After` as the policy says.
    pub(crate) fn reject(&self, error: &LockError) -> Response {
        match self.retry.as_ref().and_then(|p| p.apply(error)) {
            Some(told) => (self.hook)(&told),
            None => (self.hook)(error),
        }
    }

    pub(crate) fn retry(&self) -> Option<&Arc<RetryPolicy>> {
        self.retry.as_ref()
    }

    pub(crate) fn hook(&self) -> &Hook {
        &self.hook
    }

    /// The policy, when it learns from hold times.
    pub(crate) fn learning(&self) -> Option<&Arc<RetryPolicy>> {
        self.retry.as_ref().filter(|p| p.records())
    }
}

/// `rejection` as the layers keep it: anything a closure returns that is a
/// response.
pub(crate) fn hook<F, R>(rejection: F) -> Hook
where
    F: Fn(&LockError) -> R + Send + Sync + 'static,
    R: IntoResponse,
{
    Arc::new(move |error: &LockError| rejection(error).into_response())
}

/// The default rejection, as the layers keep it.
pub(crate) fn default_hook() -> Hook {
    Arc::new(default_rejection)
}

/// The default rejection: the error's status ([`LockError::status`]), a
/// JSON body `{"error": {"code": "...", "message": "..."}}` that never echoes
/// the key or backend internals, and `Retry-After` for `429` and `503` (whole
/// seconds, at least one). The same as a [`LockError`] returned as a
/// response ([`IntoResponse`]).
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{LockError, default_rejection};
///
/// let res = default_rejection(&LockError::AcquisitionFailed {
///     retry_after: Some(Duration::from_millis(2500)),
/// });
/// assert_eq!(res.status(), 429);
/// assert_eq!(res.headers()["retry-after"], "3");
/// ```
pub fn default_rejection(error: &LockError) -> Response {
    let mut res = json_error(error.status(), error.code(), &public_message(error));
    if error.is_retryable() {
        res.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(error.retry_after_secs()),
        );
    }
    res.map(AxumBody::from)
}

/// A handler or extractor can return a [`LockError`] (`Result<T, LockError>`):
/// the response is the one the layer answers with ([`default_rejection`]).
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_lock::{LockError, Locks};
///
/// async fn release(locks: Locks) -> Result<String, LockError> {
///     let n = locks.release_all().await?;
///     Ok(format!("released {n}"))
/// }
/// let app: Router = Router::new().route("/release", post(release));
/// # let _ = app;
/// ```
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        default_rejection(&self)
    }
}

/// A rejection's body inside a layer's response body (whose data is made
/// from `Bytes`). A rejection body that fails ends there: its error type is
/// not the handler's, and the status and headers are already out.
pub(crate) struct RejectionBody(AxumBody);

impl RejectionBody {
    pub(crate) fn new(body: AxumBody) -> Self {
        RejectionBody(body)
    }

    pub(crate) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame<Bytes>>> {
        match Pin::new(&mut self.0).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(frame)),
            Poll::Ready(Some(Err(e))) => {
                tracing::warn!(error = %e, "the rejection's body failed; it ends here");
                self.0 = AxumBody::empty();
                Poll::Ready(None)
            }
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// The message shown to clients: the error's text without backend details.
fn public_message(error: &LockError) -> String {
    match error {
        LockError::BackendUnavailable(_) => "the lock backend is unavailable".to_owned(),
        other => other.to_string(),
    }
}

/// `status` with the JSON error body of `code` and `message`.
pub(crate) fn json_error(status: StatusCode, code: &str, message: &str) -> http::Response<Bytes> {
    let mut res = http::Response::new(json_body(code, message));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

pub(crate) fn json_body(code: &str, message: &str) -> Bytes {
    let mut out = String::with_capacity(48 + code.len() + message.len());
    out.push_str("{\"error\":{\"code\":");
    push_json_str(&mut out, code);
    out.push_str(",\"message\":");
    push_json_str(&mut out, message);
    out.push_str("}}");
    Bytes::from(out)
}

fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_escaped() {
        let body = json_body("X", "a \"quoted\"\n\\ text");
        assert_eq!(
            &body[..],
            br#"{"error":{"code":"X","message":"a \"quoted\"\u000a\\ text"}}"#
        );
    }

    #[test]
    fn backend_details_are_not_shown() {
        let res = json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "LOCK_BACKEND_UNAVAILABLE",
            &public_message(&LockError::BackendUnavailable("redis at 10.0.0.1".into())),
        );
        assert!(!String::from_utf8_lossy(res.body()).contains("10.0.0.1"));
        let res = default_rejection(&LockError::BackendUnavailable("redis at 10.0.0.1".into()));
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()["retry-after"], "1");
    }
}
