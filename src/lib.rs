#![doc = "tower-lock: distributed locks as tower/axum middleware (docs in progress)."]
#![deny(missing_docs, unreachable_pub, unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod body;
mod error;
mod future;
mod key;
mod layer;
mod locks;
mod rejection;
mod request;
mod service;
mod spec;

pub use backend::memory::MemoryBackend;
pub use backend::{BoxFuture, Lease, LockBackend, LockStatus, SharedBackend};
pub use body::LockBody;
pub use error::LockError;
pub use future::ResponseFuture;
pub use key::{KeyDigest, LockKey, MAX_KEY_BYTES, Scope};
pub use layer::LockLayer;
pub use locks::{HeldLock, Locks, MissingLockLayer, OwnedLock};
pub use rejection::{Rejection, default_rejection};
pub use request::{LockRequest, PathParams, path_params};
pub use service::LockService;
pub use spec::{
    AcquireRequest, LockSpec, MAX_OWNER_BYTES, MAX_TTL, new_owner_token, validate_owner,
    validate_ttl,
};
