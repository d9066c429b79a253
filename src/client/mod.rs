//! [`ClientLocks`]: client-directed locks (Forrst's `atomicLock`), asked for
//! with request headers and bounded by the server's limits.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Request};

use crate::error::LockError;
use crate::key::{Scope, normalise};
use crate::layer::headers::{
    LOCK_AUTO_RELEASE, LOCK_BLOCK, LOCK_KEY, LOCK_MODE, LOCK_OWNER, LOCK_SCOPE, LOCK_TTL,
};
use crate::layer::request::LockRequest;
use crate::percent;
use crate::spec::{LockKind, LockSpec};

mod duration;
use duration::parse_duration;

/// A [`LockRequest`] that lets the **client** ask for a lock with its
/// request (Forrst's `atomicLock` extension), within limits the server sets.
/// Opt-in: a route takes client-directed locks only under a layer built
/// with it.
///
/// | request header | Forrst option | value |
/// |---|---|---|
/// | `Lock-Key` | `key` | the key, percent-encoded as in the response header; **no header, no lock** (but another lock header without it is a `400`: a misspelt `Lock-Key` never runs the handler unlocked) |
/// | `Lock-TTL` | `ttl` | whole seconds, or with a unit (any case): `500ms`, `30s`, `5m`, `1h`; required unless [`default_ttl`](ClientLocks::default_ttl) is set |
/// | `Lock-Block` | `block` | how long to wait for a busy lock, same format; default `0` (no wait) |
/// | `Lock-Owner` | `owner` | a custom owner token (1 to 128 bytes of visible ASCII) |
/// | `Lock-Auto-Release` | `auto_release` | `true` (default) or `false`: keep the lock after the response |
/// | `Lock-Scope` | `scope` | `function` (default; also `route`): the route's namespace, or `global` |
/// | `Lock-Mode` | — | `exclusive` (default), `shared` (a read hold) or `permits=N` (one of N), see [`LockKind`](crate::LockKind) |
///
/// Server-side limits: [`max_ttl`](ClientLocks::max_ttl) (default 60 s),
/// [`max_block`](ClientLocks::max_block) (default 5 s), which keys are
/// allowed ([`allow_keys`](ClientLocks::allow_keys), default any valid key),
/// whether `global` is allowed ([`allow_global`](ClientLocks::allow_global),
/// default no: each route's locks live in its own namespace, so a client
/// cannot lock what another route uses), and the most permits a
/// `Lock-Mode: permits=N` may name ([`max_permits`](ClientLocks::max_permits),
/// default 16), and whether shared holds are allowed
/// ([`allow_shared`](ClientLocks::allow_shared), default yes: they are not
/// bounded in number, each holds the key until its TTL). A bad or
/// over-limit header is
/// answered `400` with the layer's JSON error and a code:
///
/// | code | when |
/// |---|---|
/// | `LOCK_INVALID_HEADER` | a header cannot be read (not a number with a unit, not `true`/`false`, an unknown scope, a repeated header, `Lock-TTL` missing, `Lock-TTL`, `Lock-Block`, `Lock-Scope`, `Lock-Auto-Release` or `Lock-Mode` without `Lock-Key`) |
/// | `LOCK_NOT_ALLOWED` | over `max_ttl`, `max_block` or `max_permits`, a key the server does not allow, `global` where it is not allowed, `shared` where it is not allowed |
/// | `LOCK_INVALID_KIND` | a `Lock-Mode` that is not `exclusive`, `shared` or `permits=N` (1 to 1024) |
/// | `LOCK_INVALID_KEY`, `LOCK_INVALID_TTL`, `LOCK_INVALID_OWNER` | as for any spec |
///
/// Messages never echo the key or the owner. Add
/// [`LockLayer::lock_headers`](crate::LockLayer::lock_headers) to answer
/// with the lock's data (Forrst's `key`, `acquired`, `owner`, `scope`,
/// `expires_at`) on every locked response.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, routing::post};
/// use http::{Request, StatusCode};
/// use tower::ServiceExt;
/// use tower_lock::{ClientLocks, LockLayer, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let client_locks = ClientLocks::new()
///     .max_ttl(Duration::from_secs(30))
///     .max_block(Duration::from_secs(2))
///     // A prefix list as the key pattern: no regex engine needed.
///     .allow_keys(|key: &str| key.starts_with("user:") || key.starts_with("order:"));
/// let layer = LockLayer::new(MemoryBackend::new(), client_locks).lock_headers(true);
/// let app = Router::new().route("/charge", post(|| async { "charged" }).layer(layer));
///
/// let req = Request::post("/charge")
///     .header("lock-key", "user:123")
///     .header("lock-ttl", "10s")
///     .body(Body::empty())
///     .unwrap();
/// let res = app.clone().oneshot(req).await.unwrap();
/// assert_eq!(res.status(), StatusCode::OK);
/// assert_eq!(res.headers()["lock-key"], "user:123");
/// assert_eq!(res.headers()["lock-scope"], "function");
///
/// let too_long = Request::post("/charge")
///     .header("lock-key", "user:123")
///     .header("lock-ttl", "1h")
///     .body(Body::empty())
///     .unwrap();
/// assert_eq!(app.oneshot(too_long).await.unwrap().status(), StatusCode::BAD_REQUEST);
/// # }
/// ```
///
/// The key pattern is a predicate rather than a regular expression: a
/// prefix list or a `match` covers what servers allow in practice, costs
/// nothing to compile, and keeps a regex engine out of the dependencies.
#[derive(Clone)]
pub struct ClientLocks {
    max_ttl: Duration,
    max_block: Duration,
    default_ttl: Option<Duration>,
    allow_global: bool,
    allow_keys: Option<KeyFilter>,
    max_permits: u32,
    allow_shared: bool,
}

