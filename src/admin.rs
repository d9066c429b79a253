//! Admin API: an axum [`Router`] for operators to inspect and release locks.
//!
//! | route | what |
//! |---|---|
//! | `GET /locks/{key}` | `{"key", "locked": true, "acquired_at", "expires_at", "ttl_remaining_ms", "fence", "kind"}` (+ `"owner"` when [`show_owner`](Admin::show_owner) is on, + `"metadata"` when [`show_metadata`](Admin::show_metadata) is on); a lock held shared or under permits (`"kind": "shared"` or `"permits=N"`) also lists `"holders"`, each with the same fields, and the top-level fields describe the hold that ends first; `{"key", "locked": false}` when free |
//! | `DELETE /locks/{key}` + header `lock-owner` (and optionally `lock-fence`) | release, checked against the owner token (and the fence: only that acquisition of a reused owner token): `200 {"key", "released": true}`, `404 LOCK_NOT_FOUND`, `409 LOCK_OWNERSHIP_MISMATCH`, `400 LOCK_INVALID_OWNER` without the owner header, `400 LOCK_INVALID_HEADER` for a fence that is not a number |
//! | `DELETE /locks/{key}?force=true` | release whoever holds it, only when [`allow_force`](Admin::allow_force) is on (else `403 LOCK_FORCE_DISABLED`): `200 {"key", "released": true, "forced": true}`, `404 LOCK_NOT_FOUND`; `force` is `true`/`1` or `false`/`0` (any case), anything else `400 LOCK_INVALID_QUERY` |
//!
//! `{key}` is the user's key, percent-decoded strictly (a malformed escape
//! or a key that is not UTF-8 is refused) and validated like any key
//! (`400 LOCK_INVALID_KEY`); it may contain `/`. Keys are global-scope keys
//! unless the query names a route pattern: `?route=/orders/{id}`. The owner
//! and fence headers are the ones a keep-after-response response carries
//! ([`headers::LOCK_OWNER`](crate::layer::headers::LOCK_OWNER),
//! [`headers::LOCK_FENCE`](crate::layer::headers::LOCK_FENCE)), so a client can echo
//! them back. Timestamps are RFC 3339 (UTC).
//!
//! The router has no authentication of its own: mount it behind your auth
//! layer, as force release can break anyone's lock. Compare secrets in
//! constant time (here with the `subtle` crate), so response times do not
//! reveal how much of a guess was right.
//!
//! ```
//! use axum::{Router, middleware::{self, Next}, extract::Request, response::Response};
//! use http::StatusCode;
//! use subtle::ConstantTimeEq;
//! use tower_lock::{MemoryBackend, SharedBackend, admin::Admin};
//!
//! async fn require_token(req: Request, next: Next) -> Result<Response, StatusCode> {
//!     let expected = b"Bearer s3cret"; // from your configuration
//!     match req.headers().get("authorization") {
//!         Some(v) if bool::from(v.as_bytes().ct_eq(expected)) => Ok(next.run(req).await),
//!         _ => Err(StatusCode::UNAUTHORIZED),
//!     }
//! }
//!
//! let backend = SharedBackend::new(MemoryBackend::new());
//! let admin = Admin::new(backend.clone()).allow_force(true).router();
//! let app: Router = Router::new().nest("/admin", admin.layer(middleware::from_fn(require_token)));
//! # let _ = app;
//! ```

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use http::{HeaderMap, StatusCode, Uri, header};
use serde_json::{Value, json};

use crate::backend::{Holder, SharedBackend};
use crate::error::LockError;
use crate::key::LockKey;
use crate::layer::headers::{LOCK_FENCE, LOCK_OWNER};
use crate::layer::rejection::json_error;
use crate::percent;
use crate::time::rfc3339;

