//! Shared pieces: a probing backend wrapper, a controllable handler, the
//! lockers and layers the tests use, HTTP helpers, a loopback server.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::time::Duration;
use tower_lock::backend::Holder;

use axum::Router;
use axum::body::Body;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tower::ServiceExt;
use tower_lock::backend::{
    AcquireRequest, BoxFuture, ExtendRequest, FlightPublish, FlightResult, FlightStart, Lease,
};
use tower_lock::{
    LockBackend, LockError, LockKey, LockLayer, LockSpec, LockStatus, Scope, SharedBackend,
    path_params,
};

use super::harness::Harness;

// ---------------------------------------------------------------------------
// Probe: a backend wrapper that counts calls, reports acquisitions and can
// simulate an outage.

/// What the probe says when it plays an unreachable backend. Must never
/// reach a client.
pub const OUTAGE_DETAIL: &str = "connection refused by 10.9.8.7:6379 (pool exhausted)";

pub struct Probe {
    inner: SharedBackend,
    calls: AtomicUsize,
    acquires: watch::Sender<usize>,
    down: AtomicBool,
    /// While set, acquisitions reach the backend but their replies are lost:
    /// the caller gets `BackendUnavailable` as after a timeout.
    lose_acquire_replies: AtomicBool,
    /// While set, releases wait for `release_permits` before reaching the
    /// backend: a slow network round trip, under the test's control.
    hold_releases: AtomicBool,
    release_permits: Semaphore,
    releases_waiting: watch::Sender<usize>,
    /// `extend_many` calls, and the extensions they carried.
    batches: AtomicUsize,
    batched: AtomicUsize,
    /// The same for renewal batches (`extend_many`) and for acquire replies.
    renewals: Hold,
    acquire_replies: Hold,
    statuses: Hold,
    extend_replies: Hold,
    // Extensions answered without the backend, whatever their TTL (a
    // backend that does not check it).
    extend_blindly: AtomicBool,
    // Flight steps that reach the backend and then never answer (a lost
    // reply), and how many did.
    hang_flight_begins: AtomicBool,
    hang_flight_results: AtomicBool,
    lose_flight_begins: AtomicBool,
    flights_hung: watch::Sender<usize>,
}

/// Calls held in flight until the test lets them go.
struct Hold {
    on: AtomicBool,
    permits: Semaphore,
    waiting: watch::Sender<usize>,
    // Calls that went through (held or not) and returned.
    done: watch::Sender<usize>,
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            on: AtomicBool::new(false),
            permits: Semaphore::new(0),
            waiting: watch::Sender::new(0),
            done: watch::Sender::new(0),
        }
    }
}

impl Hold {
    async fn pass(&self) {
        if self.on.load(SeqCst) {
            self.waiting.send_modify(|n| *n += 1);
            let _permit = self.permits.acquire().await.expect("open");
        }
    }

    fn let_go(&self) {
        self.on.store(false, SeqCst);
        self.permits.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    async fn held(&self, n: usize) {
        let mut rx = self.waiting.subscribe();
        rx.wait_for(|held| *held >= n)
            .await
            .expect("the probe outlives its receivers");
    }

    async fn done(&self, n: usize) {
        let mut rx = self.done.subscribe();
        rx.wait_for(|done| *done >= n)
            .await
            .expect("the probe outlives its receivers");
    }
}

impl Probe {
    pub fn new(inner: &SharedBackend) -> Arc<Probe> {
        Arc::new(Probe {
            inner: inner.clone(),
            calls: AtomicUsize::new(0),
            acquires: watch::Sender::new(0),
            down: AtomicBool::new(false),
            lose_acquire_replies: AtomicBool::new(false),
            hold_releases: AtomicBool::new(false),
            release_permits: Semaphore::new(0),
            releases_waiting: watch::Sender::new(0),
            batches: AtomicUsize::new(0),
            batched: AtomicUsize::new(0),
            renewals: Hold::default(),
            acquire_replies: Hold::default(),
            statuses: Hold::default(),
            extend_replies: Hold::default(),
            extend_blindly: AtomicBool::new(false),
            hang_flight_begins: AtomicBool::new(false),
            hang_flight_results: AtomicBool::new(false),
            lose_flight_begins: AtomicBool::new(false),
            flights_hung: watch::Sender::new(0),
        })
    }