/// The server's predicate over client-chosen keys.
type KeyFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

impl Default for ClientLocks {
    fn default() -> Self {
        ClientLocks::new()
    }
}

impl fmt::Debug for ClientLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientLocks")
            .field("max_ttl", &self.max_ttl)
            .field("max_block", &self.max_block)
            .field("default_ttl", &self.default_ttl)
            .field("allow_global", &self.allow_global)
            .field("allow_keys", &self.allow_keys.is_some())
            .field("max_permits", &self.max_permits)
            .field("allow_shared", &self.allow_shared)
            .finish()
    }
}

impl ClientLocks {
    /// The default limits: TTL at most 60 s (and required), block at most
    /// 5 s, any valid key, route scope only.
    pub fn new() -> Self {
        ClientLocks {
            max_ttl: Duration::from_secs(60),
            max_block: Duration::from_secs(5),
            default_ttl: None,
            allow_global: false,
            allow_keys: None,
            max_permits: 16,
            allow_shared: true,
        }
    }

    /// Allow `Lock-Mode: shared` (default on). Shared holds of a key are
    /// not bounded in number (a client may add one per request, each held
    /// until its TTL, kept past the response with `Lock-Auto-Release:
    /// false`), unlike permits; a server that does not trust its clients
    /// that far turns them off (`400 LOCK_NOT_ALLOWED`), or offers
    /// `permits=N` instead.
    pub fn allow_shared(mut self, on: bool) -> Self {
        self.allow_shared = on;
        self
    }

    /// The most permits a client may name with `Lock-Mode: permits=N`
    /// (default 16; 0 refuses permits). Its `N` decides how many hold the
    /// key at once, so a server keeps it in bounds as it does the TTL.
    pub fn max_permits(mut self, max_permits: u32) -> Self {
        self.max_permits = max_permits;
        self
    }

    /// The longest TTL a client may ask for.
    pub fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// The longest a client may ask to wait for a busy lock.
    pub fn max_block(mut self, max_block: Duration) -> Self {
        self.max_block = max_block;
        self
    }

