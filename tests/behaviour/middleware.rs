//! Behaviour through axum and tower: what clients see, and that every way a
//! request can end gives its locks back.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;
use tower_lock::backend::Holder;

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_http::catch_panic::CatchPanicLayer;
use tower_lock::{JobSpec, LockError, LockKey, LockLayer, LockSpec, Locks, OwnedLock, path_params};

use super::harness::Harness;
use super::support::*;

const TTL: Duration = Duration::from_secs(30);

/// (1) A request for which the locker names no lock goes straight through.
pub async fn pass_through_without_spec(h: Harness) {
    let probe = Probe::new(&h.backend);
    let ctl = Ctl::default();
    let layer = LockLayer::new(probe.backend(), |_: &Request<Body>| None::<LockSpec>);
    let app = Router::new().route("/r/{key}", gated(&ctl).layer(layer));

    let reply = send(&app, post_req("/r/k")).await;

    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "done");
    assert_eq!(ctl.runs(), 1);
    assert_eq!(probe.calls(), 0, "no backend call without a spec");
}

/// (2) A busy lock without waiting: 429, `Retry-After` from the holder's TTL,
/// a JSON error without the key, and the handler not called.
pub async fn busy_lock_is_429_with_retry_after_and_json(h: Harness) {
    let ctl = Ctl::default();
    let app = app(&h.backend, Cfg::global(TTL), &ctl);
    let key = "secret-order-7f3a";
    let uri = format!("/r/{key}");
    let holder = spawn_send(&app, gated_req(&uri));
    ctl.entered().await;

    let reply = send(&app, post_req(&uri)).await;

    reply.assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    let retry_after = reply.retry_after().expect("Retry-After");
    assert!(
        (29..=30).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    assert!(
        !reply.text().contains(key),
        "the key leaked: {}",
        reply.text()
    );
    assert_eq!(ctl.runs(), 1, "the rejected request's handler must not run");

    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
}

/// (3) A waiter gets the lock when the holder releases within its max wait,
/// woken by the release itself (on virtual time: no time passes at all).
pub async fn max_wait_succeeds_when_holder_releases(h: Harness) {
    let probe = Probe::new(&h.backend);
    let ctl = Ctl::default();
    let app = app(&probe.backend(), Cfg::global(TTL).wait(h.units(10)), &ctl);
    let holder = spawn_send(&app, gated_req("/r/k"));
    ctl.entered().await;

    let start = Instant::now();
    let waiter = spawn_send(&app, post_req("/r/k"));
    probe.acquires_started(2).await;
    assert!(!waiter.is_finished(), "the waiter must wait for the holder");
    assert_eq!(ctl.runs(), 1);

    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    let reply = waiter.await.unwrap();

    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(ctl.runs(), 2);
    if h.is_paused() {
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the waiter must be woken by the release, not by a timer"
        );
    }
}

