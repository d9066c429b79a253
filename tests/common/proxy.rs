//! A TCP proxy in front of a test server, with faults under the test's
//! control: reset a client right after the server answered it (the reply is
//! lost, the command was run), hold back traffic of pub/sub or command
//! connections (a slow network, one direction at a time), hold back each
//! connection that carries a given text (a statement about one key stuck
//! in the network, while other connections go on), and cut every open
//! connection so that clients notice only when they next send (a pooler or
//! NAT that dropped them, a server restart not yet seen).
//!
//! Protocol-neutral but for the pub/sub detection (Redis' `SUBSCRIBE`): it
//! serves PostgreSQL tests as well.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

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
    /// Command connections numbered below this lose what the server sends
    /// them (see [`Proxy::blackhole_open_replies`]).
    blackhole_below: std::sync::atomic::AtomicUsize,
    /// Connections accepted so far (each is numbered in that order).
    accepted: std::sync::atomic::AtomicUsize,
    /// Client writes that arrived on a command connection while it was held.
    held_writes: watch::Sender<usize>,
    resets: watch::Sender<usize>,
    /// Bumped by [`Proxy::sever_all`]: connections accepted under an older
    /// value are cut.
    epoch: watch::Sender<u64>,
    /// See [`Proxy::hold_carrying`].
    needle: Mutex<Option<Vec<u8>>>,
    /// Client chunks that carried the needle.
    carried: watch::Sender<usize>,
    /// For each of them, the number of the held connection it came on.
    carriers: Mutex<Vec<usize>>,
    /// Per connection held for the needle, in the order they were held:
    /// whether it was let go.
    held: watch::Sender<Vec<bool>>,
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
            blackhole_below: std::sync::atomic::AtomicUsize::new(0),
            held_writes: watch::Sender::new(0),
            resets: watch::Sender::new(0),
            epoch: watch::Sender::new(0),
            needle: Mutex::new(None),
            carried: watch::Sender::new(0),
            carriers: Mutex::new(Vec::new()),
            held: watch::Sender::new(Vec::new()),
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

impl Proxy {
    /// From now on, what the server sends on the command connections open
    /// now is lost, silently (a half-open socket: the server ran what it
    /// got, the client never hears); connections opened later pass.
    pub fn blackhole_open_replies(&self) {
        self.ctl
            .blackhole_below
            .store(self.ctl.accepted.load(SeqCst), SeqCst);
    }

    /// `postgres://postgres@127.0.0.1:<proxy port>/postgres`.
    pub fn postgres_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Cut every connection open now: its server side is closed at once
    /// (the server ends the session), its client side is left open and
    /// silent, and reset when the client next sends. A client learns that
    /// the connection is dead only by using it. Later connections pass.
    pub fn sever_all(&self) {
        self.ctl.epoch.send_modify(|e| *e += 1);
    }

    /// From now on, a connection whose client sends `needle` is held: that
    /// chunk and everything after it waits (client → server) until the
    /// connection is let go. Each connection is held on its own, numbered
    /// in the order they were held.
    pub fn hold_carrying(&self, needle: &[u8]) {
        *self.ctl.needle.lock().unwrap() = Some(needle.to_vec());
    }

    /// Wait until clients sent `n` chunks carrying the needle.
    pub async fn carried(&self, n: usize) {
        let mut rx = self.ctl.carried.subscribe();
        rx.wait_for(|c| *c >= n).await.expect("proxy alive");
    }

    /// The held connection (its number) chunk `n` carrying the needle
    /// came on (0: the first chunk).
    pub fn carrier(&self, n: usize) -> usize {
        self.ctl.carriers.lock().unwrap()[n]
    }

    /// How many connections were held for the needle.
    pub fn held_connections(&self) -> usize {
        self.ctl.held.borrow().len()
    }

    /// Let held connection `i` (0: the first held) go on.
    pub fn let_go(&self, i: usize) {
        self.ctl.held.send_modify(|h| h[i] = true);
    }