    /// The TTL when the request has no `Lock-TTL` (default: none, the
    /// header is required, as in Forrst).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = Some(ttl);
        self
    }

    /// Allow `Lock-Scope: global` (default off).
    pub fn allow_global(mut self, on: bool) -> Self {
        self.allow_global = on;
        self
    }

    /// Allow only keys for which `allowed` is true. It is given the key that
    /// is locked: the `Lock-Key` header decoded and NFC-normalised (as every
    /// [`LockKey`](crate::LockKey)), so no other spelling of a refused key
    /// gets past it.
    pub fn allow_keys(mut self, allowed: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.allow_keys = Some(Arc::new(allowed));
        self
    }

    /// The longest TTL a client may ask for.
    pub fn get_max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The longest a client may wait.
    pub fn get_max_block(&self) -> Duration {
        self.max_block
    }

    /// The spec a request asks for: `Ok(None)` without `Lock-Key`.
    pub fn spec_for<B>(&self, request: &Request<B>) -> Result<Option<LockSpec>, LockError> {
        let headers = request.headers();
        let one = |name: &HeaderName| -> Result<Option<&str>, LockError> {
            let mut values = headers.get_all(name).iter();
            let Some(value) = values.next() else {
                return Ok(None);
            };
            if values.next().is_some() {
                return Err(LockError::InvalidHeader("a lock header is repeated"));
            }
            value
                .to_str()
                .map(|v| Some(v.trim()))
                .map_err(|_| LockError::InvalidHeader("a lock header is not visible ASCII"))
        };
        let Some(raw_key) = one(&LOCK_KEY)? else {
            // No key, no lock; but a client that sent how to lock meant
            // one (a misspelt `Lock-Key` must not run the handler unlocked).
            // (`Lock-Owner` alone also names kept locks to other routes.)
            let lock_headers = [
                &LOCK_TTL,
                &LOCK_BLOCK,
                &LOCK_SCOPE,
                &LOCK_AUTO_RELEASE,
                &LOCK_MODE,
            ];
            if lock_headers.iter().any(|name| headers.contains_key(*name)) {
                return Err(LockError::InvalidHeader(
                    "Lock-Key is required with the other lock headers",
                ));
            }
            return Ok(None);
        };
        let decoded = percent::decode_strict(raw_key).ok_or(LockError::InvalidHeader(
            "Lock-Key is not valid percent-encoded UTF-8",
        ))?;
        // The rule sees the key that is locked: NFC, as `LockKey` keeps it.
        // On the decoded text, `invoice%CC%81-7` (a combining accent) would
        // pass a rule that refuses `invoicé-7`, and lock `invoicé-7`.
        let key = normalise(&decoded)?;
        if let Some(allowed) = &self.allow_keys
            && !allowed(&key)
        {
            return Err(LockError::NotAllowed("this lock key is not allowed here"));
        }
        let ttl = match one(&LOCK_TTL)? {
            Some(v) => parse_duration(v).ok_or(LockError::InvalidHeader(
                "Lock-TTL is not a duration such as 30s",
            ))?,
            None => self
                .default_ttl
                .ok_or(LockError::InvalidHeader("Lock-TTL is required"))?,
        };
        if ttl > self.max_ttl {
            return Err(LockError::NotAllowed(
                "Lock-TTL is over this server's maximum",
            ));
        }
        let block = match one(&LOCK_BLOCK)? {
            Some(v) => parse_duration(v).ok_or(LockError::InvalidHeader(
                "Lock-Block is not a duration such as 5s",
            ))?,
            None => Duration::ZERO,
        };
        if block > self.max_block {
            return Err(LockError::NotAllowed(
                "Lock-Block is over this server's maximum",
            ));
        }
        let scope = match one(&LOCK_SCOPE)?.map(str::to_ascii_lowercase).as_deref() {
            None | Some("function" | "route") => Scope::Route,
            Some("global") if self.allow_global => Scope::Global,
            Some("global") => {
                return Err(LockError::NotAllowed(
                    "global lock scope is not allowed here",
                ));
            }
            Some(_) => {
                return Err(LockError::InvalidHeader(
                    "Lock-Scope must be function or global",
                ));
            }
        };
        let auto_release = match one(&LOCK_AUTO_RELEASE)?
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("true") => true,
            Some("false") => false,
            Some(_) => {
                return Err(LockError::InvalidHeader(
                    "Lock-Auto-Release must be true or false",
                ));
            }
        };
        let kind = match one(&LOCK_MODE)? {
            None => LockKind::Exclusive,
            Some(mode) => mode.parse::<LockKind>()?,
        };
        if let LockKind::Permits(n) = kind
            && n > self.max_permits
        {
            return Err(LockError::NotAllowed(
                "Lock-Mode asks for more permits than this server allows",
            ));
        }
        if kind == LockKind::Shared && !self.allow_shared {
            return Err(LockError::NotAllowed(
                "shared lock holds are not allowed here",
            ));
        }
        let mut spec = LockSpec::new(key.as_str(), ttl)
            .max_wait(block)
            .scope(scope)
            .auto_release(auto_release)
            .kind(kind);
        if let Some(owner) = one(&LOCK_OWNER)? {
            spec = spec.owner(owner);
        }
        Ok(Some(spec))
    }
}

