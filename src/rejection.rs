//! Rejection responses: 429 for a busy lock, 503 for an unreachable backend,
//! 400 for a bad spec; and the hook to shape them.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::error::LockError;

/// Turns a [`LockError`] that stopped a request into the response sent
/// instead of calling the handler.
///
/// Implemented for closures `Fn(&LockError) -> http::Response<Bytes>`; the
/// default is [`default_rejection`].
pub trait Rejection: Send + Sync + 'static {
    /// Build the response for `error`.
    fn rejection(&self, error: &LockError) -> Response<Bytes>;
}

impl<F> Rejection for F
where
    F: Fn(&LockError) -> Response<Bytes> + Send + Sync + 'static,
{
    fn rejection(&self, error: &LockError) -> Response<Bytes> {
        self(error)
    }
}

pub(crate) type SharedRejection = Arc<dyn Rejection>;

/// The default rejection: the error's status ([`LockError::status`]), a
/// JSON body `{"error": {"code": "...", "message": "..."}}` that never echoes
/// the key or backend internals, and `Retry-After` (whole seconds, at least
/// 1) for `429` and `503`.
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
pub fn default_rejection(error: &LockError) -> Response<Bytes> {
    let mut res = json_error(error.status(), error.code(), &public_message(error));
    if error.is_retryable() {
        res.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(error.retry_after_secs()),
        );
    }
    res
}

/// The message shown to clients: the error's text without backend details.
fn public_message(error: &LockError) -> String {
    match error {
        LockError::BackendUnavailable(_) => "the lock backend is unavailable".to_owned(),
        other => other.to_string(),
    }
}

/// `{"error":{"code":C,"message":M}}` with JSON string escaping.
/// `status` with the JSON error body of `code` and `message`.
pub(crate) fn json_error(status: StatusCode, code: &str, message: &str) -> Response<Bytes> {
    let mut res = Response::new(json_body(code, message));
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
        let res = default_rejection(&LockError::BackendUnavailable("redis at 10.0.0.1".into()));
        assert_eq!(res.status(), 503);
        assert!(!String::from_utf8_lossy(res.body()).contains("10.0.0.1"));
        assert_eq!(res.headers()["retry-after"], "1");
    }
}
