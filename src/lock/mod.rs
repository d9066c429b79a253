//! The lock protocol outside the backends: taking locks ([`acquire`]),
//! giving them back whatever happens to the caller ([`release`]), and the
//! handles a request and a job hold them by.

pub(crate) mod acquire;
pub(crate) mod extract;
mod held;
mod owned;
pub(crate) mod registry;
pub(crate) mod release;
mod token;
mod with;

pub use extract::MissingLocks;
pub use held::HeldLock;
pub use owned::OwnedLock;
pub use registry::Locks;
pub use token::LockToken;
pub use with::with_lock;
