//! Distributed locks as [tower] middleware, for [axum] and any tower HTTP
//! service: when two requests must not touch the same resource at once.
//!
//! A [`LockLayer`] wraps routes. For each request it asks a [`LockRequest`]
//! (a small trait, implemented for closures) which lock to take: a
//! [`LockSpec`] with a key, a TTL, how long to wait, a [`Scope`] and whether to
//! release after the response. No spec: the request passes through with no
//! backend call. A spec: the layer acquires the lock, waiting at most the max
//! wait, or answers **`429 Too Many Requests` with `Retry-After`** and a JSON
//! error, and the handler never runs.
//!
//! Every lock of the request is **released after the response**: when its
//! body has been sent, or was dropped because the client went away, or the
//! handler failed or panicked. Handlers read and add locks through the
//! [`Locks`] extractor, and can [`cancel_auto_release`](Locks::cancel_auto_release)
//! a lock to hand it to a background job as an [`OwnedLock`].
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, body::Body, routing::post};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_lock::{LockLayer, LockSpec, Locks, MemoryBackend, path_params};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // One lock per order, held while the payment runs; 2 s of patience.
//! let orders = LockLayer::new(MemoryBackend::new(), |req: &Request<Body>| {
//!     let id = path_params(req).get("id")?.to_owned();
//!     Some(LockSpec::new(format!("order:{id}"), Duration::from_secs(30)).max_wait(Duration::from_secs(2)))
//! });
//!
//! async fn pay(locks: Locks) -> String {
//!     let lock = locks.first().expect("the layer took it");
//!     format!("paid under fence {}", lock.fence())
//! }
//!
//! let app = Router::new().route("/orders/{id}/pay", post(pay).layer(orders));
//! let res = app.oneshot(Request::post("/orders/7/pay").body(Body::empty()).unwrap()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! # }
//! ```
//!
//! # Backends
//!
//! - [`MemoryBackend`]: in this process; the default for examples, tests and
//!   single-instance apps.
//! - `RedisBackend` (feature `redis`, off by default): shared by every
//!   instance of the app through one Redis, on `deadpool-redis`.
//! - `PostgresBackend` (feature `postgres`, off by default): shared through
//!   the PostgreSQL database the app already has, on `tokio-postgres` and
//!   `deadpool-postgres`.
//! - `EtcdBackend` (feature `etcd`, off by default): grants decided by an
//!   etcd cluster's Raft consensus, on `etcd-client`: a lock survives the
//!   loss of a minority of its members and is never granted twice.
//!
//! All implement [`LockBackend`]; the same behavioural test suite runs
//! against each.
//!
//! # Errors
//!
//! | code | status | when |
//! |---|---|---|
//! | `LOCK_ACQUISITION_FAILED` | 429 + `Retry-After` | held by someone else, no wait |
//! | `LOCK_TIMEOUT` | 429 + `Retry-After` | still held after the max wait |
//! | `LOCK_EXPIRED` | 429 + `Retry-After` | a lock ran out before the handler could run |
//! | `LOCK_BACKEND_UNAVAILABLE` | 503 + `Retry-After` | the backend cannot be reached in time |
//! | `LOCK_INVALID_KEY`, `LOCK_INVALID_TTL`, `LOCK_INVALID_OWNER`, `LOCK_INVALID_METADATA` | 400 | bad spec from the request (or one key in two scopes, or twice with other settings) |
//! | `LOCK_INVALID_HEADER`, `LOCK_NOT_ALLOWED` | 400 | a client-directed lock ([`ClientLocks`]) with a bad header, or over the server's limits |
//! | `LOCK_NOT_FOUND` | 404 | release/extend of a lock that is not held |
//! | `LOCK_OWNERSHIP_MISMATCH` | 409 | release/extend with another owner's token |
//! | `LOCK_INVALID_KIND` | 400 | zero or more than 1024 permits, a `Lock-Mode` header that names no kind, one key named as two kinds |
//! | `LOCK_KIND_MISMATCH` | 409 | the key is held under another kind (permits beside shared/exclusive holds, another number of permits) |
//! | `LOCK_ALREADY_RELEASED` | 410 | [`Locks::release`] of a lock this request already released, or [`Locks`] used after the response released its locks, or [`Locks::acquire`] of a lock kept after the response (auto-release off) once the handler has answered |
//! | `LOCK_LAYER_MISSING` | 500 | the [`Locks`] or [`HeldLock`] extractor behind no [`LockLayer`] (see [`MissingLocks`]) |
//! | `LOCK_NOT_REQUESTED` | 500 | the same on a request the layer named no lock for |
//! | `LOCK_INVALID_CONFIG` | — | a backend configured wrongly, where it is built (never from the layer) |
//! | `LOCK_UNSUPPORTED` | 501 | a lookup the backend cannot do as configured (Redis `held_by` without its owner index) |
//! | `LOCK_FORCE_DISABLED` | 403 | the admin API's force release while it is off (feature `admin`) |
//! | `LOCK_INVALID_QUERY` | 400 | the admin API's `force` parameter is neither `true`/`1` nor `false`/`0` (feature `admin`) |
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum
#![deny(missing_docs, unreachable_pub, unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod backend;
mod client;
mod error;
pub mod flight;
#[cfg(all(
    feature = "redis",
    feature = "redis-cluster",
    feature = "postgres",
    feature = "etcd",
    feature = "apalis",
    feature = "admin",
    feature = "metrics"
))]
pub mod guide;
// The README's examples are doctests too: what a newcomer copies compiles.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
pub mod job;
mod key;
pub mod layer;
mod lock;
mod metadata;
mod observe;
mod path;
mod percent;
mod spec;
mod time;
mod watchdog;

#[cfg(feature = "etcd")]
pub use backend::etcd::EtcdBackend;
pub use backend::memory::MemoryBackend;
#[cfg(feature = "postgres")]
pub use backend::postgres::PostgresBackend;
#[cfg(feature = "redis")]
pub use backend::redis::RedisBackend;
pub use backend::{LockBackend, LockStatus, SharedBackend};
pub use client::ClientLocks;
pub use error::LockError;
pub use key::{LockKey, MAX_KEY_BYTES, Scope};
pub use layer::LockLayer;
pub use layer::headers;
pub use layer::rejection::default_rejection;
pub use layer::request::LockRequest;
pub use layer::retry::RetryAfter;
pub use lock::{HeldLock, LockToken, Locks, MissingLocks, OwnedLock, with_lock};
pub use metadata::{LockMetadata, MAX_METADATA_BYTES, MAX_METADATA_DEPTH};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use observe::describe_metrics;
pub use path::{PathParams, path_params};
pub use spec::{LockKind, LockSpec, MAX_OWNER_BYTES, MAX_PERMITS, MAX_TTL};
pub use watchdog::LostSignal;

// What a job locks, global by its type (issue 26, item 4).
pub use spec::JobSpec;
