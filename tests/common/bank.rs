//! The bank example as a process: build it (cargo is a no-op when fresh) and start it, talk to it
//! over HTTP, read its JSON. For the tests that drive it as a client would.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

// ---------------------------------------------------------------------------
// The bank process

/// A running bank; killed when dropped.
pub struct Bank {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Bank {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGSTOP the process: it freezes mid-whatever, as a long GC pause or a
    /// swapped-out process would. Its sockets stay open.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT a stopped process.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        send_signal(self.pid(), signal);
    }

    /// Whether the process is still running (not exited or crashed).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn start() -> Bank {
        Bank::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Bank {
        Bank::start_with_env(extra, &[])
    }

    pub fn start_with_env(extra: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Bank {
        let mut child = Command::new(bank_binary())
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the bank example");
        let stdout = child.stdout.take().unwrap();
        // From here on a panic kills the process.
        let mut bank = Bank {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        };

        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Keep draining so the bank never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Some(Ok(line))) => line,
            Ok(other) => panic!("bank exited before listening: {other:?}"),
            Err(_) => panic!("bank did not print `listening on ADDR` within 30 s"),
        };
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        bank.addr = addr
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("not an address: {addr:?}"));
        bank
    }

    pub fn http(&self) -> Http {
        Http {
            client: Client::builder(TokioExecutor::new()).build({
                let mut connector = HttpConnector::new();
                // No Nagle: small requests go out at once, as real clients do.
                connector.set_nodelay(true);
                connector
            }),
            base: format!("http://{}", self.addr),
        }
    }
}

impl Drop for Bank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kill(2): send `signal` to process `pid` (a bank this test started).
pub fn send_signal(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) takes two integers; no memory is involved.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
}

// ---------------------------------------------------------------------------
// A small HTTP client

#[derive(Clone)]
pub struct Http {
    pub client: Client<HttpConnector, Empty<Bytes>>,
    pub base: String,
}

impl Http {
    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path).await
    }

    pub async fn post(&self, path: &str) -> Reply {
        self.send(Method::POST, path).await
    }

    pub async fn send(&self, method: Method, path: &str) -> Reply {
        self.send_with(method, path, &[]).await
    }

    pub async fn send_with(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.try_send_with(method.clone(), path, headers)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// [`Http::send_with`], with a failed exchange (no answer, a broken
    /// connection, a body that is not JSON) as an `Err`.
    pub async fn try_send_with(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Empty::new()).unwrap();
        let res = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = res.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        let json = serde_json::from_slice(&body).map_err(|_| {
            format!(
                "{} with a non-JSON body {:?}",
                parts.status,
                String::from_utf8_lossy(&body)
            )
        })?;
        Ok(Reply {
            what: format!("{method} {path}"),
            status: parts.status,
            headers: parts.headers,
            json,
        })
    }
}

#[derive(Debug)]
pub struct Reply {
    pub what: String,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub json: Value,
}

impl Reply {
    pub fn assert_json(&self, status: StatusCode) {
        assert_eq!(self.status, status, "{}: {}", self.what, self.json);
        let content_type = self.headers.get(header::CONTENT_TYPE);
        assert_eq!(
            content_type.and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{}",
            self.what
        );
    }

    pub fn int(&self, field: &str) -> i64 {
        self.json[field]
            .as_i64()
            .unwrap_or_else(|| panic!("{}: no integer `{field}` in {}", self.what, self.json))
    }

    pub fn uint(&self, field: &str) -> u64 {
        self.json[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: no integer `{field}` in {}", self.what, self.json))
    }

    pub fn error_code(&self) -> &str {
        self.json["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: not a JSON error: {}", self.what, self.json))
    }
}

// ---------------------------------------------------------------------------
// Finding (and if needed building) the example binary

pub fn bank_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("BANK_BIN") {
        Some(path) => PathBuf::from(path),
        None => example_binary("bank"),
    })
    .clone()
}

/// Every feature of the crate (but `default`), and whether this test binary
/// has it. A feature missing here makes the example a build of its own,
/// minutes on a busy machine (`every_feature_reaches_the_example_build`).
pub const FEATURES: &[(&str, bool)] = &[
    ("redis", cfg!(feature = "redis")),
    ("redis-cluster", cfg!(feature = "redis-cluster")),
    ("redis-tls", cfg!(feature = "redis-tls")),
    ("admin", cfg!(feature = "admin")),
    ("postgres", cfg!(feature = "postgres")),
    ("postgres-tls", cfg!(feature = "postgres-tls")),
    ("metrics", cfg!(feature = "metrics")),
    ("etcd", cfg!(feature = "etcd")),
    ("etcd-tls", cfg!(feature = "etcd-tls")),
    ("apalis", cfg!(feature = "apalis")),
];

