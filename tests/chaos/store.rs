//! The fenced store the clients share (the bank's fenced store as a model):
//! a value per key and the highest fence seen. A read claims its fence (so a
//! stale holder cannot write between a newer holder's read and write), a
//! write with a lower fence than the key's is refused. Also a queue of lock
//! tokens, for hand-offs between processes.
//!
//! Served by the run's coordinator over TCP, one line per request:
//! `R key fence` → `OK value` | `STALE`; `W key fence value` → `OK` |
//! `STALE`; `PUSH token-json` → `OK`; `POP` → `TOKEN json` | `EMPTY`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Default)]
struct Cell {
    value: u64,
    fence: u64,
    accepted_writes: u64,
}

#[derive(Default)]
struct State {
    cells: BTreeMap<String, Cell>,
    tokens: VecDeque<String>,
}

/// The store, served on a free port until dropped.
pub struct Store {
    pub port: u16,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Store {
    pub async fn start() -> Store {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind store");
        let port = listener.local_addr().expect("store addr").port();
        let state: Arc<Mutex<State>> = Arc::default();
        let task = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((conn, _)) = listener.accept().await {
                    let _ = conn.set_nodelay(true);
                    tokio::spawn(serve(state.clone(), conn));
                }
            }
        });
        Store { port, state, task }
    }

    /// Every key: (key, value, accepted writes).
    pub fn snapshot(&self) -> Vec<(String, u64, u64)> {
        let state = self.state.lock().unwrap();
        state
            .cells
            .iter()
            .map(|(k, c)| (k.clone(), c.value, c.accepted_writes))
            .collect()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(state: Arc<Mutex<State>>, conn: TcpStream) {
    let (rx, mut tx) = conn.into_split();
    let mut lines = BufReader::new(rx).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = answer(&state, &line);
        if tx.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn answer(state: &Mutex<State>, line: &str) -> String {
    let mut state = state.lock().unwrap();
    let mut parts = line.splitn(4, ' ');
    match parts.next() {
        Some("R") => {
            let (Some(key), Some(fence)) = (parts.next(), parts.next()) else {
                return "ERR\n".into();
            };
            let fence: u64 = fence.parse().unwrap_or(0);
            let cell = state.cells.entry(key.to_owned()).or_default();
            if fence < cell.fence {
                return "STALE\n".into();
            }
            cell.fence = fence;
            format!("OK {}\n", cell.value)
        }
        Some("W") => {
            let (Some(key), Some(fence), Some(value)) = (parts.next(), parts.next(), parts.next())
            else {
                return "ERR\n".into();
            };
            let fence: u64 = fence.parse().unwrap_or(0);
            let cell = state.cells.entry(key.to_owned()).or_default();
            if fence < cell.fence {
                return "STALE\n".into();
            }
            cell.fence = fence;
            cell.value = value.parse().unwrap_or(0);
            cell.accepted_writes += 1;
            "OK\n".into()
        }
        Some("PUSH") => {
            let rest: Vec<&str> = parts.collect();
            state.tokens.push_back(rest.join(" "));
            "OK\n".into()
        }
        Some("POP") => match state.tokens.pop_front() {
            Some(token) => format!("TOKEN {token}\n"),
            None => "EMPTY\n".into(),
        },
        _ => "ERR\n".into(),
    }
}

/// What the store answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Ok(u64),
    Stale,
    Token(String),
    Empty,
    Failed,
}

/// One connection to the store.
pub struct StoreClient {
    rx: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    tx: OwnedWriteHalf,
}

impl StoreClient {
    pub async fn connect(port: u16) -> StoreClient {
        let conn = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to the store");
        let _ = conn.set_nodelay(true);
        let (rx, tx) = conn.into_split();
        StoreClient {
            rx: BufReader::new(rx).lines(),
            tx,
        }
    }

    async fn call(&mut self, line: String) -> Answer {
        let exchange = async {
            self.tx.write_all(line.as_bytes()).await.ok()?;
            self.rx.next_line().await.ok()?
        };
        let Ok(Some(reply)) = tokio::time::timeout(Duration::from_secs(5), exchange).await else {
            return Answer::Failed;
        };
        match reply.split_once(' ') {
            Some(("OK", v)) => Answer::Ok(v.parse().unwrap_or(0)),
            Some(("TOKEN", t)) => Answer::Token(t.to_owned()),
            _ if reply == "OK" => Answer::Ok(0),
            _ if reply == "STALE" => Answer::Stale,
            _ if reply == "EMPTY" => Answer::Empty,
            _ => Answer::Failed,
        }
    }

    pub async fn read(&mut self, key: &str, fence: u64) -> Answer {
        self.call(format!("R {key} {fence}\n")).await
    }

    pub async fn write(&mut self, key: &str, fence: u64, value: u64) -> Answer {
        self.call(format!("W {key} {fence} {value}\n")).await
    }

    pub async fn push(&mut self, token: &str) -> Answer {
        self.call(format!("PUSH {token}\n")).await
    }

    pub async fn pop(&mut self) -> Answer {
        self.call("POP\n".to_owned()).await
    }
}
