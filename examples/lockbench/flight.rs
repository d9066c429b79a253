//! `flight64`: bursts of identical requests through `SingleFlightLayer`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use tokio::task::JoinSet;
use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
use tower_lock::{SharedBackend, path_params};

use super::http::http_connect;
use super::locks::err;
use super::report::{Report, round};
use super::timing::percentile;

/// Concurrent identical requests per burst.
const BURST: usize = 64;
/// What the handler costs.
const HANDLER: Duration = Duration::from_millis(50);
const WARMUP_BURSTS: u64 = 3;

type Sender = SendRequest<Empty<Bytes>>;

pub(crate) async fn bursts(
    backend: SharedBackend,
    seconds: f64,
    r: &mut Report,
) -> Result<(), String> {
    let runs = Arc::new(AtomicU64::new(0));
    let handler_runs = runs.clone();
    let layer = SingleFlightLayer::new(SingleFlight::new(backend), |req: &Request<Body>| {
        let id = path_params(req).get("id")?.to_owned();
        Some(FlightSpec::new(format!("burst:{id}")))
    });
    let app = Router::new()
        .route(
            "/burst/{id}",
            get(move || {
                let runs = handler_runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(HANDLER).await;
                    "a statement"
                }
            })
            .layer(layer),
        )
        // The same handler without the layer: what 64 concurrent requests
        // cost on this machine anyway.
        .route(
            "/plain/{id}",
            get(|| async {
                tokio::time::sleep(HANDLER).await;
                "a statement"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut senders = Vec::with_capacity(BURST);
    for _ in 0..BURST {
        senders.push(http_connect(addr).await?);
    }
    let (mut lat_ns, mut plain_ns, mut per_burst) = (Vec::new(), Vec::new(), Vec::new());
    let (mut errors, mut first_error) = (0u64, None);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut burst = 0u64;
    // Bursts on the layer's route alternate with bursts on the plain one.
    while burst < WARMUP_BURSTS || Instant::now() < end {
        let before = runs.load(Ordering::Relaxed);
        let (lat, failed) = one_burst(&mut senders, "/burst", burst).await?;
        let after = runs.load(Ordering::Relaxed);
        let (plain, plain_failed) = one_burst(&mut senders, "/plain", burst).await?;
        for e in failed.into_iter().chain(plain_failed) {
            errors += 1;
            first_error.get_or_insert(e);
        }
        if burst >= WARMUP_BURSTS {
            per_burst.push(after - before);
            lat_ns.extend(lat);
            plain_ns.extend(plain);
        }
        burst += 1;
    }
    lat_ns.sort_unstable();
    plain_ns.sort_unstable();
    let plain_p99 = percentile(&plain_ns, 99.0);
    let ms = |ns: f64| round(ns / 1e6, 2);
    let p99 = percentile(&lat_ns, 99.0);
    let bursts = per_burst.len();
    r.put("bursts", bursts);
    r.put("burst_size", BURST);
    r.put("handler_ms", HANDLER.as_millis() as u64);
    r.put(
        "runs_per_burst_mean",
        round(
            per_burst.iter().sum::<u64>() as f64 / bursts.max(1) as f64,
            3,
        ),
    );
    r.put(
        "runs_per_burst_max",
        per_burst.iter().copied().max().unwrap_or(0),
    );
    r.put("p50_ms", ms(percentile(&lat_ns, 50.0)));
    r.put("p99_ms", ms(p99));
    r.put("max_ms", ms(lat_ns.last().copied().unwrap_or(0) as f64));
    r.put("p99_over_handler_ms", ms(p99 - HANDLER.as_nanos() as f64));
    r.put("plain_p50_ms", ms(percentile(&plain_ns, 50.0)));
    r.put("plain_p99_ms", ms(plain_p99));
    r.put("p99_over_plain_ms", ms(p99 - plain_p99));
    r.put("errors", errors);
    if let Some(e) = first_error {
        r.put("first_error", e);
    }
    Ok(())
}

/// `BURST` concurrent requests to `{base}/{n}`, one per connection: their
/// latencies and errors.
async fn one_burst(
    senders: &mut Vec<Sender>,
    base: &'static str,
    n: u64,
) -> Result<(Vec<u64>, Vec<String>), String> {
    let mut set = JoinSet::new();
    for sender in senders.drain(..) {
        set.spawn(request(sender, base, n));
    }
    let (mut lat, mut failed) = (Vec::with_capacity(BURST), Vec::new());
    while let Some(done) = set.join_next().await {
        let (sender, outcome) = done.map_err(err)?;
        senders.push(sender);
        match outcome {
            Ok(ns) => lat.push(ns),
            Err(e) => failed.push(e),
        }
    }
    Ok((lat, failed))
}

/// One request of burst `n`: its latency, or why it failed. The connection
/// comes back for the next burst.
async fn request(mut sender: Sender, base: &str, n: u64) -> (Sender, Result<u64, String>) {
    let start = Instant::now();
    let outcome = async {
        sender.ready().await.map_err(err)?;
        let req = Request::get(format!("{base}/{n}"))
            .header(http::header::HOST, "127.0.0.1")
            .body(Empty::new())
            .map_err(err)?;
        let res = sender.send_request(req).await.map_err(err)?;
        let status = res.status();
        res.into_body().collect().await.map_err(err)?;
        if status.is_success() {
            Ok(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
        } else {
            Err(format!("HTTP {status}"))
        }
    }
    .await;
    (sender, outcome)
}
