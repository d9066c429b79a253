//! Single-flight over HTTP: every client gets what it asked for (issue 21,
//! items 8 to 12). A shared response is a cached one, so what an HTTP cache
//! respects applies: conditional and range requests stay out of flights and
//! a `206` or `304` is never shared; a response reaches only the requests
//! its `Vary` fits; HEAD and GET are separate flights; the leader's body
//! streams to its own client as it comes, and one that outgrows the cap,
//! stays open (a stream) or is an event stream releases the followers to
//! run on their own; copies carry neither the leader's lock headers nor its
//! hop-by-hop headers.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, header};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tower::ServiceExt;
use tower_http::compression::CompressionLayer;
use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
use tower_lock::{LockLayer, LockSpec};

use super::flight::{Answer, LONG, all, flights, gated_get, spawn_call, until_waiting};
use super::harness::Harness;
use super::support::*;

/// The layer on a route `/{id}`, flights keyed `page:{id}`.
fn on_route(
    flights: &SingleFlight,
) -> SingleFlightLayer<impl Fn(&Request<Body>) -> Option<FlightSpec> + Send + Sync + 'static> {
    SingleFlightLayer::new(flights.clone(), |req: &Request<Body>| {
        let id = tower_lock::path_params(req).get("id")?.to_owned();
        Some(FlightSpec::new(format!("page:{id}")))
    })
}

/// Wait until `n` handler runs have begun.
async fn until_entered(h: &Harness, ctl: &Ctl, n: usize) {
    for _ in 0..20_000 {
        if ctl.runs() >= n {
            return;
        }
        h.tick().await;
    }
    panic!("run {n} never began (ran {})", ctl.runs());
}

fn flight_header(a: &Answer) -> Option<&str> {
    a.headers.get("single-flight").map(|v| v.to_str().unwrap())
}

const PAGE: &str = "the whole page, every byte of it";

/// A conditional or range request neither leads nor follows: its `304` or
/// `206` never reaches plain GETs, which share a whole `200` of their own.
pub async fn conditional_and_range_requests_stay_out_of_flights(h: Harness) {
    for (i, (name, value, status)) in [
        ("if-none-match", "\"v1\"", StatusCode::NOT_MODIFIED),
        (
            "if-modified-since",
            "Sun, 06 Nov 1994 08:49:37 GMT",
            StatusCode::NOT_MODIFIED,
        ),
        ("range", "bytes=0-3", StatusCode::PARTIAL_CONTENT),
    ]
    .into_iter()
    .enumerate()
    {
        let flights = flights(&h);
        let ctl = Ctl::default();
        let runs = ctl.clone();
        let handler = get(move |headers: HeaderMap| {
            let ctl = runs.clone();
            async move {
                ctl.checkpoint(&headers).await;
                if headers.contains_key("if-none-match")
                    || headers.contains_key("if-modified-since")
                {
                    return (StatusCode::NOT_MODIFIED, [(header::ETAG, "\"v1\"")]).into_response();
                }
                if headers.contains_key("range") {
                    let range = [(header::CONTENT_RANGE, "bytes 0-3/32")];
                    return (StatusCode::PARTIAL_CONTENT, range, "the ").into_response();
                }
                ([(header::ETAG, "\"v1\"")], PAGE).into_response()
            }
        });
        let app = Router::new().route("/{id}", handler.layer(on_route(&flights)));
        let uri = format!("/c{i}");
        let mut first = JoinSet::new();
        spawn_call(&mut first, &app, gated_get(&uri, &[(name, value)]));
        ctl.entered().await;
        let mut plain = JoinSet::new();
        for _ in 0..3 {
            spawn_call(&mut plain, &app, gated_get(&uri, &[]));
        }
        // The plain GETs have a flight of their own: one leads, two wait.
        until_waiting(&h, &flights, &format!("page:c{i}"), 2).await;
        ctl.open(4);
        let plain = all(plain).await;
        for a in &plain {
            assert_eq!(
                a.status,
                StatusCode::OK,
                "{name}: a plain GET gets the whole page"
            );
            assert_eq!(a.body, PAGE, "{name}");
        }
        let first = all(first).await;
        assert_eq!(first[0].status, status, "{name}");
        assert_eq!(flight_header(&first[0]), None, "{name}: outside flights");
        let shared = plain.iter().filter(|a| flight_header(a) == Some("shared"));
        assert_eq!(shared.count(), 2, "{name}");
        assert_eq!(
            ctl.runs(),
            2,
            "{name}: the conditional request and one plain GET"
        );
    }
}