/// The binary of example `name`, built by cargo (into the same target dir
/// and profile as this test) if it is not fresh.
pub fn example_binary(name: &str) -> PathBuf {
    // This test runs as target/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps");
    let bin = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    // Always ask cargo: a no-op when the binary is fresh, and the only
    // check that also sees a binary built with other features.
    build_example(profile_dir, name);
    assert!(bin.is_file(), "no example binary at {}", bin.display());
    bin
}

/// `cargo build --example <name>` into the same target dir and profile as
/// this test.
pub fn build_example(profile_dir: &Path, name: &str) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--example", name, "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    // Exactly this test binary's features, so cargo reuses the library it
    // already built instead of compiling another variant.
    let features: Vec<&str> = FEATURES
        .iter()
        .filter_map(|&(name, on)| on.then_some(name))
        .collect();
    cmd.arg("--no-default-features");
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    // target/<profile>, or target/<triple>/<profile> when cross-compiling.
    let mut target_dir = profile_dir.parent().expect("target dir");
    if !target_dir.join("CACHEDIR.TAG").exists()
        && let Some(root) = target_dir.parent()
        && root.join("CACHEDIR.TAG").exists()
    {
        cmd.arg("--target").arg(target_dir.file_name().unwrap());
        target_dir = root;
    }
    cmd.arg("--target-dir").arg(target_dir);
    let out = cmd.output().expect("run cargo build --example");
    assert!(
        out.status.success(),
        "cargo build --example {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// Helpers the bank tests share

/// The admin token the tests start banks with, and its header.
pub const ADMIN_TOKEN: &str = "t0ken";
pub const AUTH: (&str, &str) = ("authorization", "Bearer t0ken");

/// Upper bound for any one test, so a wedged server fails instead of hanging.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

pub async fn within_timeout(test: impl std::future::Future<Output = ()>) {
    // Built (or found fresh) before the clock starts: a first build on a
    // busy machine can take minutes, and is not the test's to time.
    bank_binary();
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test timed out");
}

/// POST `path` in a task of its own.
pub fn spawn_post(http: &Http, path: &str) -> tokio::task::JoinHandle<Reply> {
    let (http, path) = (http.clone(), path.to_owned());
    tokio::spawn(async move { http.post(&path).await })
}

/// Wait until the admin API reports `key` locked, or until `holder` (the
/// request that takes it) has finished: whether the lock was seen. A lock
/// of a short TTL can come and go unseen while a stalled machine answers
/// no poll (builds beside the tests); the caller then has no scenario.
#[allow(dead_code)]
pub async fn seen_locked(http: &Http, key: &str, holder: &tokio::task::JoinHandle<Reply>) -> bool {
    loop {
        let finished = holder.is_finished();
        if is_locked(http, key).await {
            return true;
        }
        if finished {
            return false;
        }
        tokio::task::yield_now().await;
    }
}

/// Run `scenario` for attempt 0, 1, ... until it happened: `None` means the
/// holder's lock came and went unseen, or ran out between its grant and its
/// handler (`LOCK_EXPIRED`,
/// nothing written: a machine stalled through the short TTL there), so
/// nothing the scenario is about took place; it starts again on fresh
/// accounts.
pub async fn until_it_happened<F: Future<Output = Option<()>>>(mut scenario: impl FnMut(u32) -> F) {
    for attempt in 0..5 {
        if scenario(attempt).await.is_some() {
            return;
        }
        eprintln!(
            "attempt {attempt}: the holder's lock went unseen or ran out before its handler; again"
        );
    }
    panic!("the holder's handler never ran in 5 attempts");
}

/// `None` (see [`until_it_happened`]) if `stale`'s handler never ran.
pub fn handler_ran(stale: &Reply) -> Option<()> {
    let expired = stale.status == StatusCode::TOO_MANY_REQUESTS
        && stale.json["error"]["code"] == "LOCK_EXPIRED";
    (!expired).then_some(())
}

/// Whether the admin API reports `key` locked now.
async fn is_locked(http: &Http, key: &str) -> bool {
    let status = http
        .send_with(Method::GET, &format!("/admin/locks/{key}"), &[AUTH])
        .await;
    status.assert_json(StatusCode::OK);
    status.json["locked"] == true
}

/// Wait until the admin API (of a bank started with [`ADMIN_TOKEN`]) reports
/// `key` locked: the holder's handler runs.
pub async fn wait_until_locked(http: &Http, key: &str) {
    while !is_locked(http, key).await {
        tokio::task::yield_now().await;
    }
}
