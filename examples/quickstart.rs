//! Quickstart: one lock per order, `429 Too Many Requests` while it is busy.
//!
//! ```sh
//! cargo run --example quickstart        # PORT=8080 cargo run ... for another port
//! ```
//!
//! The app pays orders at `POST /orders/{id}/pay`. Paying takes a while, and
//! paying the same order twice at once must not happen, so every request
//! locks `order:{id}` first. At start-up the example sends itself two
//! overlapping payments of order 42: the first gets the lock and `200 OK`;
//! the second finds the order busy and gets `429 Too Many Requests` with a
//! `Retry-After` header, without the handler ever running.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::Request;
use axum::{Router, routing::post};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_lock::{LockLayer, LockSpec, Locks, MemoryBackend, path_params};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    // Decide what each request locks: here, the order named in the path.
    // The lock is released as soon as the response has been sent; the TTL
    // (5 s) only matters if the process dies while holding it.
    let lock_order = LockLayer::new(MemoryBackend::new(), |req: &Request<Body>| {
        let id = path_params(req).get("id")?.to_owned();
        Some(LockSpec::new(format!("order:{id}"), Duration::from_secs(5)))
    });

    // The layer goes on the route, so it sees the `{id}` path parameter.
    let app = Router::new().route("/orders/{id}/pay", post(pay).layer(lock_order));

    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse().map_err(|_| format!("bad PORT `{port}`"))?,
        Err(_) => 3000,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    demo(addr).await?;

    println!("\ntry it yourself (twice within half a second to see a 429):");
    println!("  curl -i -X POST http://{addr}/orders/42/pay");
    server.await??;
    Ok(())
}

/// Runs only while this request holds the lock on `order:{id}`.
async fn pay(Path(id): Path<String>, locks: Locks) -> String {
    // The fencing token grows with every acquisition of the lock: pass it to
    // the systems you write to, so they can refuse a stale holder's writes.
    let fence = locks.first().map(|lock| lock.fence()).unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(500)).await; // talk to the payment provider...
    format!("order {id} paid (fencing token {fence})\n")
}

/// Pay order 42 twice, the second request 100 ms after the first.
async fn demo(addr: SocketAddr) -> Result<(), Error> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let pay = || async {
        let req = Request::post(format!("http://{addr}/orders/42/pay")).body(Empty::new())?;
        let res = client.request(req).await?;
        let status = res.status();
        let retry_after = res.headers().get("retry-after").cloned();
        let body = res.into_body().collect().await?.to_bytes();
        let mut line = format!("POST /orders/42/pay -> {status}");
        if let Some(retry_after) = retry_after {
            line += &format!(" (Retry-After: {})", retry_after.to_str()?);
        }
        line += &format!("\n    {}", String::from_utf8_lossy(&body).trim_end());
        Ok::<_, Error>(line)
    };
    let (first, second) = tokio::join!(pay(), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        pay().await
    });
    println!("{}", first?);
    println!("{}", second?);
    Ok(())
}