/// With the layer outside a `CompressionLayer`, the gzip response (`Vary:
/// accept-encoding`) reaches only the followers that accept gzip; the
/// others run the handler on their own and get the plain body.
pub async fn a_varied_response_reaches_only_the_requests_it_fits(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let ctl = runs.clone();
        async move {
            ctl.checkpoint(&headers).await;
            ([(header::CONTENT_TYPE, "text/plain")], PAGE.repeat(4))
        }
    });
    let route = handler
        .layer::<_, Infallible>(CompressionLayer::new())
        .layer::<_, Infallible>(on_route(&flights));
    let app = Router::new().route("/{id}", route);
    let gzip = ("accept-encoding", "gzip");
    let mut set = JoinSet::new();
    spawn_call(&mut set, &app, gated_get("/v", &[gzip]));
    ctl.entered().await;
    for i in 0..4 {
        let asks: &[(&str, &str)] = if i % 2 == 0 { &[gzip] } else { &[] };
        spawn_call(&mut set, &app, gated_get("/v", asks));
    }
    until_waiting(&h, &flights, "page:v", 4).await;
    ctl.open(5);
    let answers = all(set).await;
    let (zipped, plain): (Vec<_>, Vec<_>) = answers
        .iter()
        .partition(|a| a.headers.contains_key(header::CONTENT_ENCODING));
    assert_eq!(
        plain.len(),
        2,
        "a gzip body reached a client that did not ask for it"
    );
    assert_eq!(
        zipped.len(),
        3,
        "the leader and the two followers asking for gzip"
    );
    for a in &zipped {
        assert_eq!(a.headers[header::CONTENT_ENCODING], "gzip");
        assert!(matches!(flight_header(a), Some("leader" | "shared")));
    }
    for a in &plain {
        assert_eq!(
            a.body,
            PAGE.repeat(4),
            "a plain body for a client without gzip"
        );
        assert_eq!(flight_header(a), None, "ran on its own");
    }
    assert_eq!(ctl.runs(), 3);
}

/// A flight keyed without the caller (the app's mistake): a response
/// reaches only the followers with the leader's credentials
/// (`Authorization`); one with other credentials, or none, runs the
/// handler on its own, also when the response says `must-revalidate` but
/// allows no reuse without asking the origin (`no-cache`). A response that
/// says `Cache-Control: public` with a lifetime is for anyone's request,
/// and reaches them all.
pub async fn a_response_reaches_only_the_clients_with_its_credentials(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(
        move |axum::extract::Path(id): axum::extract::Path<String>, headers: HeaderMap| {
            let ctl = runs.clone();
            async move {
                ctl.checkpoint(&headers).await;
                let who = headers
                    .get(header::AUTHORIZATION)
                    .map_or("-", |v| v.to_str().unwrap());
                let cache = if id == "public" {
                    "public, max-age=5"
                } else {
                    "no-cache, must-revalidate"
                };
                ([(header::CACHE_CONTROL, cache)], format!("for {who}"))
            }
        },
    );
    let app = Router::new().route("/{id}", handler.layer(on_route(&flights)));
    let (a, b) = (("authorization", "Bearer a"), ("authorization", "Bearer b"));
    let mut set = JoinSet::new();
    spawn_call(&mut set, &app, gated_get("/mine", &[a]));
    ctl.entered().await;
    for asks in [&[a][..], &[b], &[], &[a], &[b]] {
        spawn_call(&mut set, &app, gated_get("/mine", asks));
    }
    until_waiting(&h, &flights, "page:mine", 5).await;
    // One gate for each run that should happen: the leader's and the three
    // that do not fit (more would leave the next phase's leader ungated).
    ctl.open(4);
    let answers = all(set).await;
    let bodies = |who: &str| {
        answers
            .iter()
            .filter(|x| x.body == format!("for {who}").as_bytes())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        bodies("Bearer a").len(),
        3,
        "a's answer reached a client with other credentials"
    );
    for x in bodies("Bearer a") {
        assert!(matches!(flight_header(x), Some("leader" | "shared")));
    }
    for who in ["Bearer b", "-"] {
        let own = bodies(who);
        assert_eq!(own.len(), if who == "-" { 1 } else { 2 }, "{who}");
        for x in own {
            assert_eq!(flight_header(x), None, "{who} ran on its own");
        }
    }
    assert_eq!(ctl.runs(), 4, "the leader, both b's and the one without");
    for _ in 1..4 {
        // The three runs after the leader's entered too.
        ctl.entered().await;
    }

    // Public: anyone's.
    let mut set = JoinSet::new();
    spawn_call(&mut set, &app, gated_get("/public", &[a]));
    ctl.entered().await;
    for asks in [&[b][..], &[]] {
        spawn_call(&mut set, &app, gated_get("/public", asks));
    }
    until_waiting(&h, &flights, "page:public", 2).await;
    ctl.open(1);
    for x in all(set).await {
        assert_eq!(x.body, "for Bearer a", "a public response is anyone's");
    }
    assert_eq!(ctl.runs(), 5);
}