    /// Let every held connection go on, and hold no more.
    pub fn let_go_all(&self) {
        *self.ctl.needle.lock().unwrap() = None;
        self.ctl
            .held
            .send_modify(|h| h.iter_mut().for_each(|g| *g = true));
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
    // PING; a PostgreSQL one, `LISTEN` and empty keep-alive queries).
    let pubsub = Arc::new(AtomicBool::new(false));
    let epoch = *ctl.epoch.borrow();
    // Told when the client side's task ends (a severed connection's client
    // sent again, or left): the client is reset then.
    let spoke = Arc::new(tokio::sync::Notify::new());
    let up = tokio::spawn({
        let (ctl, pubsub, spoke) = (ctl.clone(), pubsub.clone(), spoke.clone());
        async move {
            upstream(ctl, number, pubsub, client_rx, server_tx, epoch).await;
            // (Also when the client left on its own.)
            spoke.notify_one();
        }
    });
    downstream(ctl, number, pubsub, server_rx, client_tx, (epoch, spoke)).await;
    up.abort();
}

/// Resolves once the proxy is told to sever connections of `epoch`.
async fn severed(ctl: &Ctl, epoch: u64) {
    let mut rx = ctl.epoch.subscribe();
    let _ = rx.wait_for(|e| *e > epoch).await;
}

/// Client → server. Read as it comes (so that what waits can be counted),
/// forwarded in order once no hold applies.
async fn upstream(
    ctl: Arc<Ctl>,
    number: usize,
    pubsub: Arc<AtomicBool>,
    mut from: OwnedReadHalf,
    to: OwnedWriteHalf,
    epoch: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut to = Some(to);
    // This connection's number among those held for the needle, and what
    // the client sent while it is held (it goes on reading and counting).
    let mut held: Option<usize> = None;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let read = tokio::select! {
            biased;
            () = severed(&ctl, epoch), if to.is_some() => {
                // The server side goes (the server sees the client leave);
                // the client finds out when it next sends.
                to = None;
                continue;
            }
            alive = free(&ctl, number, held, &pubsub), if !pending.is_empty() => {
                if !alive {
                    return;
                }
                let Some(to) = to.as_mut() else { return };
                if to.write_all(&std::mem::take(&mut pending)).await.is_err() {
                    return;
                }
                continue;
            }
            read = from.read(&mut buf) => read,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let Some(to) = to.as_mut() else {
            // Severed: what the client sent is lost, and it is reset.
            return;
        };
        let chunk = &buf[..n];
        // (tower-lock's PostgreSQL `LISTEN` makes a connection pub/sub too.)
        if contains(chunk, b"SUBSCRIBE") || contains(chunk, b"LISTEN tower_lock_") {
            pubsub.store(true, SeqCst);
        }
        let carries = ctl
            .needle
            .lock()
            .unwrap()
            .as_deref()
            .is_some_and(|needle| contains(chunk, needle));
        if carries && held.is_none() {
            ctl.held.send_modify(|h| {
                held = Some(h.len());
                h.push(false);
            });
        }
        if carries {
            ctl.carriers.lock().unwrap().extend(held);
            ctl.carried.send_modify(|c| *c += 1);
        }
        let commands_held = commands_held(&ctl, number, &pubsub);
        if commands_held {
            ctl.held_writes.send_modify(|w| *w += 1);
        }
        if commands_held || held.is_some_and(|i| !ctl.held.borrow()[i]) || !pending.is_empty() {
            pending.extend_from_slice(chunk);
            continue;
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Whether a command connection's client→server data waits now.
fn commands_held(ctl: &Ctl, number: usize, pubsub: &AtomicBool) -> bool {
    !pubsub.load(SeqCst) && (*ctl.hold_commands.borrow() || number < *ctl.hold_below.borrow())
}

/// Resolves once nothing holds this connection's client→server data: its
/// needle hold (if any) let go and no command hold applies; false once the
/// proxy is gone.
async fn free(ctl: &Ctl, number: usize, held: Option<usize>, pubsub: &AtomicBool) -> bool {
    let mut let_go = ctl.held.subscribe();
    let mut hold = ctl.hold_commands.subscribe();
    let mut below = ctl.hold_below.subscribe();
    loop {
        let needle_held = held.is_some_and(|i| !let_go.borrow_and_update()[i]);
        hold.borrow_and_update();
        below.borrow_and_update();
        if !needle_held && !commands_held(ctl, number, pubsub) {
            return true;
        }
        let changed = tokio::select! {
            c = let_go.changed() => c,
            c = hold.changed() => c,
            c = below.changed() => c,
        };
        if changed.is_err() {
            return false;
        }
    }
}

/// Server → client.
async fn downstream(
    ctl: Arc<Ctl>,
    number: usize,
    pubsub: Arc<AtomicBool>,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    (epoch, spoke): (u64, Arc<tokio::sync::Notify>),
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut hold = ctl.hold_pubsub.subscribe();
    loop {
        let read = tokio::select! {
            biased;
            () = severed(&ctl, epoch) => {
                // Nothing more reaches the client, which is reset (both
                // halves dropped, zero linger) once it sends.
                spoke.notified().await;
                return;
            }
            read = from.read(&mut buf) => read,
        };
        let n = match read {
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
        if !is_pubsub && number < ctl.blackhole_below.load(SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