    /// From now on, renewal batches (`extend_many`) stay in flight, before
    /// reaching the backend, until [`Probe::let_renewals_go`].
    pub fn hold_renewals(&self) {
        self.renewals.on.store(true, SeqCst);
    }

    pub fn let_renewals_go(&self) {
        self.renewals.let_go();
    }

    /// Wait until `n` renewal batches are (or were) held.
    pub async fn renewals_held(&self, n: usize) {
        self.renewals.held(n).await;
    }

    /// Wait until `n` renewal batches have been answered by the backend.
    pub async fn renewals_done(&self, n: usize) {
        self.renewals.done(n).await;
    }

    /// From now on, acquisitions reach the backend but their replies stay
    /// in flight until [`Probe::let_acquire_replies_go`].
    pub fn hold_acquire_replies(&self) {
        self.acquire_replies.on.store(true, SeqCst);
    }

    pub fn let_acquire_replies_go(&self) {
        self.acquire_replies.let_go();
    }

    /// Wait until `n` acquire replies are (or were) held.
    pub async fn acquire_replies_held(&self, n: usize) {
        self.acquire_replies.held(n).await;
    }

    /// From now on, extensions (`extend`) reach the backend but their
    /// replies stay in flight until [`Probe::let_extend_replies_go`].
    pub fn hold_extend_replies(&self) {
        self.extend_replies.on.store(true, SeqCst);
    }

    pub fn let_extend_replies_go(&self) {
        self.extend_replies.let_go();
    }

    /// From now on, answer extensions at once, whatever their TTL, as a
    /// backend would that never checks it.
    pub fn extend_blindly(&self) {
        self.extend_blindly.store(true, SeqCst);
    }

    /// Wait until `n` extend replies are (or were) held.
    pub async fn extend_replies_held(&self, n: usize) {
        self.extend_replies.held(n).await;
    }

    /// From now on, status reads stay in flight, before reaching the
    /// backend, until [`Probe::let_statuses_go`].
    pub fn hold_statuses(&self) {
        self.statuses.on.store(true, SeqCst);
    }

    pub fn let_statuses_go(&self) {
        self.statuses.let_go();
    }

    /// Wait until `n` status reads are (or were) held.
    pub async fn statuses_held(&self, n: usize) {
        self.statuses.held(n).await;
    }

    /// From now on, `flight_begin` (`begins`) and `flight_result`
    /// (`results`) calls reach the backend, which acts on them, and then
    /// never answer.
    pub fn hang_flight_replies(&self, begins: bool, results: bool) {
        self.hang_flight_begins.store(begins, SeqCst);
        self.hang_flight_results.store(results, SeqCst);
    }

    /// Let `flight_begin` calls act on the backend but answer
    /// `BackendUnavailable` (a reply lost after the op timeout).
    pub fn lose_flight_begins(&self, lose: bool) {
        self.lose_flight_begins.store(lose, SeqCst);
    }

    /// Wait until `n` flight steps hang (see [`Probe::hang_flight_replies`]).
    pub async fn flight_replies_hung(&self, n: usize) {
        let mut rx = self.flights_hung.subscribe();
        rx.wait_for(|hung| *hung >= n)
            .await
            .expect("the probe outlives its receivers");
    }

    async fn maybe_hang(&self, hang: &AtomicBool) {
        if hang.load(SeqCst) {
            self.flights_hung.send_modify(|n| *n += 1);
            std::future::pending::<()>().await;
        }
    }

    /// This probe as a backend for layers and handles. Each call is a
    /// handle of its own (with its own watchdog).
    pub fn backend(self: &Arc<Self>) -> SharedBackend {
        SharedBackend::new(self.clone())
    }

    /// Every backend call so far, of any kind.
    pub fn calls(&self) -> usize {
        self.calls.load(SeqCst)
    }

    /// `extend_many` calls so far, and the extensions they carried.
    pub fn batches(&self) -> (usize, usize) {
        (self.batches.load(SeqCst), self.batched.load(SeqCst))
    }

    /// Make every call fail with `BackendUnavailable` (or stop doing so).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, SeqCst);
    }

    /// Let acquisitions land on the backend but answer `BackendUnavailable`,
    /// as when the reply comes after the op timeout (or stop doing so).
    pub fn lose_acquire_replies(&self, lose: bool) {
        self.lose_acquire_replies.store(lose, SeqCst);
    }

