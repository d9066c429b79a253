#![doc = "tower-lock: distributed locks as tower/axum middleware (docs in progress)."]
#![deny(missing_docs, unreachable_pub, unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod error;
mod key;
mod spec;

pub use backend::memory::MemoryBackend;
pub use backend::{BoxFuture, Lease, LockBackend, LockStatus, SharedBackend};
pub use error::LockError;
pub use key::{KeyDigest, LockKey, MAX_KEY_BYTES, Scope};
pub use spec::{
    AcquireRequest, LockSpec, MAX_OWNER_BYTES, MAX_TTL, new_owner_token, validate_owner,
    validate_ttl,
};
