//! `http`: an axum app on loopback, the same route with and without
//! `LockLayer`, driven by hyper clients on keep-alive connections.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tower_lock::{LockLayer, LockSpec, SharedBackend, path_params};

use super::locks::err;
use super::report::{Report, round, us};
use super::timing::{Cycle, alternate, run_tally};
use super::{HTTP_CONNECTIONS, TTL};

pub(crate) async fn ok() -> &'static str {
    "ok"
}

pub(crate) struct HttpCycle {
    pub(crate) addr: SocketAddr,
    pub(crate) sender: Option<SendRequest<Empty<Bytes>>>,
    pub(crate) base: &'static str,
    pub(crate) worker: usize,
}

pub(crate) async fn http_connect(addr: SocketAddr) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(err)?;
    stream.set_nodelay(true).map_err(err)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(err)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

impl Cycle for HttpCycle {
    async fn cycle(&mut self, i: u64) -> Result<(), String> {
        let alive = match &mut self.sender {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !alive {
            // First use, or the connection broke: a new one.
            self.sender = Some(http_connect(self.addr).await?);
        }
        let sender = self.sender.as_mut().expect("connected");
        let req = Request::get(format!("{}/{}-{i}", self.base, self.worker))
            .header(http::header::HOST, "127.0.0.1")
            .body(Empty::new())
            .map_err(err)?;
        let res = match sender.send_request(req).await {
            Ok(res) => res,
            Err(e) => {
                self.sender = None;
                return Err(e.to_string());
            }
        };
        let status = res.status();
        res.into_body().collect().await.map_err(err)?;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {status}"))
        }
    }
}

pub(crate) async fn http(
    backend: SharedBackend,
    seconds: f64,
    r: &mut Report,
) -> Result<(), String> {
    let layer = LockLayer::new(backend, |req: &Request<Body>| {
        let params = path_params(req);
        let id = params.get("id")?;
        Some(LockSpec::new(format!("req:{id}"), TTL))
    });
    let app = Router::new()
        .route("/locked/{id}", get(ok).layer(layer))
        .route("/open/{id}", get(ok));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });

    let phase = async |base: &'static str, connections: usize, seconds: f64| {
        run_tally(connections, seconds, move |worker| HttpCycle {
            addr,
            sender: None,
            base,
            worker,
        })
        .await
    };
    let (open, locked) = alternate(
        seconds,
        async |s| phase("/open", HTTP_CONNECTIONS, s).await,
        async |s| phase("/locked", HTTP_CONNECTIONS, s).await,
    )
    .await?;
    // At 32 connections the machine is saturated and p50 is mostly queueing;
    // one connection shows the latency the layer adds to an unloaded server.
    let (open1, locked1) = alternate(
        seconds / 2.0,
        async |s| phase("/open", 1, s).await,
        async |s| phase("/locked", 1, s).await,
    )
    .await?;
    locked.put(r);
    r.put("unlocked_ops_per_s", round(open.ops_per_s, 1));
    r.put("ratio", round(locked.ops_per_s / open.ops_per_s, 4));
    r.put("unlocked_p50_us", us(open.p50_ns));
    r.put("unlocked_p99_us", us(open.p99_ns));
    r.put("p50_added_us", us(locked.p50_ns - open.p50_ns));
    r.put("unlocked_errors", open.errors);
    r.put("connections", HTTP_CONNECTIONS);
    r.put("one_conn_p50_us", us(locked1.p50_ns));
    r.put("one_conn_unlocked_p50_us", us(open1.p50_ns));
    r.put("one_conn_p50_added_us", us(locked1.p50_ns - open1.p50_ns));
    r.put("one_conn_seconds", seconds / 2.0);
    // Requests per phase, to divide a `perf stat` of one side by.
    r.put("unlocked_ops", open.ops);
    r.put("one_conn_ops", locked1.ops);
    r.put("one_conn_unlocked_ops", open1.ops);
    r.put("one_conn_errors", open1.errors + locked1.errors);
    Ok(())
}
