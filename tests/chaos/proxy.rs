//! A TCP proxy between the clients and the server, with faults on command:
//! reset every connection, reset the next connection that gets a reply
//! (the server ran the command, the reply is lost), or hold back what
//! clients send for a while (a slow network). Protocol-blind: Redis and
//! PostgreSQL alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Proxy {
    pub port: u16,
    ctl: Arc<Ctl>,
    task: JoinHandle<()>,
}

struct Ctl {
    upstream: u16,
    /// Bumped to reset every live connection.
    generation: watch::Sender<u64>,
    drop_next_reply: AtomicBool,
    hold: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let ctl = Arc::new(Ctl {
            upstream,
            generation: watch::Sender::new(0),
            drop_next_reply: AtomicBool::new(false),
            hold: watch::Sender::new(false),
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

    pub fn reset_all(&self) {
        self.ctl.generation.send_modify(|g| *g += 1);
    }

    pub fn drop_next_reply(&self) {
        self.ctl.drop_next_reply.store(true, SeqCst);
    }

    pub fn hold(&self, on: bool) {
        self.ctl.hold.send_replace(on);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.reset_all();
    }
}

async fn connection(ctl: Arc<Ctl>, client: TcpStream) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", ctl.upstream)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    // Closed with a reset: the client sees a broken connection.
    let _ = client.set_zero_linger();
    let _ = server.set_nodelay(true);
    let _ = server.set_zero_linger();
    let mut reset = ctl.generation.subscribe();
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    tokio::select! {
        _ = up(ctl.clone(), client_rx, server_tx) => {}
        _ = down(ctl.clone(), server_rx, client_tx) => {}
        _ = reset.changed() => {}
    }
}

async fn up(ctl: Arc<Ctl>, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut hold = ctl.hold.subscribe();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if hold.wait_for(|h| !*h).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn down(ctl: Arc<Ctl>, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if ctl.drop_next_reply.swap(false, SeqCst) {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