/// (4) A waiter that never gets the lock: 429 `LOCK_TIMEOUT` exactly when its
/// max wait ends.
pub async fn timeout_after_max_wait(h: Harness) {
    let ctl = Ctl::default();
    let max_wait = h.units(2);
    let app = app(&h.backend, Cfg::global(TTL).wait(max_wait), &ctl);
    let holder = spawn_send(&app, gated_req("/r/k"));
    ctl.entered().await;

    let start = Instant::now();
    let reply = send(&app, post_req("/r/k")).await;
    let elapsed = start.elapsed();

    reply.assert_rejection(429, "LOCK_TIMEOUT");
    let retry_after = reply.retry_after().expect("Retry-After");
    assert!((1..=30).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(ctl.runs(), 1);
    if h.is_paused() {
        assert_eq!(
            elapsed, max_wait,
            "the timeout comes when the max wait ends"
        );
    } else {
        assert!(
            elapsed >= max_wait,
            "gave up after {elapsed:?} < {max_wait:?}"
        );
    }

    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
}

/// (5) 50 concurrent requests on one key (multi-thread runtime): no lost
/// update, never two holders.
pub async fn concurrent_requests_are_mutually_exclusive(h: Harness) {
    #[derive(Default)]
    struct Shared {
        counter: AtomicU64,
        active: AtomicUsize,
        max_active: AtomicUsize,
    }
    let shared = Arc::new(Shared::default());
    let handler = {
        let shared = shared.clone();
        post(move || {
            let shared = shared.clone();
            async move {
                let now = shared.active.fetch_add(1, SeqCst) + 1;
                shared.max_active.fetch_max(now, SeqCst);
                let read = shared.counter.load(SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                shared.counter.store(read + 1, SeqCst);
                shared.active.fetch_sub(1, SeqCst);
                "ok"
            }
        })
    };
    let cfg = Cfg::global(TTL).wait(Duration::from_secs(60));
    let app = Router::new().route("/c/{key}", handler.layer(layer(&h.backend, cfg)));

    let requests: Vec<_> = (0..50)
        .map(|_| spawn_send(&app, post_req("/c/counter")))
        .collect();
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }

    assert_eq!(shared.counter.load(SeqCst), 50, "lost updates");
    assert_eq!(shared.max_active.load(SeqCst), 1, "two holders at once");
    assert_eq!(status_of(&h.backend, &gkey("counter")).await, None);
}

/// A response a server sends no body with (to a HEAD request; a 204, a
/// 304) is released before it is returned, whatever body the handler
/// attached: hyper never reads that body, and dropped unread it released
/// from a task of its own, after the client had the response (its retry
/// could meet a 429).
pub async fn a_response_without_a_body_is_released_before_it_is_returned(h: Harness) {
    let (senders_tx, mut senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let streaming = move |status: StatusCode| {
        let senders_tx = senders_tx.clone();
        move || async move {
            let (tx, rx) = mpsc::channel(4);
            senders_tx.send(tx).expect("test listening");
            (status, Body::new(ChannelBody(rx)))
        }
    };
    let lock = layer(&h.backend, Cfg::global(TTL));
    let app = Router::new()
        .route(
            "/h/{key}",
            axum::routing::get(streaming(StatusCode::OK)).layer(lock.clone()),
        )
        .route(
            "/n/{key}",
            post(streaming(StatusCode::NO_CONTENT)).layer(lock.clone()),
        )
        .route(
            "/m/{key}",
            post(streaming(StatusCode::NOT_MODIFIED)).layer(lock),
        );
    let head = |uri: &str| Request::head(uri).body(Body::empty()).unwrap();
    for (req, key) in [
        (head("/h/a"), "a"),
        (post_req("/n/b"), "b"),
        (post_req("/m/c"), "c"),
    ] {
        let res = app.clone().oneshot(req).await.unwrap();
        // (Its body, never to be read, still open.)
        let _frames = senders.recv().await.expect("handler ran");
        assert_eq!(
            status_of(&h.backend, &gkey(key)).await,
            None,
            "{}: held after the response was returned",
            res.status()
        );
    }
}

/// A lock taken to be kept after the response (auto-release off) once the
/// handler has answered (while its body streams) is refused: the response's
/// head, with its `Lock-Owner` headers, left already, so its owner token
/// would reach nobody, and it stayed held by nobody until its TTL.
pub async fn a_lock_kept_once_the_handler_answered_is_refused(h: Harness) {
    let (senders_tx, mut senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let (locks_tx, mut locks_rx) = mpsc::unbounded_channel::<Locks>();
    let streaming = post(move |locks: Locks| {
        let (senders_tx, locks_tx) = (senders_tx.clone(), locks_tx.clone());
        async move {
            let (tx, rx) = mpsc::channel(4);
            senders_tx.send(tx).expect("test listening");
            locks_tx.send(locks).expect("test listening");
            Body::new(ChannelBody(rx))
        }
    });
    let app = Router::new().route(
        "/s/{key}",
        streaming.layer(layer(&h.backend, Cfg::global(TTL))),
    );
    let res = app.oneshot(post_req("/s/report")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (frames, locks) = (
        senders.recv().await.unwrap(),
        locks_rx.recv().await.unwrap(),
    );
    // The head left; the body streams.
    let kept = locks
        .acquire(LockSpec::global("kept", TTL).auto_release(false))
        .await;
    assert!(
        matches!(kept, Err(LockError::AlreadyReleased)),
        "kept after its head left: {kept:?}"
    );
    // (Given back, at once or from a task of its own.)
    assert_released(&h, &gkey("kept")).await;
    // One released with the response is still taken.
    let along = locks.acquire(LockSpec::global("along", TTL)).await.unwrap();
    assert_eq!(
        status_of(&h.backend, &gkey("along")).await.unwrap().fence,
        along.fence()
    );
    drop((frames, locks));
    let mut body = res.into_body();
    assert!(body.frame().await.is_none(), "the body ends");
    assert_released(&h, &gkey("along")).await;
    assert_released(&h, &gkey("report")).await;
}

/// (6) A streamed body keeps the lock until its last frame is consumed.
pub async fn lock_held_while_body_streams(h: Harness) {
    let ctl = Ctl::default();
    let (senders_tx, mut senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let streaming = post(move || {
        let senders_tx = senders_tx.clone();
        async move {
            let (tx, rx) = mpsc::channel(4);
            senders_tx.send(tx).expect("test listening");
            Body::new(ChannelBody(rx))
        }
    });
    let lock = layer(&h.backend, Cfg::global(TTL));
    let app = Router::new()
        .route("/s/{key}", streaming.layer(lock.clone()))
        .route("/r/{key}", gated(&ctl).layer(lock));
    let key = gkey("report");

    let res = app.clone().oneshot(post_req("/s/report")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let frames = senders.recv().await.expect("handler ran");
    let mut body = res.into_body();

    assert!(
        status_of(&h.backend, &key).await.is_some(),
        "held before the body"
    );
    send(&app, post_req("/r/report"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");

    pass_chunk(&frames, &mut body, "first").await;
    assert!(status_of(&h.backend, &key).await.is_some(), "held mid-body");
    send(&app, post_req("/r/report"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    assert_eq!(ctl.runs(), 0);

    drop(frames);
    assert!(body.frame().await.is_none(), "the body ends");

    assert_eq!(
        status_of(&h.backend, &key).await,
        None,
        "free once consumed"
    );
    assert_eq!(
        send(&app, post_req("/r/report")).await.status,
        StatusCode::OK
    );
    assert_eq!(ctl.runs(), 1);
}

/// Send `chunk` through a streamed body's channel and read it back as the
/// body's next frame.
async fn pass_chunk<B>(frames: &mpsc::Sender<Bytes>, body: &mut B, chunk: &'static str)
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    frames
        .send(Bytes::from_static(chunk.as_bytes()))
        .await
        .unwrap();
    let frame = body.frame().await.expect("a frame").expect("no error");
    assert_eq!(frame.into_data().expect("data"), chunk);
}

/// A route whose streamed body is sent through a channel, with `headers`
/// on its response, and `size` as its body's exact size if given; the
/// channel's sender reaches the test through the returned receiver.
fn channel_route(
    h: &Harness,
    headers: Vec<(http::HeaderName, &'static str)>,
    size: Option<u64>,
) -> (Router, mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>) {
    let (senders_tx, senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let handler = post(move || {
        let (senders_tx, headers) = (senders_tx.clone(), headers.clone());
        async move {
            let (tx, rx) = mpsc::channel(4);
            senders_tx.send(tx).expect("test listening");
            let mut res = Response::new(Body::new(SizedChannel(ChannelBody(rx), size)));
            for (name, value) in headers {
                res.headers_mut()
                    .insert(name, http::HeaderValue::from_static(value));
            }
            res
        }
    });
    let app = Router::new().route(
        "/s/{key}",
        handler.layer(layer(&h.backend, Cfg::global(TTL))),
    );
    (app, senders)
}

/// A channel's body that reports an exact size, if given.
struct SizedChannel(ChannelBody, Option<u64>);

impl http_body::Body for SizedChannel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.0).poll_frame(cx)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.1
            .map(http_body::SizeHint::with_exact)
            .unwrap_or_default()
    }
}

/// (6b) A body sent chunked (its response names a `Transfer-Encoding`) is
/// read to its end, whatever `Content-Length` it also declares: the lock
/// stays held past that length, to the body's end.
pub async fn a_chunked_body_keeps_its_lock_past_a_declared_length(h: Harness) {
    let (app, mut senders) = channel_route(
        &h,
        vec![
            (http::header::TRANSFER_ENCODING, "chunked"),
            (http::header::CONTENT_LENGTH, "5"),
        ],
        None,
    );
    let key = gkey("chunked");
    let res = app.oneshot(post_req("/s/chunked")).await.unwrap();
    let frames = senders.recv().await.expect("handler ran");
    let mut body = res.into_body();

    // Five bytes: the declared length, reached.
    pass_chunk(&frames, &mut body, "first").await;
    assert!(
        status_of(&h.backend, &key).await.is_some(),
        "released at the declared length of a chunked body"
    );
    pass_chunk(&frames, &mut body, "more").await;
    assert!(status_of(&h.backend, &key).await.is_some(), "held mid-body");

    drop(frames);
    assert!(body.frame().await.is_none(), "the body ends");
    assert_eq!(status_of(&h.backend, &key).await, None, "free at its end");
}

/// (6c) A body of a known size is framed by that size on HTTP/1 (hyper's
/// framing), not by a `Content-Length` header that says otherwise: its lock
/// goes with the frame that completes the size, which waits for the
/// release (the server reads no further and drops the body unpolled).
pub async fn a_body_of_known_size_is_released_at_that_size(h: Harness) {
    let (app, mut senders) = channel_route(&h, vec![(http::header::CONTENT_LENGTH, "10")], Some(5));
    let key = gkey("sized");
    let res = app.oneshot(post_req("/s/sized")).await.unwrap();
    let frames = senders.recv().await.expect("handler ran");
    let mut body = res.into_body();
    assert!(
        status_of(&h.backend, &key).await.is_some(),
        "held before the body"
    );

    pass_chunk(&frames, &mut body, "first").await;
    assert_eq!(
        status_of(&h.backend, &key).await,
        None,
        "still held once the body's whole size was handed on"
    );
}

/// A body that is complete at once (a string) is read ahead: the lock is
/// free when the response is handed on, before anyone reads the body, and
/// the body and its length are intact.
pub async fn ready_body_is_released_before_the_response_is_returned(h: Harness) {
    let text = "x".repeat(10_000);
    let handler = post({
        let text = text.clone();
        move || async move { text }
    });
    let app = Router::new().route(
        "/s/{key}",
        handler.layer(layer(&h.backend, Cfg::global(TTL))),
    );
    let res = app.oneshot(post_req("/s/ready")).await.unwrap();
    assert_eq!(
        status_of(&h.backend, &gkey("ready")).await,
        None,
        "still held when the response was handed on"
    );
    assert_eq!(
        http_body::Body::size_hint(res.body()).exact(),
        Some(text.len() as u64)
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, text.as_bytes());
}

/// (7a) The response future dropped mid-handler (client gone) releases.
pub async fn release_on_dropped_response_future(h: Harness) {
    let ctl = Ctl::default();
    let app = app(&h.backend, Cfg::global(TTL), &ctl);
    let key = gkey("k");
    let request = tokio::spawn(app.clone().oneshot(gated_req("/r/k")));
    ctl.entered().await;
    assert!(status_of(&h.backend, &key).await.is_some());

    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    ctl.left().await;

    assert_released(&h, &key).await;
    assert_eq!(send(&app, post_req("/r/k")).await.status, StatusCode::OK);
}

/// (7c) A body dropped mid-stream (client gone) releases the request's locks
/// even while a task the handler spawned still keeps a copy of its `Locks`
/// (so the registry itself lives on): the response's guard releases them.
pub async fn release_on_dropped_body_while_locks_live_on(h: Harness) {
    let (keep_tx, keep_rx) = oneshot::channel::<Locks>();
    let keep_tx = Arc::new(std::sync::Mutex::new(Some(keep_tx)));
    let (frames_tx, mut frames_rx) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let streaming = post(move |locks: Locks| {
        let (keep_tx, frames_tx) = (keep_tx.clone(), frames_tx.clone());
        async move {
            // A background task holds on to the request's locks.
            let _ = keep_tx.lock().unwrap().take().unwrap().send(locks);
            let (tx, rx) = mpsc::channel(4);
            frames_tx.send(tx).expect("test listening");
            Body::new(ChannelBody(rx))
        }
    });
    let app = Router::new().route(
        "/s/{key}",
        streaming.layer(layer(&h.backend, Cfg::global(TTL))),
    );
    let key = gkey("k");
    let res = app.oneshot(post_req("/s/k")).await.unwrap();
    let _frames = frames_rx.recv().await.expect("handler ran");
    let kept = keep_rx.await.unwrap();
    assert!(
        status_of(&h.backend, &key).await.is_some(),
        "held while streaming"
    );

    drop(res);
    assert_released(&h, &key).await;
    assert_eq!(kept.release("k").await, Err(LockError::AlreadyReleased));
}

/// (7b) Over a real connection: a client that sends its request and closes
/// the connection while the handler runs gets its lock released.
pub async fn release_on_tcp_client_disconnect(h: Harness) {
    let ctl = Ctl::default();
    let app = app(&h.backend, Cfg::global(TTL), &ctl);
    let server = serve(app.clone()).await;
    let key = gkey("k");

    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(
            b"POST /r/k HTTP/1.1\r\nhost: localhost\r\nx-gate: 1\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
    ctl.entered().await;
    assert!(status_of(&h.backend, &key).await.is_some());

    drop(stream);
    tokio::time::timeout(Duration::from_secs(10), ctl.left())
        .await
        .expect("the server must drop the handler once the client is gone");

    assert_released(&h, &key).await;
    let mut client = Client::connect(server.addr).await;
    assert_eq!(client.post("/r/k").await.status, StatusCode::OK);
}

async fn panicky(headers: HeaderMap) -> &'static str {
    if !headers.contains_key("x-calm") {
        panic!("handler panics on purpose (expected in this test)");
    }
    "calm"
}

/// (7c) A waiter whose client leaves while it is queued is skipped: the lock
/// does not end up with nobody when the holder releases.
pub async fn dropped_waiter_does_not_keep_the_lock(h: Harness) {
    let probe = Probe::new(&h.backend);
    let ctl = Ctl::default();
    let app = app(
        &probe.backend(),
        Cfg::global(TTL).wait(Duration::from_secs(10)),
        &ctl,
    );
    let holder = spawn_send(&app, gated_req("/r/k"));
    ctl.entered().await;
    let waiter = tokio::spawn(app.clone().oneshot(post_req("/r/k")));
    probe.acquires_started(2).await;

    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);

    assert_released(&h, &gkey("k")).await;
    assert_eq!(ctl.runs(), 1);
}

/// (7d) The client leaves while the release at the end of its (body-less)
/// response is still in flight: the release still completes.
pub async fn release_completes_when_client_leaves_mid_release(h: Harness) {
    let probe = Probe::new(&h.backend);
    let app = Router::new().route(
        "/e/{key}",
        post(|| async {}).layer(layer(&probe.backend(), Cfg::global(TTL))),
    );
    probe.hold_releases();
    let request = tokio::spawn(app.clone().oneshot(post_req("/e/k")));
    probe.releases_held(1).await;
    assert!(!request.is_finished(), "the response waits for the release");

    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    probe.let_releases_go();

    assert_comes_free(&h, &gkey("k")).await;
}

/// (7e) The body is dropped (client gone) while the release started by its
/// end is in flight: the release still completes.
pub async fn release_completes_when_body_dropped_mid_release(h: Harness) {
    let probe = Probe::new(&h.backend);
    let (senders_tx, mut senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let streaming = post(move || {
        let senders_tx = senders_tx.clone();
        async move {
            let (tx, rx) = mpsc::channel(4);
            senders_tx.send(tx).expect("test listening");
            Body::new(ChannelBody(rx))
        }
    });
    let app = Router::new().route(
        "/s/{key}",
        streaming.layer(layer(&probe.backend(), Cfg::global(TTL))),
    );
    let res = app.oneshot(post_req("/s/k")).await.unwrap();
    drop(senders.recv().await.expect("handler ran"));
    let mut body = res.into_body();

    probe.hold_releases();
    tokio::select! {
        biased;
        frame = body.frame() => panic!("the end must wait for the release: {frame:?}"),
        () = probe.releases_held(1) => {}
    }
    drop(body);
    probe.let_releases_go();

    assert_comes_free(&h, &gkey("k")).await;
}

/// A kept lock (`auto_release(false)`) whose handler never answered is
/// released all the same: its owner token reaches the client only with the
/// response, so nobody could release it before its TTL. The handler's
/// client went away mid-handler; it panicked under a `CatchPanicLayer`
/// outside the lock layer (which drops ours and answers its own 500); the
/// inner service failed. A handler that answers keeps it.
pub async fn a_kept_lock_whose_handler_never_answered_is_released(h: Harness) {
    let key = gkey("kept");
    let kept = |_: &Request<Body>| Some(LockSpec::global("kept", TTL).auto_release(false));

    // The client goes away while the handler runs.
    let ctl = Ctl::default();
    let app = Router::new().route(
        "/run",
        gated(&ctl).layer(LockLayer::new(h.backend.clone(), kept)),
    );
    let call = tokio::spawn(app.clone().oneshot(gated_req("/run")));
    ctl.entered().await;
    assert!(
        status_of(&h.backend, &key).await.is_some(),
        "held while it runs"
    );
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_released(&h, &key).await;

    // A panic caught outside the lock layer.
    let outside = Router::new().route(
        "/p/{key}",
        post(panicky)
            .layer::<_, Infallible>(LockLayer::new(h.backend.clone(), kept))
            .layer::<_, Infallible>(CatchPanicLayer::new()),
    );
    let reply = send(&outside, post_req("/p/k")).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_released(&h, &key).await;

    // The inner service fails.
    let failing = tower::service_fn(|_: Request<Body>| async {
        Err::<Response<Body>, std::io::Error>(std::io::Error::other("inner failure"))
    });
    let mut svc = ServiceBuilder::new()
        .layer(LockLayer::new(h.backend.clone(), kept))
        .service(failing);
    let failed = svc.ready().await.unwrap().call(post_req("/run")).await;
    assert!(failed.is_err());
    assert_released(&h, &key).await;

    // Answered: the lock stays with the client that has its owner token.
    let calm = with_header(post_req("/p/k"), "x-calm", b"1");
    let reply = send(&outside, calm).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        status_of(&h.backend, &key).await.is_some(),
        "an answered kept lock is kept"
    );
    assert!(h.backend.force_release(&key).await.unwrap());
}

/// The same when the handler answered but its response had not left the
/// layer yet (the release of the request's other locks under way) when the
/// client went away: the kept lock goes too, its owner token never sent.
pub async fn a_kept_lock_whose_response_never_left_is_released(h: Harness) {
    let probe = Probe::new(&h.backend);
    let layer = LockLayer::new(probe.backend(), |_: &Request<Body>| {
        [
            LockSpec::global("auto", TTL),
            LockSpec::global("kept", TTL).auto_release(false),
        ]
    });
    let app = Router::new().route("/run", post(|| async {}).layer(layer));
    probe.hold_releases();
    let call = tokio::spawn(app.oneshot(post_req("/run")));
    probe.releases_held(1).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    probe.let_releases_go();
    assert_comes_free(&h, &gkey("auto")).await;
    assert_comes_free(&h, &gkey("kept")).await;
}

/// (8a) A handler panic caught by `CatchPanicLayer` inside the lock layer:
/// 500, then the lock is free.
pub async fn release_on_panic_with_catch_panic(h: Harness) {
    let app = Router::new().route(
        "/p/{key}",
        post(panicky)
            .layer::<_, Infallible>(CatchPanicLayer::new())
            .layer(layer(&h.backend, Cfg::global(TTL))),
    );

    let reply = send(&app, post_req("/p/k")).await;

    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(status_of(&h.backend, &gkey("k")).await, None);
    let calm = with_header(post_req("/p/k"), "x-calm", b"1");
    assert_eq!(send(&app, calm).await.status, StatusCode::OK);
}

/// (8b) Without catch-panic the panic unwinds through the service future (in
/// a spawned task); the lock is freed all the same.
pub async fn release_on_panic_unwinding(h: Harness) {
    let app = Router::new().route(
        "/p/{key}",
        post(panicky).layer(layer(&h.backend, Cfg::global(TTL))),
    );

    let err = tokio::spawn(app.clone().oneshot(post_req("/p/k")))
        .await
        .unwrap_err();

    assert!(err.is_panic());
    assert_released(&h, &gkey("k")).await;
    let calm = with_header(post_req("/p/k"), "x-calm", b"1");
    assert_eq!(send(&app, calm).await.status, StatusCode::OK);
}

/// (9) An inner service error (plain tower service) releases the lock
/// before the error is handed on.
pub async fn release_on_inner_service_error(h: Harness) {
    let key = gkey("job");
    let held_during_call = Arc::new(AtomicUsize::new(0));
    let inner = {
        let backend = h.backend.clone();
        let key = key.clone();
        let held = held_during_call.clone();
        tower::service_fn(move |_req: Request<Body>| {
            let backend = backend.clone();
            let key = key.clone();
            let held = held.clone();
            async move {
                if backend.status(&key).await.unwrap().is_some() {
                    held.fetch_add(1, SeqCst);
                }
                Err::<Response<Body>, _>(std::io::Error::other("inner failure"))
            }
        })
    };
    let mut svc = ServiceBuilder::new()
        .layer(layer(&h.backend, Cfg::global(TTL)))
        .service(inner);

    let req = with_header(post_req("/jobs"), KEY, b"job");
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();

    assert_eq!(err.to_string(), "inner failure");
    assert_eq!(held_during_call.load(SeqCst), 1, "locked during the call");
    assert_eq!(
        status_of(&h.backend, &key).await,
        None,
        "free after the Err"
    );
}

type Handoff = (
    oneshot::Sender<()>,
    oneshot::Receiver<Result<(), LockError>>,
);

/// `/j/{key}`: cancels auto-release and hands the lock to a spawned job that
/// waits for the test's signal, then releases it (or drops it with `x-drop`).
fn handoff_app(h: &Harness, ctl: &Ctl) -> (Router, mpsc::UnboundedReceiver<Handoff>) {
    let (jobs_tx, jobs) = mpsc::unbounded_channel::<Handoff>();
    let handler = post(
        move |Path(key): Path<String>, headers: HeaderMap, locks: Locks| {
            let jobs_tx = jobs_tx.clone();
            async move {
                let owned: OwnedLock = locks.cancel_auto_release(&key).expect("the layer's lock");
                let drop_it = headers.contains_key("x-drop");
                let (go_tx, go) = oneshot::channel::<()>();
                let (done, done_rx) = oneshot::channel();
                jobs_tx.send((go_tx, done_rx)).expect("test listening");
                tokio::spawn(async move {
                    let _ = go.await;
                    let result = if drop_it {
                        drop(owned);
                        Ok(())
                    } else {
                        owned.release().await
                    };
                    let _ = done.send(result);
                });
                "accepted"
            }
        },
    );
    let lock = layer(&h.backend, Cfg::global(TTL));
    let app = Router::new()
        .route("/j/{key}", handler.layer(lock.clone()))
        .route("/r/{key}", gated(ctl).layer(lock));
    (app, jobs)
}

/// (10a) `cancel_auto_release`: the lock outlives the response until the
/// job releases it.
pub async fn cancel_auto_release_hands_lock_to_job(h: Harness) {
    let ctl = Ctl::default();
    let (app, mut jobs) = handoff_app(&h, &ctl);

    let reply = send(&app, post_req("/j/report")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "accepted");
    let (go, done) = jobs.recv().await.expect("job started");

    assert!(status_of(&h.backend, &gkey("report")).await.is_some());
    send(&app, post_req("/r/report"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    assert_eq!(ctl.runs(), 0);

    go.send(()).unwrap();
    assert_eq!(done.await.unwrap(), Ok(()), "the job releases its lock");

    assert_eq!(status_of(&h.backend, &gkey("report")).await, None);
    assert_eq!(
        send(&app, post_req("/r/report")).await.status,
        StatusCode::OK
    );
}

/// (10b) Dropping the job's `OwnedLock` releases it.
pub async fn dropping_owned_lock_releases(h: Harness) {
    let ctl = Ctl::default();
    let (app, mut jobs) = handoff_app(&h, &ctl);

    let req = with_header(post_req("/j/report"), "x-drop", b"1");
    assert_eq!(send(&app, req).await.status, StatusCode::OK);
    let (go, done) = jobs.recv().await.expect("job started");
    send(&app, post_req("/r/report"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");

    go.send(()).unwrap();
    done.await.unwrap().unwrap();

    assert_released(&h, &gkey("report")).await;
    assert_eq!(
        send(&app, post_req("/r/report")).await.status,
        StatusCode::OK
    );
}

/// `/empty`, `/fixed` and `/stream` (each `/{key}`), locked with no wait.
fn body_kinds_app(h: &Harness) -> Router {
    let lock = layer(&h.backend, Cfg::route(TTL));
    Router::new()
        .route("/empty/{key}", post(|| async {}).layer(lock.clone()))
        .route(
            "/fixed/{key}",
            post(|| async { "fixed body" }).layer(lock.clone()),
        )
        .route(
            "/stream/{key}",
            post(|| async { Body::new(Chunks::new(&["str", "eam", "ed"])) }).layer(lock.clone()),
        )
        // A stream of a declared length (as a file is served): a server
        // reads it up to that length and drops it unpolled.
        .route(
            "/sized/{key}",
            post(|| async {
                (
                    [(http::header::CONTENT_LENGTH, "8")],
                    Body::new(Chunks::new(&["str", "eam", "ed"])),
                )
            })
            .layer(lock),
        )
}

/// (URI, route pattern, body).
const BODY_KINDS: [(&str, &str, &str); 4] = [
    ("/empty/k", "/empty/{key}", ""),
    ("/fixed/k", "/fixed/{key}", "fixed body"),
    ("/stream/k", "/stream/{key}", "streamed"),
    ("/sized/k", "/sized/{key}", "streamed"),
];

/// (11a) Back-to-back requests, each read to its end before the next: never
/// a 429 — the lock is free as soon as the client has the last frame (before
/// it even drops the body).
pub async fn sequential_requests_never_429(h: Harness) {
    let app = body_kinds_app(&h);
    for (uri, route, expected) in BODY_KINDS {
        let key = LockKey::route(route, "k").unwrap();
        for i in 0..200 {
            let res = app.clone().oneshot(post_req(uri)).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{uri} #{i}");
            let mut body = res.into_body();
            let bytes = (&mut body).collect().await.unwrap().to_bytes();
            assert_eq!(bytes, expected, "{uri} #{i}");
            assert_eq!(status_of(&h.backend, &key).await, None, "{uri} #{i}");
            drop(body);
        }
    }
}

/// (11b) The same over a real loopback server and one keep-alive hyper
/// connection: once the client has a response, its lock is free (also for
/// a body of a declared length, which the server stops reading at that
/// length: its last frame waits for the release, as any body's).
pub async fn sequential_requests_over_keep_alive_never_429(h: Harness) {
    let server = serve(body_kinds_app(&h)).await;
    let mut client = Client::connect(server.addr).await;
    for (uri, route, expected) in BODY_KINDS {
        let key = LockKey::route(route, "k").unwrap();
        for i in 0..200 {
            let reply = client.post(uri).await;
            assert_eq!(reply.status, StatusCode::OK, "{uri} #{i}: {}", reply.text());
            assert_eq!(reply.text(), expected);
            assert_eq!(status_of(&h.backend, &key).await, None, "{uri} #{i}");
        }
    }
}

fn two_routes(h: &Harness, cfg: Cfg, ctl: &Ctl) -> Router {
    let lock = layer(&h.backend, cfg);
    Router::new()
        .route("/a/{key}", gated(ctl).layer(lock.clone()))
        .route("/b/{key}", gated(ctl).layer(lock))
}

/// (12a) `Scope::Route`: the same key on two routes names two locks.
pub async fn route_scope_isolates_routes(h: Harness) {
    let ctl = Ctl::default();
    let app = two_routes(&h, Cfg::route(TTL), &ctl);
    let holder = spawn_send(&app, gated_req("/a/k"));
    ctl.entered().await;

    assert_eq!(send(&app, post_req("/b/k")).await.status, StatusCode::OK);
    send(&app, post_req("/a/k"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    let route_key = LockKey::route("/a/{key}", "k").unwrap();
    assert!(status_of(&h.backend, &route_key).await.is_some());
    assert_eq!(status_of(&h.backend, &gkey("k")).await, None);

    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
}

/// (12b) `Scope::Global`: the same key on two routes is one lock.
pub async fn global_scope_is_shared_across_routes(h: Harness) {
    let ctl = Ctl::default();
    let app = two_routes(&h, Cfg::global(TTL), &ctl);
    let holder = spawn_send(&app, gated_req("/a/k"));
    ctl.entered().await;

    send(&app, post_req("/b/k"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    assert_eq!(ctl.runs(), 1);

    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    assert_eq!(send(&app, post_req("/b/k")).await.status, StatusCode::OK);
}

/// (13) Bad keys and TTLs from a request: 400 with a code, handler not run,
/// backend not called.
pub async fn invalid_key_or_ttl_is_400(h: Harness) {
    let probe = Probe::new(&h.backend);
    let ctl = Ctl::default();
    let app = app(&probe.backend(), Cfg::route(TTL), &ctl);
    let long = "a".repeat(513);
    let bad_keys: [(Request<Body>, &str); 5] = [
        (with_header(post_req("/r/x"), KEY, b""), "empty"),
        (
            with_header(post_req("/r/x"), KEY, long.as_bytes()),
            "513 bytes",
        ),
        (with_header(post_req("/r/x"), KEY, b"a\tb"), "tab"),
        (post_req("/r/a%01b"), "U+0001 in the path"),
        (post_req("/r/a%7Fb"), "DEL in the path"),
    ];
    for (req, what) in bad_keys {
        let reply = send(&app, req).await;
        assert_eq!(reply.status, 400, "{what}: {}", reply.text());
        reply.assert_rejection(400, "LOCK_INVALID_KEY");
        assert_eq!(reply.retry_after(), None, "{what}");
        assert!(!reply.text().contains(&long), "{what}: the key is echoed");
    }
    let zero_ttl = with_header(post_req("/r/x"), TTL_MS, b"0");
    let reply = send(&app, zero_ttl).await;
    reply.assert_rejection(400, "LOCK_INVALID_TTL");

    assert_eq!(ctl.runs(), 0, "no handler runs for a bad spec");
    assert_eq!(probe.calls(), 0, "a bad spec never reaches the backend");

    let longest = with_header(post_req("/r/x"), KEY, "a".repeat(512).as_bytes());
    assert_eq!(send(&app, longest).await.status, StatusCode::OK);
}

/// (18) Backend unreachable: 503 `LOCK_BACKEND_UNAVAILABLE`, no details, the
/// handler not run; fine again once the backend is back.
pub async fn backend_failure_is_503(h: Harness) {
    let probe = Probe::new(&h.backend);
    let ctl = Ctl::default();
    let app = app(&probe.backend(), Cfg::global(TTL), &ctl);

    probe.set_down(true);
    let reply = send(&app, post_req("/r/k")).await;

    reply.assert_rejection(503, "LOCK_BACKEND_UNAVAILABLE");
    assert!(reply.retry_after().expect("Retry-After") >= 1);
    assert!(!reply.text().contains("10.9.8.7"), "{}", reply.text());
    assert_eq!(ctl.runs(), 0, "never run a handler unlocked");

    probe.set_down(false);
    assert_eq!(send(&app, post_req("/r/k")).await.status, StatusCode::OK);
    assert_eq!(ctl.runs(), 1);
}

/// `/m/{x}/{y}` locks both keys (global, waiting up to `wait`), handler gated;
/// `/r/{key}` locks one key without waiting.
fn multi_app(backend: &tower_lock::SharedBackend, wait: Duration, ctl: &Ctl) -> Router {
    let both = LockLayer::new(backend.clone(), move |req: &Request<Body>| {
        let params = path_params(req);
        ["x", "y"]
            .iter()
            .filter_map(|name| params.get(name))
            .map(|key| LockSpec::global(key, TTL).max_wait(wait))
            .collect::<Vec<_>>()
    });
    let handler = {
        let ctl = ctl.clone();
        post(move |headers: HeaderMap, locks: Locks| {
            let ctl = ctl.clone();
            async move {
                ctl.checkpoint(&headers).await;
                let mut held: Vec<String> =
                    locks.held().iter().map(|l| l.key().to_owned()).collect();
                held.sort();
                held.join(",")
            }
        })
    };
    Router::new()
        .route("/m/{x}/{y}", handler.layer(both))
        .route(
            "/r/{key}",
            gated(ctl).layer(layer(backend, Cfg::global(TTL))),
        )
}

/// (19a) Several specs from one `LockRequest`: all held, all released.
pub async fn multiple_specs_all_held_and_released(h: Harness) {
    let ctl = Ctl::default();
    let app = multi_app(&h.backend, Duration::ZERO, &ctl);
    let holder = spawn_send(&app, gated_req("/m/b/a"));
    ctl.entered().await;

    for key in ["a", "b"] {
        assert!(status_of(&h.backend, &gkey(key)).await.is_some(), "{key}");
        send(&app, post_req(&format!("/r/{key}")))
            .await
            .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    }

    ctl.open(1);
    let reply = holder.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "a,b", "the handler sees both locks");
    for key in ["a", "b"] {
        assert_eq!(status_of(&h.backend, &gkey(key)).await, None, "{key}");
    }
}

/// (19b) {a,b} and {b,a} with waits do not deadlock: both are queued behind
/// an outside holder of `a`, then both succeed.
pub async fn opposite_lock_orders_do_not_deadlock(h: Harness) {
    let probe = Probe::new(&h.backend);
    let ctl = Ctl::default();
    let app = multi_app(&probe.backend(), Duration::from_secs(10), &ctl);
    let outside = OwnedLock::acquire(probe.backend(), &JobSpec::new("a", TTL))
        .await
        .unwrap();

    let ab = spawn_send(&app, post_req("/m/a/b"));
    let ba = spawn_send(&app, post_req("/m/b/a"));
    probe.acquires_started(3).await;
    outside.release().await.unwrap();

    for request in [ab, ba] {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.text(), "a,b");
    }
    for key in ["a", "b"] {
        assert_eq!(status_of(&h.backend, &gkey(key)).await, None, "{key}");
    }
}

/// (19c) A request dropped while acquiring its second lock gives back the
/// first, even one that was to be kept after the response: no handler ran,
/// so nobody else can release it.
pub async fn dropped_acquisition_releases_every_lock(h: Harness) {
    let probe = Probe::new(&h.backend);
    let both = LockLayer::new(probe.backend(), |_: &Request<Body>| {
        [
            LockSpec::global("a", TTL).auto_release(false),
            LockSpec::global("b", TTL).max_wait(Duration::from_secs(10)),
        ]
    });
    let app = Router::new().route("/k", post(|| async { "ran" }).layer(both));
    let outside = OwnedLock::acquire(probe.backend(), &JobSpec::new("b", TTL))
        .await
        .unwrap();
    let request = tokio::spawn(app.oneshot(post_req("/k")));
    probe.acquires_started(3).await; // outside b, then a, then waiting for b
    assert!(status_of(&h.backend, &gkey("a")).await.is_some());

    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());

    assert_released(&h, &gkey("a")).await;
    outside.release().await.unwrap();
}

/// A request whose second lock is busy gives back its first; if the request
/// is dropped while that release is in flight (client gone, outer timeout),
/// the release still completes.
pub async fn failed_acquisition_dropped_mid_cleanup_still_releases(h: Harness) {
    let probe = Probe::new(&h.backend);
    let both = LockLayer::new(probe.backend(), |_: &Request<Body>| {
        [LockSpec::global("a", TTL), LockSpec::global("b", TTL)]
    });
    let app = Router::new().route("/k", post(|| async { "ran" }).layer(both));
    let outside = OwnedLock::acquire(h.backend.clone(), &JobSpec::new("b", TTL))
        .await
        .unwrap();
    probe.hold_releases();
    let request = tokio::spawn(app.oneshot(post_req("/k")));
    probe.releases_held(1).await; // a is being given back
    assert!(!request.is_finished(), "the 429 waits for the release");

    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    probe.let_releases_go();

    assert_comes_free(&h, &gkey("a")).await;
    outside.release().await.unwrap();
}

/// `Locks::release` (in a handler) and `OwnedLock::release` (in a job) that
/// are dropped while the backend call is in flight still release the lock:
/// neither the registry nor the handle has it any more.
pub async fn release_calls_dropped_mid_flight_still_release(h: Harness) {
    let probe = Probe::new(&h.backend);
    let early = post(|locks: Locks| async move { format!("{:?}", locks.release("h").await) });
    let app = Router::new().route(
        "/h",
        early.layer(LockLayer::new(probe.backend(), |_: &Request<Body>| {
            Some(LockSpec::global("h", TTL))
        })),
    );
    let job = OwnedLock::acquire(probe.backend(), &JobSpec::new("j", TTL))
        .await
        .unwrap();
    probe.hold_releases();
    let request = tokio::spawn(app.oneshot(post_req("/h")));
    probe.releases_held(1).await; // the handler's release of h
    let release = tokio::spawn(job.release());
    probe.releases_held(2).await; // the job's release of j

    request.abort();
    release.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    assert!(release.await.unwrap_err().is_cancelled());
    probe.let_releases_go();

    assert_comes_free(&h, &gkey("h")).await;
    assert_comes_free(&h, &gkey("j")).await;
}

/// An acquisition that may have landed although the caller got
/// `BackendUnavailable` (the reply came too late, the connection broke) is
/// released with its owner token when that token was made for it: through
/// the layer (503) and for a job; a caller's own token is left alone.
pub async fn acquisition_with_lost_reply_is_released(h: Harness) {
    let probe = Probe::new(&h.backend);
    let app = Router::new().route(
        "/l",
        post(|| async { "ran" }).layer(LockLayer::new(probe.backend(), |_: &Request<Body>| {
            Some(LockSpec::global("l", TTL))
        })),
    );
    probe.lose_acquire_replies(true);
    let res = app.oneshot(post_req("/l")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let job = OwnedLock::acquire(probe.backend(), &JobSpec::new("m", TTL)).await;
    assert!(
        matches!(job, Err(LockError::BackendUnavailable(_))),
        "{job:?}"
    );

    // A caller's own token is left alone: it may hold the lock already
    // (acquire is idempotent for it), and a release would free that.
    let mine = JobSpec::new("n", TTL).owner("me");
    let held = OwnedLock::acquire(h.backend.clone(), &mine).await.unwrap();
    let again = OwnedLock::acquire(probe.backend(), &mine).await;
    assert!(
        matches!(again, Err(LockError::BackendUnavailable(_))),
        "{again:?}"
    );
    probe.lose_acquire_replies(false);
    tokio::task::yield_now().await;
    assert_eq!(
        status_of(&h.backend, &gkey("n")).await.map(|s| s.owner),
        Some("me".into())
    );
    held.release().await.unwrap();

    assert_comes_free(&h, &gkey("l")).await;
    assert_comes_free(&h, &gkey("m")).await;
}

/// (20) A lock taken by the handler through the `Locks` extractor is released
/// with the response.
pub async fn extractor_lock_released_with_response(h: Harness) {
    let ctl = Ctl::default();
    let handler = {
        let ctl = ctl.clone();
        post(move |headers: HeaderMap, locks: Locks| {
            let ctl = ctl.clone();
            async move {
                let extra = locks
                    .acquire(LockSpec::global("extra", TTL))
                    .await
                    .expect("extra lock");
                ctl.checkpoint(&headers).await;
                format!("{} {}", locks.held().len(), extra.key())
            }
        })
    };
    let app = Router::new().route(
        "/x/{key}",
        handler.layer(layer(&h.backend, Cfg::global(TTL))),
    );
    let request = spawn_send(&app, gated_req("/x/main"));
    ctl.entered().await;
    assert!(status_of(&h.backend, &gkey("extra")).await.is_some());

    ctl.open(1);
    let reply = request.await.unwrap();

    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "2 extra");
    assert_eq!(status_of(&h.backend, &gkey("extra")).await, None);
    assert_eq!(status_of(&h.backend, &gkey("main")).await, None);
}

/// 16 (registry part). `Locks::release` frees at once; a second release of
/// the same key is `LOCK_ALREADY_RELEASED`, of a never-held key
/// `LOCK_NOT_FOUND`.
pub async fn locks_release_twice_is_already_released(h: Harness) {
    fn outcome(result: Result<(), LockError>) -> &'static str {
        match result {
            Ok(()) => "ok",
            Err(e) => e.code(),
        }
    }
    let handler = post(|Path(key): Path<String>, locks: Locks| async move {
        let first = outcome(locks.release(&key).await);
        let free = locks
            .backend()
            .status(&LockKey::global(&key).unwrap())
            .await
            .unwrap()
            .is_none();
        let second = outcome(locks.release(&key).await);
        let never = outcome(locks.release("never-held").await);
        format!("{first} {free} {second} {never}")
    });
    let app = Router::new().route(
        "/l/{key}",
        handler.layer(layer(&h.backend, Cfg::global(TTL))),
    );

    let reply = send(&app, post_req("/l/k")).await;

    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "ok true LOCK_ALREADY_RELEASED LOCK_NOT_FOUND");
    assert_eq!(status_of(&h.backend, &gkey("k")).await, None);
    assert_eq!(send(&app, post_req("/l/k")).await.status, StatusCode::OK);
}

/// (21a) The layer applied with `Router::route_layer` (sees the matched route
/// and its parameters).
pub async fn works_via_route_layer(h: Harness) {
    let ctl = Ctl::default();
    let app = Router::new()
        .route("/r/{key}", gated(&ctl))
        .route_layer(layer(&h.backend, Cfg::route(TTL)));
    let holder = spawn_send(&app, gated_req("/r/k"));
    ctl.entered().await;

    send(&app, post_req("/r/k"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    let key = LockKey::route("/r/{key}", "k").unwrap();
    assert!(status_of(&h.backend, &key).await.is_some());

    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    assert_eq!(status_of(&h.backend, &key).await, None);
    assert_eq!(send(&app, post_req("/r/k")).await.status, StatusCode::OK);
}

/// (21b) The layer inside a `tower::ServiceBuilder` stack.
pub async fn works_inside_service_builder(h: Harness) {
    let ctl = Ctl::default();
    let stack = ServiceBuilder::new()
        .layer(CatchPanicLayer::new())
        .layer(layer(&h.backend, Cfg::global(TTL)));
    let app = Router::new().route("/r/{key}", gated(&ctl).layer(stack));
    let holder = spawn_send(&app, gated_req("/r/k"));
    ctl.entered().await;

    send(&app, post_req("/r/k"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");

    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    assert_eq!(send(&app, post_req("/r/k")).await.status, StatusCode::OK);
}

/// (16.2) A request's first lock must not run out while it waits for its
/// second: a lock `a` of one unit, `b` held elsewhere longer. The wait for
/// `b` ends when `a` would, so the request is refused (`LOCK_TIMEOUT`); it
/// never runs inside `a` once someone else has taken `a`.
pub async fn a_lock_never_runs_out_while_the_request_waits_for_another(h: Harness) {
    let ctl = Ctl::default();
    let u = h.unit();
    let both = LockLayer::new(h.backend.clone(), move |_: &Request<Body>| {
        [
            LockSpec::global("a", u).max_wait(u * 10),
            LockSpec::global("b", u * 30).max_wait(u * 10),
        ]
    });
    let only_a = LockLayer::new(h.backend.clone(), move |_: &Request<Body>| {
        Some(LockSpec::global("a", u * 30))
    });
    let app = Router::new()
        .route("/both", gated(&ctl).layer(both))
        .route("/a", gated(&ctl).layer(only_a));
    let b = gkey("b");
    h.backend
        .acquire(&areq(&b, "elsewhere", u * 30, Duration::ZERO))
        .await
        .unwrap();

    let waiting = spawn_send(&app, post_req("/both"));
    // Queued on `b`, or answered already: its wait for `b` ends when `a`
    // would, a unit after `a` was taken, and on a loaded machine that can
    // come before a status read sees it queued (waiting for the queue
    // alone then waited for what was over). Either way it holds `a` no
    // longer once the unit is out.
    while !waiting.is_finished()
        && status_of(&h.backend, &b)
            .await
            .is_none_or(|s| s.waiters < 1)
    {
        h.tick().await;
    }
    h.advance(u * 3 / 2).await;
    // `a`'s TTL is over: another request takes it and holds it.
    let other = spawn_send(&app, gated_req("/a"));
    ctl.entered().await;
    h.backend
        .release(&b, Holder::owner_only("elsewhere"))
        .await
        .unwrap();

    waiting.await.unwrap().assert_rejection(429, "LOCK_TIMEOUT");
    assert_eq!(ctl.runs(), 1, "only the request holding `a` now ran");
    ctl.open(1);
    assert_eq!(other.await.unwrap().status, StatusCode::OK);
    assert_eq!(status_of(&h.backend, &b).await, None, "`b` was never taken");
}

/// (16.2) A lock that has run out by the time its acquisition returns (a
/// reply slower than the TTL) is given back and the handler does not run:
/// `429 LOCK_EXPIRED`.
pub async fn a_lock_that_ran_out_before_the_handler_is_refused(h: Harness) {
    let probe = Probe::new(&h.backend);
    let ctl = Ctl::default();
    let u = h.unit();
    let short = LockLayer::new(probe.backend(), move |_: &Request<Body>| {
        Some(LockSpec::global("k", u))
    });
    let app = Router::new().route("/k", gated(&ctl).layer(short));
    probe.hold_acquire_replies();
    let request = spawn_send(&app, post_req("/k"));
    probe.acquire_replies_held(1).await;
    h.advance(u * 2).await;
    probe.let_acquire_replies_go();

    request.await.unwrap().assert_rejection(429, "LOCK_EXPIRED");
    assert_eq!(ctl.runs(), 0);
    assert_eq!(status_of(&h.backend, &gkey("k")).await, None);
}

/// (16.7) Several locks wait at most the longest max wait in all, not the
/// sum: `a` comes free after 1.5 units, `b` never; both allow 2 units. The
/// request is answered when 2 units have passed, not 3.5.
pub async fn several_locks_wait_at_most_the_longest_max_wait(h: Harness) {
    let u = h.unit();
    // Long enough that the waiter is seen queued while it still waits, on
    // a loaded machine too.
    let wait = u * 20;
    let both = LockLayer::new(h.backend.clone(), move |_: &Request<Body>| {
        [
            LockSpec::global("a", TTL).max_wait(wait),
            LockSpec::global("b", TTL).max_wait(wait),
        ]
    });
    let ctl = Ctl::default();
    let app = Router::new().route("/both", gated(&ctl).layer(both));
    for key in ["a", "b"] {
        h.backend
            .acquire(&areq(&gkey(key), "elsewhere", TTL, Duration::ZERO))
            .await
            .unwrap();
    }
    let start = Instant::now();
    let request = spawn_send(&app, post_req("/both"));
    h.until_queued(&gkey("a"), 1).await;
    // `a` comes free well inside the wait: the request then waits for `b`
    // only for what is left of its one max wait.
    h.advance(u / 2).await;
    h.backend
        .release(&gkey("a"), Holder::owner_only("elsewhere"))
        .await
        .unwrap();
    let released = start.elapsed();
    let reply = request.await.unwrap();
    let waited = start.elapsed();
    reply.assert_rejection(429, "LOCK_TIMEOUT");
    if h.is_paused() {
        assert_eq!(waited, wait);
    } else {
        // A second wait of its own for `b` would end a whole max wait
        // after `a` came free, at the earliest.
        assert!(
            waited < released + wait,
            "waited {waited:?} with `a` free after {released:?}: the sum of the waits"
        );
    }
    assert_eq!(ctl.runs(), 0);
    // Given back, if it reached the request at all (had the wait for `a`
    // ended first, the hand-off to the gone waiter is undone by its leave,
    // which runs beside the answer).
    h.until_free(&gkey("a")).await;
}

/// (16.7) One key names one lock of a request: specs naming it in both
/// scopes, or twice with other settings, are refused (`400
/// LOCK_INVALID_KEY`), and so is `Locks::acquire`
/// of a key the request already holds, in either scope.
pub async fn one_key_in_both_scopes_is_refused(h: Harness) {
    let ctl = Ctl::default();
    let twins = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        [LockSpec::new("k", TTL), LockSpec::global("k", TTL)]
    });
    let app = Router::new().route("/twins", gated(&ctl).layer(twins));
    send(&app, post_req("/twins"))
        .await
        .assert_rejection(400, "LOCK_INVALID_KEY");
    assert_eq!(ctl.runs(), 0);
    assert_eq!(status_of(&h.backend, &gkey("k")).await, None);
    let route_k = LockKey::route("/twins", "k").unwrap();
    assert_eq!(status_of(&h.backend, &route_k).await, None);

    let one = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        Some(LockSpec::new("k", TTL))
    });
    let handler = post(|locks: Locks| async move {
        let same = locks.acquire(LockSpec::new("k", TTL)).await;
        let other_scope = locks.acquire(LockSpec::global("k", TTL)).await;
        format!(
            "{:?} {:?}",
            same.map(|l| l.fence()),
            other_scope.map(|l| l.fence())
        )
    });
    let app = Router::new().route("/one", handler.layer(one));
    let reply = send(&app, post_req("/one")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.text().matches("InvalidKey").count(),
        2,
        "{}",
        reply.text()
    );
    assert_eq!(status_of(&h.backend, &gkey("k")).await, None);

    // One key as two kinds: neither is taken (the first one was, and a
    // request that asked for the exclusive lock ran beside readers).
    let kinds = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        [
            LockSpec::global("k", TTL).shared(),
            LockSpec::global("k", TTL),
        ]
    });
    let app = Router::new().route("/kinds", gated(&ctl).layer(kinds));
    send(&app, post_req("/kinds"))
        .await
        .assert_rejection(400, "LOCK_INVALID_KIND");
    assert_eq!(ctl.runs(), 0);
    assert_eq!(status_of(&h.backend, &gkey("k")).await, None);
    // Named twice with other settings: neither (the first one's were
    // taken, silently).
    let settings = [
        LockSpec::global("k", TTL * 2),
        LockSpec::global("k", TTL).max_wait(Duration::from_secs(1)),
        LockSpec::global("k", TTL).auto_release(false),
        LockSpec::global("k", TTL).watchdog(true),
        LockSpec::global("k", TTL).min_hold(Duration::from_secs(1)),
        LockSpec::global("k", TTL).owner("someone"),
    ];
    for other in settings {
        let twice = LockLayer::new(h.backend.clone(), move |_: &Request<Body>| {
            [LockSpec::global("k", TTL), other.clone()]
        });
        let app = Router::new().route("/twice", gated(&ctl).layer(twice));
        send(&app, post_req("/twice"))
            .await
            .assert_rejection(400, "LOCK_INVALID_KEY");
        assert_eq!(status_of(&h.backend, &gkey("k")).await, None);
    }
    assert_eq!(ctl.runs(), 0);
    // Named twice alike, it is one lock.
    let same = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        [LockSpec::global("k", TTL), LockSpec::global("k", TTL)]
    });
    let app = Router::new().route("/same", gated(&ctl).layer(same));
    assert_eq!(send(&app, post_req("/same")).await.status, StatusCode::OK);
    assert_eq!(ctl.runs(), 1);
}