    /// Wait until `n` acquisitions have reached the backend. An in-memory
    /// acquisition that has to wait is queued by the time this returns (the
    /// count is bumped in the same poll that queues it).
    pub async fn acquires_started(&self, n: usize) {
        let mut rx = self.acquires.subscribe();
        rx.wait_for(|started| *started >= n)
            .await
            .expect("the probe outlives its receivers");
    }

    /// From now on, releases stay in flight until [`Probe::let_releases_go`].
    pub fn hold_releases(&self) {
        self.hold_releases.store(true, SeqCst);
    }

    /// Let every held and future release through.
    pub fn let_releases_go(&self) {
        self.hold_releases.store(false, SeqCst);
        self.release_permits.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// Wait until `n` releases are (or were) held in flight.
    pub async fn releases_held(&self, n: usize) {
        let mut rx = self.releases_waiting.subscribe();
        rx.wait_for(|held| *held >= n)
            .await
            .expect("the probe outlives its receivers");
    }

    fn enter(&self) -> Result<(), LockError> {
        self.calls.fetch_add(1, SeqCst);
        if self.down.load(SeqCst) {
            Err(LockError::BackendUnavailable(OUTAGE_DETAIL.into()))
        } else {
            Ok(())
        }
    }
}

impl LockBackend for Probe {
    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(async move {
            self.enter()?;
            self.acquires.send_modify(|n| *n += 1);
            let lease = self.inner.acquire(req).await;
            self.acquire_replies.pass().await;
            if self.lose_acquire_replies.load(SeqCst) {
                return Err(LockError::BackendUnavailable(OUTAGE_DETAIL.into()));
            }
            lease
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            self.enter()?;
            if self.hold_releases.load(SeqCst) {
                self.releases_waiting.send_modify(|n| *n += 1);
                let _permit = self.release_permits.acquire().await.expect("open");
            }
            self.inner.release(key, holder).await
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(async move {
            self.enter()?;
            if self.extend_blindly.load(SeqCst) {
                let now = std::time::SystemTime::now();
                return Ok(Lease::new(holder.fence().unwrap_or(0), now, now, ttl));
            }
            let extended = self.inner.extend(key, holder, ttl).await;
            self.extend_replies.pass().await;
            extended
        })
    }

    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(async move {
            self.enter()?;
            self.inner.claim(key, holder, attempt).await
        })
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            self.enter()?;
            self.inner.force_release(key).await
        })
    }

    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        Box::pin(async move {
            self.enter()?;
            self.statuses.pass().await;
            self.inner.status(key).await
        })
    }

    fn flight_begin<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<FlightStart, LockError>> {
        Box::pin(async move {
            self.enter()?;
            let started = self.inner.flight_begin(req).await;
            self.maybe_hang(&self.hang_flight_begins).await;
            if self.lose_flight_begins.load(SeqCst) {
                return Err(LockError::BackendUnavailable(OUTAGE_DETAIL.into()));
            }
            started
        })
    }

    fn flight_result<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<FlightResult>, LockError>> {
        Box::pin(async move {
            self.enter()?;
            let result = self.inner.flight_result(key).await;
            self.maybe_hang(&self.hang_flight_results).await;
            result
        })
    }

    fn flight_publish<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        publish: &'a FlightPublish,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            self.enter()?;
            self.inner.flight_publish(key, owner, publish).await
        })
    }

    fn held_by<'a>(
        &'a self,
        owner: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<tower_lock::backend::HeldBy>, LockError>> {
        Box::pin(async move {
            self.enter()?;
            self.inner.held_by(owner, limit).await
        })
    }

    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        self.calls.fetch_add(1, SeqCst);
        self.batches.fetch_add(1, SeqCst);
        self.batched.fetch_add(batch.len(), SeqCst);
        Box::pin(async move {
            self.renewals.pass().await;
            let results = self.inner.extend_many(batch).await;
            self.renewals.done.send_modify(|n| *n += 1);
            results
        })
    }
}

// ---------------------------------------------------------------------------
// Ctl: signals between a handler and its test.

/// Request header that makes [`gated`] (and [`Ctl::checkpoint`]) wait for
/// [`Ctl::open`].
pub const GATE: &str = "x-gate";

#[derive(Clone)]
pub struct Ctl(Arc<CtlInner>);

struct CtlInner {
    runs: AtomicUsize,
    entered: Semaphore,
    proceed: Semaphore,
    left: Semaphore,
}