/// Two keys that differ in bytes but are the same Unicode text once
/// normalised (a path's `caf%C3%A9` and `cafe%CC%81`) may name two
/// resources: each is a flight of its own (a lock key is normalised to NFC,
/// a flight key is kept as it is), so neither request gets the other's
/// answer.
pub async fn canonically_equivalent_keys_are_separate_flights(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(
        move |axum::extract::Path(id): axum::extract::Path<String>, headers: HeaderMap| {
            let ctl = runs.clone();
            async move {
                ctl.checkpoint(&headers).await;
                format!("for {id}")
            }
        },
    );
    let app = Router::new().route("/{id}", handler.layer(on_route(&flights)));
    let mut set = JoinSet::new();
    spawn_call(&mut set, &app, gated_get("/caf%C3%A9", &[]));
    ctl.entered().await;
    // In a flight of its own, the second runs the handler too (in the
    // first's, it would wait for that answer).
    spawn_call(&mut set, &app, gated_get("/cafe%CC%81", &[]));
    until_entered(&h, &ctl, 2).await;
    ctl.open(2);
    let mut bodies: Vec<_> = all(set).await.into_iter().map(|a| a.body).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        ["for cafe\u{301}", "for caf\u{e9}"],
        "each request gets the answer for its own path"
    );
}

/// A response that may answer other clients' requests (`public, max-age=1`)
/// does so only while fresh: kept no longer than its lifetime under a longer
/// result TTL. Served stale to another client, it would be what RFC 9111
/// §3.5 allows only after asking the origin, which the layer never does.
pub async fn a_response_crosses_credentials_only_while_fresh(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let ctl = runs.clone();
        async move {
            ctl.checkpoint(&headers).await;
            let run = format!("run {}", ctl.runs());
            ([(header::CACHE_CONTROL, "public, max-age=1")], run)
        }
    });
    let layer = SingleFlightLayer::new(flights.clone(), |req: &Request<Body>| {
        let id = tower_lock::path_params(req).get("id")?.to_owned();
        Some(FlightSpec::new(format!("page:{id}")).result_ttl(LONG))
    });
    let app = Router::new().route("/{id}", handler.layer(layer));
    let one = |who: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::get("/fresh").header(header::AUTHORIZATION, who);
            let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            res.into_body().collect().await.unwrap().to_bytes()
        }
    };
    assert_eq!(one("Bearer a").await, "run 1");
    assert_eq!(one("Bearer b").await, "run 1", "fresh: anyone's");
    h.advance(Duration::from_millis(1_100)).await;
    assert_eq!(
        one("Bearer b").await,
        "run 2",
        "a stale response reached another client"
    );
}