/// Builds the admin [`Router`]. See the [module docs](self).
#[derive(Clone)]
pub struct Admin {
    backend: SharedBackend,
    show_owner: bool,
    show_metadata: bool,
    allow_force: bool,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("show_owner", &self.show_owner)
            .field("show_metadata", &self.show_metadata)
            .field("allow_force", &self.allow_force)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// Admin API over `backend`; owners and metadata hidden, force release off.
    pub fn new(backend: impl Into<SharedBackend>) -> Self {
        Admin {
            backend: backend.into(),
            show_owner: false,
            show_metadata: false,
            allow_force: false,
        }
    }

    /// Show holders' owner tokens in `GET` answers (they are credentials:
    /// anyone who sees one can release that lock). Default off.
    pub fn show_owner(mut self, on: bool) -> Self {
        self.show_owner = on;
        self
    }

    /// Show the metadata stored with a lock ([`LockSpec::metadata`](crate::LockSpec::metadata))
    /// in `GET` answers, as the JSON object it is (`"metadata"`, absent
    /// when the lock has none). Default off: metadata may name people or
    /// say why something was locked.
    pub fn show_metadata(mut self, on: bool) -> Self {
        self.show_metadata = on;
        self
    }

    /// Allow `DELETE /locks/{key}?force=true`. Default off.
    pub fn allow_force(mut self, on: bool) -> Self {
        self.allow_force = on;
        self
    }

    /// The router, to `nest` under a prefix of your choice.
    pub fn router<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        Router::new()
            .route("/locks/{*key}", get(status).delete(release))
            .with_state(Arc::new(self))
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    let mut res = Response::new(Body::from(value.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    res
}

fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    json_error(status, code, message).map(Body::from)
}

fn lock_error(e: &LockError) -> Response {
    let message = match e {
        LockError::BackendUnavailable(_) => "the lock backend is unavailable".to_owned(),
        other => other.to_string(),
    };
    error_response(e.status(), e.code(), &message)
}

/// The first value of query parameter `name`, decoded; `Err(())` when it
/// is not valid percent-encoded UTF-8.
fn query_param(uri: &Uri, name: &str) -> Result<Option<String>, ()> {
    let Some(query) = uri.query() else {
        return Ok(None);
    };
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == name {
            return percent::decode_strict(&v.replace('+', " "))
                .map(Some)
                .ok_or(());
        }
    }
    Ok(None)
}

/// The key named by the path ([`path_key`]) and query.
///
/// A `route` that cannot be decoded is an error, never "no route": that
/// would name the global lock of the same key, and a release or force
/// release would act on the wrong lock.
fn lock_key(uri: &Uri) -> Result<LockKey, LockError> {
    let raw = path_key(uri)?;
    match query_param(uri, "route") {
        Ok(Some(route)) => LockKey::route(route, raw),
        Ok(None) => LockKey::global(raw),
        Err(()) => Err(LockError::InvalidKey(
            "the `route` query parameter is not valid percent-encoded UTF-8",
        )),
    }
}

/// The key in the path (`/locks/{*key}`), decoded as strictly as `route`:
/// a malformed escape or a key that is not UTF-8 is `400
/// LOCK_INVALID_KEY`, never a guess at which lock was named (nor axum's
/// plain-text rejection).
fn path_key(uri: &Uri) -> Result<String, LockError> {
    // This router's own path, still percent-encoded: `/locks/…` once axum
    // stripped a nesting prefix, or after a prefix it leaves (a segment
    // with a parameter inside, `/t-{tenant}`): the key follows the first
    // `/locks/`.
    let path = uri.path();
    let raw = match path.find("/locks/") {
        Some(at) => &path[at + "/locks/".len()..],
        None => "",
    };
    crate::percent::decode_strict(raw).ok_or(LockError::InvalidKey(
        "the key in the path is not valid percent-encoded UTF-8",
    ))
}

