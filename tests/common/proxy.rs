//! A TCP proxy in front of a test server, with faults under the test's
//! control: reset a client right after the server answered it (the reply is
//! lost, the command was run), and hold back traffic of pub/sub or command
//! connections (a slow network, one direction at a time).
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy on 127.0.0.1 forwarding to `127.0.0.1:<upstream>`; stopped on drop.
pub struct Proxy {
    port: u16,
    ctl: Arc<Ctl>,
    task: JoinHandle<()>,
}

struct Ctl {
    upstream: u16,
    /// The next server→client data on a command connection is dropped and
    /// that client reset: the server ran the command, the reply is lost.
    reset_next_reply: AtomicBool,
    /// While true, server→client data of pub/sub connections waits.
    hold_pubsub: watch::Sender<bool>,
    /// While true, client→server data of command connections waits.
    hold_commands: watch::Sender<bool>,
    /// Command connections numbered below this hold their client→server
    /// data (those open when [`Proxy::hold_open_commands`] was called).
    hold_below: watch::Sender<usize>,
    /// Connections accepted so far (each is numbered in that order).
    accepted: std::sync::atomic::AtomicUsize,
    resets: watch::Sender<usize>,
    /// Client writes that arrived on a command connection while it was held.
    held_writes: watch::Sender<usize>,
}

impl Proxy {
    /// Start a proxy to `upstream` on a free port.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let ctl = Arc::new(Ctl {
            upstream,
            reset_next_reply: AtomicBool::new(false),
            hold_pubsub: watch::Sender::new(false),
            hold_commands: watch::Sender::new(false),
            hold_below: watch::Sender::new(0),
            accepted: std::sync::atomic::AtomicUsize::new(0),
            resets: watch::Sender::new(0),
            held_writes: watch::Sender::new(0),
        });
        let task = tokio::spawn({
            let ctl = ctl.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(connection(ctl.clone(), client));
                }
            }
        });
        Proxy { port, ctl, task }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drop the next reply a command connection gets and reset that client.
    pub fn reset_next_reply(&self) {
        self.ctl.reset_next_reply.store(true, SeqCst);
    }

    /// Wait until `n` clients were reset by [`Proxy::reset_next_reply`].
    pub async fn resets(&self, n: usize) {
        let mut rx = self.ctl.resets.subscribe();
        rx.wait_for(|r| *r >= n).await.expect("proxy alive");
    }

    /// Wait until `n` client writes in all arrived on held command
    /// connections (and wait there).
    pub async fn held_writes(&self, n: usize) {
        let mut rx = self.ctl.held_writes.subscribe();
        rx.wait_for(|h| *h >= n).await.expect("proxy alive");
    }

    /// Hold back (or let go) what the server sends to pub/sub connections.
    pub fn hold_pubsub(&self, hold: bool) {
        self.ctl.hold_pubsub.send_replace(hold);
    }

    /// Hold back (or let go) what clients send on command connections.
    pub fn hold_commands(&self, hold: bool) {
        self.ctl.hold_commands.send_replace(hold);
    }

    /// Hold back (or let go) what clients send on the command connections
    /// open now; connections opened later pass (a stalled socket, while a
    /// new one works).
    pub fn hold_open_commands(&self, hold: bool) {
        let below = if hold {
            self.ctl.accepted.load(SeqCst)
        } else {
            0
        };
        self.ctl.hold_below.send_replace(below);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connection(ctl: Arc<Ctl>, client: TcpStream) {
    let number = ctl.accepted.fetch_add(1, SeqCst);
    let Ok(server) = TcpStream::connect(("127.0.0.1", ctl.upstream)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    // Closed with a reset: the client sees a broken connection, as when the
    // network fails, not an orderly end.
    let _ = client.set_zero_linger();
    let _ = server.set_nodelay(true);
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    // Set once the client subscribes: from then on it is a pub/sub
    // connection (a RESP2 subscriber sends nothing but (P|S)SUBSCRIBE and
    // PING).
    let pubsub = Arc::new(AtomicBool::new(false));
    let up = tokio::spawn(upstream(
        ctl.clone(),
        number,
        pubsub.clone(),
        client_rx,
        server_tx,
    ));
    downstream(ctl, pubsub, server_rx, client_tx).await;
    up.abort();
}

/// Client → server. Read as it comes (so that what waits can be counted),
/// forwarded in order once no hold applies.
async fn upstream(
    ctl: Arc<Ctl>,
    number: usize,
    pubsub: Arc<AtomicBool>,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let reader = {
        let ctl = ctl.clone();
        let pubsub = pubsub.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = buf[..n].to_vec();
                if contains(&chunk, b"SUBSCRIBE") {
                    pubsub.store(true, SeqCst);
                }
                if !pubsub.load(SeqCst)
                    && (*ctl.hold_commands.borrow() || number < *ctl.hold_below.borrow())
                {
                    ctl.held_writes.send_modify(|n| *n += 1);
                }
                if tx.send(chunk).is_err() {
                    return;
                }
            }
        })
    };
    let mut hold = ctl.hold_commands.subscribe();
    let mut hold_below = ctl.hold_below.subscribe();
    while let Some(chunk) = rx.recv().await {
        if !pubsub.load(SeqCst)
            && (hold.wait_for(|h| !*h).await.is_err()
                || hold_below.wait_for(|b| number >= *b).await.is_err())
        {
            break;
        }
        if to.write_all(&chunk).await.is_err() {
            break;
        }
    }
    reader.abort();
}

/// Server → client.
async fn downstream(
    ctl: Arc<Ctl>,
    pubsub: Arc<AtomicBool>,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut hold = ctl.hold_pubsub.subscribe();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let is_pubsub = pubsub.load(SeqCst);
        if !is_pubsub && ctl.reset_next_reply.swap(false, SeqCst) {
            // The reply is lost: returning closes the client's socket, with
            // a reset (zero linger, set when it was accepted).
            ctl.resets.send_modify(|r| *r += 1);
            return;
        }
        if is_pubsub && hold.wait_for(|h| !*h).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