/// A route `/{id}` whose handler answers `run <n>` (the runs so far, this
/// one included), flights keyed `page:{id}` with a long result TTL.
fn kept_runs(h: &Harness) -> (SingleFlight, Ctl, Router) {
    let flights = flights(h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let ctl = runs.clone();
        async move {
            ctl.checkpoint(&headers).await;
            format!("run {}", ctl.runs())
        }
    });
    let layer = SingleFlightLayer::new(flights.clone(), |req: &Request<Body>| {
        let id = tower_lock::path_params(req).get("id")?.to_owned();
        Some(FlightSpec::new(format!("page:{id}")).result_ttl(LONG))
    });
    (
        flights,
        ctl,
        Router::new().route("/{id}", handler.layer(layer)),
    )
}

/// A response kept for the result TTL answers later requests, but not one
/// that says `Cache-Control: no-cache` or `max-age=0`: it runs the handler
/// (leading a flight of such requests, whose answer replaces nothing). Such
/// a request still joins a flight under way, whose response is made after
/// it came.
pub async fn a_request_for_a_fresh_answer_never_gets_a_stored_one(h: Harness) {
    let (flights, ctl, app) = kept_runs(&h);
    let one = |asks: &'static [(&'static str, &'static str)]| {
        let app = app.clone();
        async move {
            let mut req = Request::get("/kept");
            for (n, v) in asks {
                req = req.header(*n, *v);
            }
            let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            let shared = res.headers().get("single-flight").cloned();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (shared, body)
        }
    };
    assert_eq!(one(&[]).await.1, "run 1");
    let (shared, body) = one(&[]).await;
    assert_eq!(
        (shared.unwrap(), body),
        ("shared".parse().unwrap(), "run 1".into())
    );
    for (asks, run) in [
        (&[("cache-control", "no-cache")][..], "run 2"),
        (&[("cache-control", "max-age=0")], "run 3"),
        (&[("pragma", "no-cache")], "run 4"),
    ] {
        let (shared, body) = one(asks).await;
        assert_eq!(body, run, "{asks:?} got a stored response");
        assert_eq!(
            shared,
            Some("leader".parse().unwrap()),
            "{asks:?} led a flight of its own"
        );
    }
    assert_eq!(one(&[]).await.1, "run 1", "the stored response stays");

    // A flight under way: joined.
    let mut set = JoinSet::new();
    spawn_call(&mut set, &app, gated_get("/under-way", &[]));
    for _ in 0..4 {
        // The four runs above entered too.
        ctl.entered().await;
    }
    ctl.entered().await;
    spawn_call(
        &mut set,
        &app,
        gated_get("/under-way", &[("cache-control", "no-cache")]),
    );
    until_waiting(&h, &flights, "page:under-way", 1).await;
    // Two gates: the leader's, and one for the follower should it (wrongly)
    // run on its own; it then answers "run 6" instead of hanging.
    ctl.open(2);
    for x in all(set).await {
        assert_eq!(
            x.body, "run 5",
            "a no-cache request joins a flight under way"
        );
    }
    assert_eq!(ctl.runs(), 5);
}

/// A burst of requests that refuse the stored response (a browser's
/// reloads say `max-age=0`, its hard reloads `no-cache`) meets in a flight
/// of its own: one runs the handler, the others share that answer, made
/// after each of them came. Each running on its own, they were the
/// stampede single-flight is there to stop. The stored response stays.
pub async fn a_burst_refusing_the_stored_answer_runs_the_handler_once(h: Harness) {
    let (flights, ctl, app) = kept_runs(&h);
    let mut stored = JoinSet::new();
    spawn_call(
        &mut stored,
        &app,
        Request::get("/burst").body(Body::empty()).unwrap(),
    );
    assert_eq!(all(stored).await[0].body, "run 1");
    ctl.entered().await;
    let mut set = JoinSet::new();
    let reloads: [&[(&str, &str)]; 5] = [
        &[("cache-control", "no-cache")],
        &[("cache-control", "max-age=0")],
        &[("cache-control", "no-cache")],
        &[("pragma", "no-cache")],
        &[("cache-control", "max-age=0")],
    ];
    for asks in reloads {
        spawn_call(&mut set, &app, gated_get("/burst", asks));
    }
    ctl.entered().await;
    let mut queued = false;
    for _ in 0..20_000 {
        let status = flights.status_refreshing("page:burst").await.unwrap();
        if status.is_some_and(|s| s.waiters >= 4) {
            queued = true;
            break;
        }
        h.tick().await;
    }
    assert!(
        queued,
        "the other four never queued on the refreshing flight"
    );
    // One gate for the run that should happen, and one more: should a
    // reload (wrongly) run on its own, it answers "run 3" instead of
    // hanging.
    ctl.open(2);
    let answers = all(set).await;
    for x in &answers {
        assert_eq!(x.body, "run 2", "every reload gets the one fresh answer");
    }
    let leaders = answers
        .iter()
        .filter(|x| flight_header(x) == Some("leader"))
        .count();
    assert_eq!(leaders, 1);
    assert_eq!(ctl.runs(), 2, "the stored run and one for the burst");
    let mut after = JoinSet::new();
    spawn_call(
        &mut after,
        &app,
        Request::get("/burst").body(Body::empty()).unwrap(),
    );
    assert_eq!(
        all(after).await[0].body,
        "run 1",
        "the stored response stays"
    );
}

