//! `examples/apalis_jobs.rs` as processes: a web and a worker on a private
//! redis-server (the locks and apalis's queue), driven over HTTP as a client
//! would. Each task is gated (it waits, once running, for a push to
//! `go:report:{id}`), so the test sees the lock while the task runs: the
//! lock's fence moves when the worker restores it, a second request is
//! refused, and once the task is done, failed or panicked the lock is free.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use common::bank::{Http, Reply, example_binary};
use common::redis_server::RedisServer;

/// Upper bound for any one wait (a line, a state), so a wedged process fails
/// the test instead of hanging it. Generous: two processes share a busy
/// machine with the test.
const BOUND: Duration = Duration::from_secs(30);

/// A process of the example, killed on drop; its stdout as lines.
struct Proc {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Proc {
    fn spawn(bin: &Path, args: &[&str]) -> Proc {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the apalis_jobs example");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line that starts with `prefix` (lines before it are kept
    /// for the failure message).
    async fn line(&mut self, prefix: &str) -> String {
        loop {
            match tokio::time::timeout(BOUND, self.lines.recv()).await {
                Ok(Some(line)) if line.starts_with(prefix) => return line,
                Ok(Some(line)) => self.seen.push(line),
                Ok(None) => panic!("exited before {prefix:?}; said {:?}", self.seen),
                Err(_) => panic!("no {prefix:?} within {BOUND:?}; said {:?}", self.seen),
            }
        }
    }

    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http(addr: &str) -> Http {
    Http {
        client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        base: format!("http://{addr}"),
    }
}

/// Ask the web about report `id`'s lock until `done` says so; its answer.
async fn until(http: &Http, id: &str, what: &str, done: impl Fn(&Reply) -> bool) -> Reply {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let status = http.get(&format!("/reports/{id}")).await;
        status.assert_json(StatusCode::OK);
        if done(&status) {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "report {id}: not {what} within {BOUND:?}: {}",
            status.json
        );
        tokio::task::yield_now().await;
    }
}

/// A web and a worker on one private Redis.
struct Demo {
    redis: RedisServer,
    web: Proc,
    worker: Proc,
    http: Http,
}

impl Demo {
    async fn start() -> Demo {
        // Built (or found fresh) before anything is timed.
        let bin = example_binary("apalis_jobs");
        let redis = RedisServer::start();
        let url = redis.url();
        let mut worker = Proc::spawn(&bin, &["--role", "worker", "--redis", &url]);
        worker.line("worker ready").await;
        let mut web = Proc::spawn(
            &bin,
            &["--role", "web", "--redis", &url, "--listen", "127.0.0.1:0"],
        );
        let listening = web.line("listening on ").await;
        let http = http(listening.trim_start_matches("listening on ").trim());
        Demo {
            redis,
            web,
            worker,
            http,
        }
    }

    /// Queue a gated task for report `id`, wait until the worker runs it
    /// (restored: the lock's fence moved), check that the report is refused
    /// meanwhile, let the task go and wait for the worker to say `then`.
    async fn run_gated(&mut self, id: &str, knobs: &str, then: &str) {
        let queued = self
            .http
            .post(&format!("/reports/{id}?gate=1{knobs}"))
            .await;
        queued.assert_json(StatusCode::ACCEPTED);
        let fence = queued.uint("fence");

        // Held from the request to the task: never free in between.
        let running = until(&self.http, id, "restored by the worker", |s| {
            assert_eq!(s.json["locked"], true, "report {id} came free: {}", s.json);
            s.uint("fence") != fence
        })
        .await
        .uint("fence");
        assert!(running > fence, "a restore claims under a newer fence");
        let said = self
            .worker
            .line(&format!("task report {id}: running"))
            .await;
        assert_eq!(
            said,
            format!("task report {id}: running under fence {running}")
        );

        let busy = self.http.post(&format!("/reports/{id}")).await;
        busy.assert_json(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.error_code(), "LOCK_ACQUISITION_FAILED");

        self.redis.cmd(&["RPUSH", &format!("go:report:{id}"), "1"]);
        self.worker.line(&format!("task report {id}: {then}")).await;
    }

    async fn assert_comes_free(&self, id: &str) {
        until(&self.http, id, "released", |s| s.json["locked"] == false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_holds_the_requests_lock_until_it_is_done_fails_or_panics() {
    let mut demo = Demo::start().await;
    for (id, knobs, then) in [
        ("7", "", "done"),
        ("8", "&then=fail", "failing"),
        ("9", "&then=panic", "panicking"),
    ] {
        demo.run_gated(id, knobs, then).await;
        demo.assert_comes_free(id).await;

        // Free for the next request, whose task runs at once.
        let again = demo.http.post(&format!("/reports/{id}")).await;
        again.assert_json(StatusCode::ACCEPTED);
        demo.worker.line(&format!("task report {id}: done")).await;
        demo.assert_comes_free(id).await;
    }
    assert!(
        demo.worker.is_running(),
        "a panicking task is the task's end, not the worker's"
    );
    assert!(demo.web.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_request_is_a_json_400_and_keeps_no_lock() {
    let demo = Demo::start().await;
    for knobs in ["then=later", "gate=yes"] {
        let bad = demo.http.post(&format!("/reports/5?{knobs}")).await;
        bad.assert_json(StatusCode::BAD_REQUEST);
        assert_eq!(bad.error_code(), "BAD_REQUEST");
        // Refused after the layer took the lock: released with the response.
        demo.assert_comes_free("5").await;
    }
}

#[test]
fn a_missing_role_prints_usage_and_exits_2() {
    let out = Command::new(example_binary("apalis_jobs"))
        .stdin(Stdio::null())
        .output()
        .expect("run the example");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("usage"), "stderr: {stderr}");
}