impl<B> LockRequest<B> for ClientLocks {
    type Specs = Option<LockSpec>;

    fn lock_request(&self, request: &Request<B>) -> Option<LockSpec> {
        match self.spec_for(request) {
            Ok(spec) => spec,
            // Refused where the layer uses it: 400 with the error's code.
            Err(e) => Some(LockSpec::refused(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_headers_without_a_key_are_refused_and_none_at_all_is_no_lock() {
        let req = |headers: &[(&str, &str)]| {
            let mut b = Request::post("/x");
            for (name, value) in headers {
                b = b.header(*name, *value);
            }
            b.body(()).unwrap()
        };
        let locks = ClientLocks::new();
        assert!(matches!(locks.spec_for(&req(&[])), Ok(None)));
        // The owner alone names a kept lock to other routes (the admin API).
        assert!(matches!(
            locks.spec_for(&req(&[("lock-owner", "o")])),
            Ok(None)
        ));
        for header in [
            "lock-ttl",
            "lock-block",
            "lock-scope",
            "lock-auto-release",
            "lock-mode",
        ] {
            let e = locks
                .spec_for(&req(&[(header, "5s"), ("lock-keys", "k")]))
                .unwrap_err();
            assert_eq!(e.code(), "LOCK_INVALID_HEADER", "{header}");
        }
    }

    #[test]
    fn a_server_may_refuse_shared_holds() {
        let req = Request::post("/x")
            .header("lock-key", "k")
            .header("lock-ttl", "5s")
            .header("lock-mode", "shared")
            .body(())
            .unwrap();
        let spec = ClientLocks::new().spec_for(&req).unwrap().unwrap();
        assert_eq!(spec.get_kind(), LockKind::Shared);
        let refused = ClientLocks::new().allow_shared(false).spec_for(&req);
        assert!(
            matches!(refused, Err(LockError::NotAllowed(_))),
            "{refused:?}"
        );
    }

    #[test]
    fn lock_mode_names_the_kind_within_the_servers_bound() {
        let req = |mode: Option<&str>| {
            let mut b = Request::post("/x")
                .header("lock-key", "k")
                .header("lock-ttl", "5s");
            if let Some(mode) = mode {
                b = b.header("lock-mode", mode);
            }
            b.body(()).unwrap()
        };
        let locks = ClientLocks::new().max_permits(4);
        let kind = |mode| locks.spec_for(&req(mode)).map(|s| s.unwrap().get_kind());
        assert_eq!(kind(None), Ok(LockKind::Exclusive));
        assert_eq!(kind(Some("shared")), Ok(LockKind::Shared));
        assert_eq!(kind(Some("permits=4")), Ok(LockKind::Permits(4)));
        assert!(matches!(
            kind(Some("permits=5")),
            Err(LockError::NotAllowed(_))
        ));
        assert!(matches!(kind(Some("read")), Err(LockError::InvalidKind(_))));
        assert!(matches!(
            kind(Some("permits=0")),
            Err(LockError::InvalidKind(_))
        ));
        let none = ClientLocks::new().max_permits(0);
        assert!(matches!(
            none.spec_for(&req(Some("permits=1"))),
            Err(LockError::NotAllowed(_))
        ));
    }

    #[test]
    fn the_key_rule_sees_the_key_that_is_locked() {
        let composed = "invoic\u{e9}-7";
        let req = |key: &str| {
            Request::post("/pay")
                .header("lock-key", key)
                .header("lock-ttl", "5s")
                .body(())
                .unwrap()
        };
        let only = ClientLocks::new().allow_keys(move |k: &str| k == composed);
        let spec = only.spec_for(&req("invoice%CC%81-7")).unwrap().unwrap();
        assert_eq!(spec.get_key(), composed);
        let refusing = ClientLocks::new().allow_keys(move |k: &str| k != composed);
        assert!(matches!(
            refusing.spec_for(&req("invoice%CC%81-7")),
            Err(LockError::NotAllowed(_))
        ));
        // A key that cannot be locked never reaches the rule.
        let never = ClientLocks::new().allow_keys(|_: &str| panic!("not a lock key"));
        for bad in ["", "a%0Ab"] {
            let e = never.spec_for(&req(bad)).unwrap_err();
            assert_eq!(e.code(), "LOCK_INVALID_KEY", "{bad:?}");
        }
    }
}