/// With the layer outside the Router (`layer.layer(router)`, as
/// `ServiceBuilder` puts it), a HEAD's response comes to it with its body
/// stripped by axum and the GET's `content-length` kept. HEAD and GET are
/// two flights: the GETs get the body.
pub async fn head_and_get_are_separate_flights(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let ctl = runs.clone();
        async move {
            ctl.checkpoint(&headers).await;
            PAGE
        }
    });
    let layer = SingleFlightLayer::new(flights.clone(), |req: &Request<Body>| {
        Some(FlightSpec::new(format!("page:{}", req.uri().path())))
    });
    let app = tower::Layer::layer(&layer, Router::new().route("/p", handler));
    let call = |set: &mut JoinSet<Answer>, req: Request<Body>| {
        let app = app.clone();
        set.spawn(async move {
            let (parts, body) = app.oneshot(req).await.unwrap().into_parts();
            Answer {
                status: parts.status,
                headers: parts.headers,
                body: body.collect().await.unwrap().to_bytes(),
            }
        });
    };
    let mut head = JoinSet::new();
    call(
        &mut head,
        Request::head("/p")
            .header(GATE, "1")
            .body(Body::empty())
            .unwrap(),
    );
    ctl.entered().await;
    let mut gets = JoinSet::new();
    for _ in 0..2 {
        call(&mut gets, gated_get("/p", &[]));
    }
    until_waiting(&h, &flights, "page:/p", 1).await;
    ctl.open(3);
    let head = all(head).await;
    assert_eq!(head[0].status, StatusCode::OK);
    assert!(head[0].body.is_empty(), "axum strips a HEAD's body");
    assert_eq!(
        head[0].headers[header::CONTENT_LENGTH],
        PAGE.len().to_string()
    );
    for a in all(gets).await {
        assert_eq!(a.body, PAGE, "{:?}", a.headers);
        assert!(matches!(flight_header(&a), Some("leader" | "shared")));
    }
    assert_eq!(ctl.runs(), 2, "one HEAD and one GET ran the handler");
}

/// A body the test feeds chunk by chunk.
struct Fed(mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for Fed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(c))))
    }
}

/// A route `/{id}` whose handler, for a request with `x-stream`, answers
/// with a body the test feeds (its feed goes to the returned receiver), and
/// for others with `own`.
fn streaming_app(
    flights: &SingleFlight,
    ctl: &Ctl,
    content_type: &'static str,
) -> (
    Router,
    mpsc::UnboundedReceiver<mpsc::UnboundedSender<Bytes>>,
) {
    let (feeds_tx, feeds) = mpsc::unbounded_channel();
    let feeds_tx = Arc::new(Mutex::new(feeds_tx));
    let ctl = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let (ctl, feeds_tx) = (ctl.clone(), feeds_tx.clone());
        async move {
            ctl.checkpoint(&headers).await;
            if !headers.contains_key("x-stream") {
                return "own".into_response();
            }
            let (feed, chunks) = mpsc::unbounded_channel();
            feeds_tx.lock().unwrap().send(feed).unwrap();
            let head = [(header::CONTENT_TYPE, content_type)];
            (head, Body::new(Fed(chunks))).into_response()
        }
    });
    let app = Router::new().route("/{id}", handler.layer(on_route(flights)));
    (app, feeds)
}