impl Default for Ctl {
    fn default() -> Self {
        Ctl(Arc::new(CtlInner {
            runs: AtomicUsize::new(0),
            entered: Semaphore::new(0),
            proceed: Semaphore::new(0),
            left: Semaphore::new(0),
        }))
    }
}

impl Ctl {
    /// How many times a handler started.
    pub fn runs(&self) -> usize {
        self.0.runs.load(SeqCst)
    }

    /// Wait until one more handler run has started.
    pub async fn entered(&self) {
        self.0.entered.acquire().await.expect("open").forget();
    }

    /// Let `n` gated handler runs go on.
    pub fn open(&self, n: usize) {
        self.0.proceed.add_permits(n);
    }

    /// Wait until one more [`gated`] handler future has ended (returned or
    /// been dropped).
    pub async fn left(&self) {
        self.0.left.acquire().await.expect("open").forget();
    }

    /// In a handler: count the run, signal it, and wait for [`Ctl::open`]
    /// if the request carries [`GATE`].
    pub async fn checkpoint(&self, headers: &HeaderMap) {
        self.0.runs.fetch_add(1, SeqCst);
        self.0.entered.add_permits(1);
        if headers.contains_key(GATE) {
            self.0.proceed.acquire().await.expect("open").forget();
        }
    }
}

struct LeftGuard(Ctl);

impl Drop for LeftGuard {
    fn drop(&mut self) {
        self.0.0.left.add_permits(1);
    }
}

/// `POST` handler answering `done`: counts its runs, signals its start, waits
/// for [`Ctl::open`] if gated, signals its end even when dropped.
pub fn gated(ctl: &Ctl) -> MethodRouter {
    let ctl = ctl.clone();
    post(move |headers: HeaderMap| {
        let ctl = ctl.clone();
        async move {
            let _left = LeftGuard(ctl.clone());
            ctl.checkpoint(&headers).await;
            "done"
        }
    })
}

// ---------------------------------------------------------------------------
// Lockers and layers.

/// How a route locks.
#[derive(Debug, Clone, Copy)]
pub struct Cfg {
    pub ttl: Duration,
    pub wait: Duration,
    pub scope: Scope,
}

impl Cfg {
    pub fn global(ttl: Duration) -> Self {
        Cfg {
            ttl,
            wait: Duration::ZERO,
            scope: Scope::Global,
        }
    }

    pub fn route(ttl: Duration) -> Self {
        Cfg {
            scope: Scope::Route,
            ..Cfg::global(ttl)
        }
    }

    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

/// Request header overriding the key (raw bytes, so anything a client can
/// send reaches the validation).
pub const KEY: &str = "x-key";
/// Request header overriding the TTL, in milliseconds.
pub const TTL_MS: &str = "x-ttl-ms";

/// One spec per request: the key from [`KEY`] or the `{key}` path parameter
/// (none: no lock), TTL from [`TTL_MS`] or `cfg`.
pub fn locker(cfg: Cfg) -> impl Fn(&Request<Body>) -> Option<LockSpec> + Send + Sync + 'static {
    move |req: &Request<Body>| {
        let key = match req.headers().get(KEY) {
            Some(v) => String::from_utf8(v.as_bytes().to_vec()).ok()?,
            None => path_params(req).get("key")?.to_owned(),
        };
        let ttl = match req.headers().get(TTL_MS) {
            Some(v) => Duration::from_millis(v.to_str().ok()?.parse().ok()?),
            None => cfg.ttl,
        };
        Some(LockSpec::new(key, ttl).max_wait(cfg.wait).scope(cfg.scope))
    }
}

pub fn layer(
    backend: &SharedBackend,
    cfg: Cfg,
) -> LockLayer<impl Fn(&Request<Body>) -> Option<LockSpec> + Send + Sync + 'static> {
    LockLayer::new(backend.clone(), locker(cfg))
}

/// `/r/{key}`: the [`gated`] handler behind a lock layer.
pub fn app(backend: &SharedBackend, cfg: Cfg, ctl: &Ctl) -> Router {
    Router::new().route("/r/{key}", gated(ctl).layer(layer(backend, cfg)))
}

// ---------------------------------------------------------------------------
// Keys and backend shortcuts.

pub fn gkey(key: &str) -> LockKey {
    LockKey::global(key).expect("valid key")
}

pub fn areq(key: &LockKey, owner: &str, ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(key.clone(), owner, ttl, wait).expect("valid request")
}