async fn status(State(admin): State<Arc<Admin>>, uri: Uri) -> Response {
    let key = match lock_key(&uri) {
        Ok(key) => key,
        Err(e) => return lock_error(&e),
    };
    match admin.backend.status(&key).await {
        Ok(None) => json_response(StatusCode::OK, &json!({"key": key.key(), "locked": false})),
        Ok(Some(s)) => {
            let mut body = json!({
                "key": key.key(),
                "locked": true,
                "acquired_at": rfc3339(s.acquired_at),
                "expires_at": rfc3339(s.expires_at),
                "ttl_remaining_ms": s.ttl_remaining.as_millis() as u64,
                "fence": s.fence,
            });
            if admin.show_owner {
                body["owner"] = Value::from(s.owner);
            }
            if admin.show_metadata
                && let Some(metadata) = &s.metadata
            {
                body["metadata"] = metadata.to_value();
            }
            if !s.holders.is_empty() {
                // Shared or under permits: the fields above are the hold
                // that ends first; every hold, in grant order.
                body["kind"] = Value::from(s.kind.to_string());
                let holders = s.holders.iter().map(|h| {
                    let mut hold = json!({
                        "acquired_at": rfc3339(h.acquired_at),
                        "expires_at": rfc3339(h.expires_at),
                        "ttl_remaining_ms": h.ttl_remaining.as_millis() as u64,
                        "fence": h.fence,
                    });
                    if admin.show_owner {
                        hold["owner"] = Value::from(h.owner.clone());
                    }
                    if admin.show_metadata
                        && let Some(metadata) = &h.metadata
                    {
                        hold["metadata"] = metadata.to_value();
                    }
                    hold
                });
                body["holders"] = Value::Array(holders.collect());
            } else {
                body["kind"] = Value::from("exclusive");
            }
            json_response(StatusCode::OK, &body)
        }
        Err(e) => lock_error(&e),
    }
}

async fn release(State(admin): State<Arc<Admin>>, uri: Uri, headers: HeaderMap) -> Response {
    let key = match lock_key(&uri) {
        Ok(key) => key,
        Err(e) => return lock_error(&e),
    };
    // Read strictly: `?force=yes` falling through to a release checked
    // against an owner would answer a misleading "no owner".
    let force = match query_param(&uri, "force") {
        Ok(None) => false,
        Ok(Some(f)) if f.eq_ignore_ascii_case("true") || f == "1" => true,
        Ok(Some(f)) if f.eq_ignore_ascii_case("false") || f == "0" => false,
        _ => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "LOCK_INVALID_QUERY",
                "`force` must be true or false",
            );
        }
    };
    if force {
        if !admin.allow_force {
            return error_response(
                StatusCode::FORBIDDEN,
                "LOCK_FORCE_DISABLED",
                "force release is not enabled on this server",
            );
        }
        return match admin.backend.force_release(&key).await {
            Ok(true) => {
                tracing::info!(key = %key.digest(), "lock force-released by an operator");
                json_response(
                    StatusCode::OK,
                    &json!({"key": key.key(), "released": true, "forced": true}),
                )
            }
            Ok(false) => lock_error(&LockError::NotFound),
            Err(e) => lock_error(&e),
        };
    }
    let Some(owner) = headers.get(&LOCK_OWNER).and_then(|v| v.to_str().ok()) else {
        return lock_error(&LockError::InvalidOwner(
            "send the owner token in the lock-owner header",
        ));
    };
    if let Err(e) = crate::spec::validate_owner(owner) {
        return lock_error(&e);
    }
    // With a `lock-fence`, only that acquisition: a custom owner token may
    // have taken the lock again since the operator looked.
    let holder = match headers.get(&LOCK_FENCE) {
        None => Holder::owner_only(owner),
        Some(value) => match value.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(fence) => Holder::new(owner, fence),
            None => {
                return lock_error(&LockError::InvalidHeader(
                    "lock-fence must be a fencing token (a decimal number)",
                ));
            }
        },
    };
    match admin.backend.release(&key, holder).await {
        Ok(()) => json_response(StatusCode::OK, &json!({"key": key.key(), "released": true})),
        Err(e) => lock_error(&e),
    }
}