/// The leader's response as it comes: its head, while its body streams.
async fn leader_head(app: &Router, uri: &str) -> http::Response<Body> {
    let req = Request::get(uri)
        .header("x-stream", "1")
        .body(Body::empty());
    let call = app.clone().oneshot(req.unwrap());
    tokio::time::timeout(LONG, call)
        .await
        .expect("the head never came while the body streamed")
        .unwrap()
}

async fn next_chunk(body: &mut Body) -> Bytes {
    let frame = body.frame().await.expect("a frame").unwrap();
    frame.into_data().expect("data")
}

/// A streamed body reaches the leader's client as it comes (never held
/// back behind the cap), and when it ends within the cap, the followers
/// that waited meanwhile get it.
pub async fn a_streamed_body_flows_to_its_client_and_is_shared_when_it_ends(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let (app, mut feeds) = streaming_app(&flights, &ctl, "text/plain");
    let head = tokio::spawn({
        let app = app.clone();
        async move { leader_head(&app, "/s").await }
    });
    let feed = feeds.recv().await.unwrap();
    feed.send(Bytes::from_static(b"hello ")).unwrap();
    let res = head.await.unwrap();
    assert_eq!(res.headers()["single-flight"], "leader");
    let mut body = res.into_body();
    assert_eq!(next_chunk(&mut body).await, "hello ");
    let mut followers = JoinSet::new();
    for _ in 0..2 {
        spawn_call(&mut followers, &app, gated_get("/s", &[]));
    }
    until_waiting(&h, &flights, "page:s", 2).await;
    feed.send(Bytes::from_static(b"world")).unwrap();
    drop(feed);
    assert_eq!(body.collect().await.unwrap().to_bytes(), "world");
    for a in all(followers).await {
        assert_eq!(a.body, "hello world");
        assert_eq!(flight_header(&a), Some("shared"));
    }
    assert_eq!(ctl.runs(), 1);
}

/// A streamed body that grows past the cap is not shared: every follower
/// runs the handler on its own at once (not one after another), while the
/// leader's client gets its whole body.
pub async fn a_stream_past_the_cap_releases_every_follower_at_once(h: Harness) {
    let flights = flights(&h).max_result_bytes(16);
    let ctl = Ctl::default();
    let (app, mut feeds) = streaming_app(&flights, &ctl, "text/plain");
    let head = tokio::spawn({
        let app = app.clone();
        async move { leader_head(&app, "/big").await }
    });
    let feed = feeds.recv().await.unwrap();
    feed.send(Bytes::from_static(b"0123456789")).unwrap();
    let mut body = head.await.unwrap().into_body();
    assert_eq!(next_chunk(&mut body).await, "0123456789");
    let mut followers = JoinSet::new();
    for _ in 0..2 {
        spawn_call(&mut followers, &app, gated_get("/big", &[]));
    }
    until_waiting(&h, &flights, "page:big", 2).await;
    // 20 bytes: past the cap of 16.
    feed.send(Bytes::from_static(b"0123456789")).unwrap();
    assert_eq!(next_chunk(&mut body).await, "0123456789");
    // Both followers run the handler now, side by side.
    until_entered(&h, &ctl, 3).await;
    ctl.open(2);
    for a in all(followers).await {
        assert_eq!(a.body, "own");
        assert_eq!(flight_header(&a), None, "ran on its own");
    }
    drop(feed);
    assert!(body.collect().await.unwrap().to_bytes().is_empty());
}