pub async fn status_of(backend: &SharedBackend, key: &LockKey) -> Option<LockStatus> {
    backend.status(key).await.expect("status")
}

/// The lock was given back: at once for a backend that releases inline,
/// and in any case a waiting acquirer gets it (see [`assert_comes_free`]).
pub async fn assert_released(h: &Harness, key: &LockKey) {
    if h.releases_inline() {
        assert_eq!(status_of(&h.backend, key).await, None, "released inline");
    }
    assert_comes_free(h, key).await;
}

/// A waiting acquirer gets the lock: it is released (the acquirer is woken
/// by the release) long before a 30 s TTL could free it.
pub async fn assert_comes_free(h: &Harness, key: &LockKey) {
    let probe = areq(
        key,
        "release-probe",
        Duration::from_secs(30),
        Duration::from_secs(5),
    );
    h.backend
        .acquire(&probe)
        .await
        .expect("the lock must come free without waiting for its TTL");
    h.backend
        .release(key, Holder::owner_only("release-probe"))
        .await
        .expect("release the probe");
}

// ---------------------------------------------------------------------------
// HTTP.

pub fn post_req(uri: &str) -> Request<Body> {
    Request::post(uri).body(Body::empty()).expect("request")
}

/// A request that the [`gated`] handler holds until [`Ctl::open`].
pub fn gated_req(uri: &str) -> Request<Body> {
    with_header(post_req(uri), GATE, b"1")
}

pub fn with_header(mut req: Request<Body>, name: &'static str, value: &[u8]) -> Request<Body> {
    req.headers_mut()
        .insert(name, HeaderValue::from_bytes(value).expect("header value"));
    req
}

/// A response read to its end.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("JSON body ({e}): {}", self.text()))
    }

    pub fn retry_after(&self) -> Option<u64> {
        let value = self.headers.get(header::RETRY_AFTER)?;
        Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("Retry-After is not an integer: {value:?}")),
        )
    }

    /// A default rejection: `status`, `application/json`,
    /// `{"error":{"code":code,"message":<non-empty string>}}`.
    pub fn assert_rejection(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(
            self.headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
            Some(&b"application/json"[..])
        );
        let json = self.json();
        assert_eq!(json["error"]["code"], code, "{json}");
        let message = json["error"]["message"].as_str().expect("message string");
        assert!(!message.is_empty());
        let fields = json.as_object().expect("object").len();
        assert_eq!(fields, 1, "only `error` at the top level: {json}");
    }
}

pub async fn read(res: Response<Body>) -> Reply {
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Send `req` through `app` and read the whole response.
pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let res = app.clone().oneshot(req).await.expect("infallible");
    read(res).await
}

/// [`send`] in a task.
pub fn spawn_send(app: &Router, req: Request<Body>) -> JoinHandle<Reply> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, req).await })
}

/// A real HTTP/1.1 server on a loopback port, stopped on drop.
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(app: Router) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // No Nagle: small responses go out at once, as in production setups.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp: &mut TcpStream| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    Server { addr, task }
}

/// A hyper HTTP/1.1 client on ONE keep-alive connection.
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    conn: JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        let conn = tokio::spawn(async move {
            conn.await.expect("connection");
        });
        Client { sender, conn }
    }

    /// `POST path` on the connection, read to its end.
    pub async fn post(&mut self, path: &str) -> Reply {
        self.sender.ready().await.expect("connection still open");
        let req = Request::post(path)
            .header(header::HOST, "localhost")
            .body(Empty::new())
            .expect("request");
        let res = self.sender.send_request(req).await.expect("response");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }
}

// ---------------------------------------------------------------------------
// Streamed bodies (no length known up front, never "at end" until polled).

/// A body fed by a channel; ends when the sender is dropped.
pub struct ChannelBody(pub mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// A body of fixed chunks that is pending once before each frame, like a
/// body produced by real asynchronous work.
pub struct Chunks {
    left: VecDeque<Bytes>,
    ready: bool,
}

impl Chunks {
    pub fn new(chunks: &[&'static str]) -> Self {
        Chunks {
            left: chunks
                .iter()
                .map(|c| Bytes::from_static(c.as_bytes()))
                .collect(),
            ready: false,
        }
    }
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if !this.ready {
            this.ready = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.ready = false;
        Poll::Ready(this.left.pop_front().map(|c| Ok(Frame::data(c))))
    }
}