/// A body still open one lock TTL after the leader's head (a stream that
/// stays open, small) is not shared: the followers run on their own then,
/// and the leader's client keeps its stream. Memory only: the clock is
/// paused, so the lock TTL is exact (the release itself is the same on
/// every backend: `a_stream_past_the_cap_releases_every_follower_at_once`).
pub async fn a_stream_open_past_the_lock_ttl_releases_the_followers(h: Harness) {
    assert!(h.is_paused(), "needs the paused clock");
    let ttl = Duration::from_secs(2);
    let flights = flights(&h).lock_ttl(ttl);
    let ctl = Ctl::default();
    let (app, mut feeds) = streaming_app(&flights, &ctl, "application/x-ndjson");
    let head = tokio::spawn({
        let app = app.clone();
        async move { leader_head(&app, "/open").await }
    });
    let feed = feeds.recv().await.unwrap();
    feed.send(Bytes::from_static(b"{\"tick\":1}\n")).unwrap();
    let mut body = head.await.unwrap().into_body();
    assert_eq!(next_chunk(&mut body).await, "{\"tick\":1}\n");
    // The leader's client keeps reading.
    let reader = tokio::spawn(async move { body.collect().await.unwrap().to_bytes() });
    let mut followers = JoinSet::new();
    for _ in 0..2 {
        spawn_call(&mut followers, &app, gated_get("/open", &[]));
    }
    until_waiting(&h, &flights, "page:open", 2).await;
    // In small steps, as time passes: the watchdog renews the leader's lock
    // on its schedule.
    let step = ttl / 20;
    for _ in 0..19 {
        tokio::time::advance(step).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(ctl.runs(), 1, "within the lock TTL the followers wait");
    tokio::time::advance(step).await;
    until_entered(&h, &ctl, 3).await;
    ctl.open(2);
    for a in all(followers).await {
        assert_eq!(a.body, "own");
    }
    feed.send(Bytes::from_static(b"{\"tick\":2}\n")).unwrap();
    drop(feed);
    assert_eq!(reader.await.unwrap(), "{\"tick\":2}\n");
}

#[tokio::test(start_paused = true)]
async fn memory_a_stream_open_past_the_lock_ttl_releases_the_followers() {
    let h = super::harness::memory_backend_paused().await;
    a_stream_open_past_the_lock_ttl_releases_the_followers(h).await;
}

/// An event stream (`text/event-stream`) is each client's own: the
/// followers run the handler on their own as soon as the leader's head is
/// in, even though its body is complete and small.
pub async fn an_event_stream_is_never_shared(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let ctl = runs.clone();
        async move {
            ctl.checkpoint(&headers).await;
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                "data: hi\n\n",
            )
        }
    });
    let app = Router::new().route("/{id}", handler.layer(on_route(&flights)));
    let mut set = JoinSet::new();
    for _ in 0..3 {
        spawn_call(&mut set, &app, gated_get("/events", &[]));
    }
    until_waiting(&h, &flights, "page:events", 2).await;
    ctl.open(1);
    until_entered(&h, &ctl, 3).await;
    ctl.open(2);
    for a in all(set).await {
        assert_eq!(a.body, "data: hi\n\n");
        assert_ne!(flight_header(&a), Some("shared"));
    }
}

/// A shared copy carries neither the leader's lock headers (of the
/// `LockLayer` inside, which ran for the leader alone) nor its hop-by-hop
/// headers (`Connection`, those it lists, `Keep-Alive`, ...).
pub async fn copies_carry_no_lock_or_hop_by_hop_headers(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let ctl = runs.clone();
        async move {
            ctl.checkpoint(&headers).await;
            let head = [
                ("connection", "x-hop"),
                ("x-hop", "1"),
                ("keep-alive", "timeout=5"),
                ("x-kept", "yes"),
            ];
            (head, PAGE)
        }
    });
    let lock = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        Some(LockSpec::global("page-lock", LONG))
    })
    .lock_headers(true);
    let route = handler
        .layer::<_, Infallible>(lock)
        .layer::<_, Infallible>(on_route(&flights));
    let app = Router::new().route("/{id}", route);
    let mut set = JoinSet::new();
    for _ in 0..3 {
        spawn_call(&mut set, &app, gated_get("/h", &[]));
    }
    until_waiting(&h, &flights, "page:h", 2).await;
    ctl.open(1);
    let answers = all(set).await;
    assert_eq!(ctl.runs(), 1);
    for a in &answers {
        assert_eq!(a.body, PAGE);
        assert_eq!(a.headers["x-kept"], "yes");
        let leads = flight_header(a) == Some("leader");
        let names = [
            "lock-acquired",
            "lock-fence",
            "lock-key",
            "connection",
            "x-hop",
            "keep-alive",
        ];
        for name in names {
            assert_eq!(
                a.headers.contains_key(name),
                leads,
                "{name} on {:?}",
                flight_header(a)
            );
        }
    }
}
