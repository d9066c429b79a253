//! Soak with faults: four `bank --fenced` processes on one server (Redis,
//! or PostgreSQL), clients depositing at random into a few accounts with
//! random holds, TTLs shorter and longer than the holds, random waits, a
//! few watchdogs and pauses after the last check, while a chaos task
//! SIGSTOPs and SIGCONTs banks at random and restarts the server twice
//! (SIGKILL, a second down, started again on its data).
//!
//! What must hold: every request ends within [`REQUEST_BOUND`] in `200`,
//! `409`, `429` or `503` (never a hang, a connection error, another status
//! or a dead bank), and every account's final balance is the sum of its
//! `200` deposits (lost updates: 0).
//!
//! Ignored by default (minutes long); run it, and read the figures it prints,
//! with `scripts/soak.sh` or
//!
//! ```sh
//! cargo test --all-features --test soak -- --ignored --nocapture          # both servers
//! cargo test --all-features --test soak soak_redis -- --ignored --nocapture
//! ```
//!
//! Knobs (environment): `SOAK_SECS` (at least this long, default 180),
//! `SOAK_DEPOSITS` (at least this many `200` deposits, default 10000),
//! `SOAK_CLIENTS` (concurrent clients, default 32), `SOAK_SEED` (the random
//! seed, printed by every run so a run can be repeated).
#![cfg(any(feature = "redis", feature = "postgres"))]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};

mod common;

use common::bank::{Bank, Http, send_signal};

/// The longest any one request may take: its own wait (≤ 1 s), hold and
/// pause (≤ 0.5 s), its bank being stopped (≤ 2.5 s), the store's timeouts
/// (2 s per call, and up to 2 s resolving a write that got no answer) and
/// the lock backend's, with room to spare. A request past it is a hang.
const REQUEST_BOUND: Duration = Duration::from_secs(30);
const BANKS: usize = 4;
const ACCOUNTS: usize = 8;
/// How long the server stays down in a restart.
const DOWN: Duration = Duration::from_secs(1);
const RESTARTS: usize = 2;

/// A server the soak can kill and start again on its data.
trait Server: Send + 'static {
    fn name(&self) -> &'static str;
    fn bank_args(&self) -> Vec<String>;
    fn kill(&mut self);
    fn restart(&mut self);
}

#[cfg(feature = "redis")]
impl Server for common::redis_server::RedisServer {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn bank_args(&self) -> Vec<String> {
        vec!["--redis".to_owned(), self.url()]
    }
    fn kill(&mut self) {
        common::redis_server::RedisServer::kill(self)
    }
    fn restart(&mut self) {
        common::redis_server::RedisServer::restart(self)
    }
}

#[cfg(feature = "postgres")]
impl Server for common::pg_server::PgServer {
    fn name(&self) -> &'static str {
        "postgres"
    }
    fn bank_args(&self) -> Vec<String> {
        vec!["--postgres".to_owned(), self.url()]
    }
    fn kill(&mut self) {
        common::pg_server::PgServer::kill(self)
    }
    fn restart(&mut self) {
        common::pg_server::PgServer::restart(self)
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: scripts/soak.sh"]
async fn soak_redis() {
    // Durable: a restart keeps what was acknowledged (balances, fences and
    // the fence counters), as a production Redis holding fenced data must.
    let server = common::redis_server::RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ]);
    soak(server).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: scripts/soak.sh"]
async fn soak_postgres() {
    soak(common::pg_server::PgServer::start()).await;
}

/// The knobs, from the environment.
struct Config {
    min_duration: Duration,
    min_deposits: u64,
    clients: usize,
    seed: u64,
}

impl Config {
    fn from_env() -> Config {
        let var = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: not a number")))
                .unwrap_or(default)
        };
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Config {
            min_duration: Duration::from_secs(var("SOAK_SECS", 180)),
            min_deposits: var("SOAK_DEPOSITS", 10_000),
            clients: var("SOAK_CLIENTS", 32) as usize,
            seed: var("SOAK_SEED", clock),
        }
    }
}

/// SplitMix64: enough randomness for picking requests, repeatable by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// What happened, shared by the clients.
#[derive(Default)]
struct Tally {
    /// `"200"`, `"409 STALE_FENCE"`, … → count.
    outcomes: BTreeMap<String, u64>,
    /// Account → sum of its `200` deposits.
    expected: BTreeMap<String, i64>,
    /// Anything outside the promise (kept: the first 20, counted: all).
    failures: Vec<String>,
    failure_count: u64,
    /// Every request's duration.
    latencies: Vec<Duration>,
    /// (start, end) of every `200`, for the recovery times.
    oks: Vec<(Instant, Instant)>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        self.failure_count += 1;
        if self.failures.len() < 20 {
            self.failures.push(what);
        }
    }
}

/// One restart: when the server was killed and when it answered again.
struct Restart {
    killed: Instant,
    back: Instant,
}

async fn soak(server: impl Server) {
    let config = Config::from_env();
    let backend = server.name();
    eprintln!(
        "soak ({backend}): SOAK_SEED={} SOAK_SECS={} SOAK_DEPOSITS={} SOAK_CLIENTS={}",
        config.seed,
        config.min_duration.as_secs(),
        config.min_deposits,
        config.clients
    );
    let mut args = vec!["--fenced".to_owned()];
    args.extend(server.bank_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Their warnings (every 503, every lost lock) would drown the figures.
    let quiet = [("RUST_LOG", std::ffi::OsStr::new("error"))];
    let mut banks: Vec<Bank> = (0..BANKS)
        .map(|_| Bank::start_with_env(&args, &quiet))
        .collect();
    let https: Arc<Vec<Http>> = Arc::new(banks.iter().map(Bank::http).collect());
    let pids: Vec<u32> = banks.iter().map(Bank::pid).collect();

    let tally = Arc::new(Mutex::new(Tally::default()));
    let ok_count = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let mut clients = tokio::task::JoinSet::new();
    for client in 0..config.clients {
        let rng = Rng(config.seed ^ (client as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        clients.spawn(run_client(
            rng,
            https.clone(),
            tally.clone(),
            ok_count.clone(),
            done.clone(),
        ));
    }
    let chaos = tokio::spawn(run_chaos(
        Rng(config.seed.rotate_left(17)),
        server,
        pids,
        config.min_duration,
        done.clone(),
    ));

    // Until both the time and the deposits are reached (or far too long).
    let give_up = config.min_duration * 4;
    while started.elapsed() < config.min_duration
        || ok_count.load(Ordering::Relaxed) < config.min_deposits
    {
        assert!(
            started.elapsed() < give_up,
            "only {} deposits in {give_up:?}",
            ok_count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::Relaxed);
    let (server, restarts, stops) = chaos.await.expect("the chaos task panicked");
    while let Some(joined) = clients.join_next().await {
        joined.expect("a client panicked");
    }
    let elapsed = started.elapsed();

    // Every bank lived through it.
    for (i, bank) in banks.iter_mut().enumerate() {
        assert!(bank.is_running(), "bank {i} died");
    }

    // The balances: the sums of the 200 deposits.
    let tally = Arc::try_unwrap(tally)
        .ok()
        .expect("clients are done")
        .into_inner()
        .unwrap();
    let mut lost = Vec::new();
    for account in 0..ACCOUNTS {
        let id = format!("soak{account}");
        let reply = https[0].get(&format!("/accounts/{id}")).await;
        reply.assert_json(StatusCode::OK);
        let balance = reply.int("balance");
        let expected = tally.expected.get(&id).copied().unwrap_or(0);
        if balance != expected {
            lost.push(format!(
                "{id}: balance {balance}, 200 deposits sum {expected}"
            ));
        }
    }

    report(backend, &config, elapsed, &tally, &restarts, stops, &lost);
    drop(server);
    assert!(
        tally.failure_count == 0,
        "{} requests broke the promise, first ones: {:#?}",
        tally.failure_count,
        tally.failures
    );
    assert!(lost.is_empty(), "lost updates: {lost:#?}");
    assert_eq!(restarts.len(), RESTARTS, "the server was not restarted");
}

/// Deposit at random until `done`.
async fn run_client(
    mut rng: Rng,
    https: Arc<Vec<Http>>,
    tally: Arc<Mutex<Tally>>,
    ok_count: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) {
    let mut backoff = false;
    while !done.load(Ordering::Relaxed) {
        // A client backs off a little after a 503, as real ones do, rather
        // than spin on a server that is down.
        if std::mem::take(&mut backoff) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let http = &https[rng.range(0, BANKS as u64 - 1) as usize];
        let account = format!("soak{}", rng.range(0, ACCOUNTS as u64 - 1));
        let amount = rng.range(1, 100) as i64;
        let hold = if rng.chance(5) {
            rng.range(100, 400)
        } else {
            rng.range(0, 30)
        };
        // TTLs shorter than the hold (the lease runs out mid-deposit) and
        // longer (it does not).
        let ttl = if rng.chance(30) {
            rng.range(10, hold.max(10))
        } else {
            hold + rng.range(100, 2_000)
        };
        let mut path = format!(
            "/accounts/{account}/deposit?amount={amount}&hold_ms={hold}&ttl_ms={ttl}&wait_ms={}",
            rng.range(0, 1_000)
        );
        if rng.chance(10) {
            path.push_str("&watchdog=true");
        }
        if rng.chance(5) {
            path.push_str(&format!("&pause_ms={}", rng.range(1, 100)));
        }

        let start = Instant::now();
        let result =
            tokio::time::timeout(REQUEST_BOUND, http.try_send_with(Method::POST, &path, &[])).await;
        let end = Instant::now();
        let mut tally = tally.lock().unwrap();
        tally.latencies.push(end - start);
        let reply = match result {
            Err(_) => {
                tally.fail(format!("POST {path}: no answer within {REQUEST_BOUND:?}"));
                continue;
            }
            Ok(Err(e)) => {
                tally.fail(format!("POST {path}: {e}"));
                continue;
            }
            Ok(Ok(reply)) => reply,
        };
        let outcome = match reply.status {
            StatusCode::OK => {
                *tally.expected.entry(account).or_default() += amount;
                tally.oks.push((start, end));
                ok_count.fetch_add(1, Ordering::Relaxed);
                "200".to_owned()
            }
            StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS => {
                let code = reply.json["error"]["code"].as_str().unwrap_or("?");
                format!("{} {code}", reply.status.as_u16())
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                let code = reply.json["error"]["code"].as_str().unwrap_or("?");
                backoff = true;
                format!("503 {code}")
            }
            other => {
                tally.fail(format!("POST {path}: {other} {}", reply.json));
                continue;
            }
        };
        *tally.outcomes.entry(outcome).or_default() += 1;
    }
}

/// Stop and continue banks at random, and restart the server twice (at a
/// third and two thirds of the run), until `done`. Leaves every bank
/// running.
async fn run_chaos<S: Server>(
    mut rng: Rng,
    server: S,
    pids: Vec<u32>,
    duration: Duration,
    done: Arc<AtomicBool>,
) -> (S, Vec<Restart>, u64) {
    let started = Instant::now();
    let mut server = Some(server);
    let mut restarts = Vec::new();
    let mut stops = 0;
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.range(500, 2_500))).await;
        let due = duration * (restarts.len() as u32 + 1) / (RESTARTS as u32 + 1);
        if restarts.len() < RESTARTS && started.elapsed() >= due {
            let mut s = server.take().unwrap();
            let killed = Instant::now();
            let s = tokio::task::spawn_blocking(move || {
                s.kill();
                std::thread::sleep(DOWN);
                s.restart();
                s
            })
            .await
            .unwrap();
            restarts.push(Restart {
                killed,
                back: Instant::now(),
            });
            server = Some(s);
            continue;
        }
        let pid = pids[rng.range(0, pids.len() as u64 - 1) as usize];
        send_signal(pid, libc::SIGSTOP);
        tokio::time::sleep(Duration::from_millis(rng.range(100, 2_500))).await;
        send_signal(pid, libc::SIGCONT);
        stops += 1;
    }
    (server.unwrap(), restarts, stops)
}

fn report(
    backend: &str,
    config: &Config,
    elapsed: Duration,
    tally: &Tally,
    restarts: &[Restart],
    stops: u64,
    lost: &[String],
) {
    let requests = tally.latencies.len();
    let mut latencies = tally.latencies.clone();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((requests as f64 * p) as usize).min(requests.saturating_sub(1)))
            .map_or(0, Duration::as_millis)
    };
    println!("\n== soak ({backend}), seed {}", config.seed);
    println!(
        "{requests} requests in {:.0} s ({:.0}/s) from {} clients to {BANKS} banks on {ACCOUNTS} accounts",
        elapsed.as_secs_f64(),
        requests as f64 / elapsed.as_secs_f64(),
        config.clients
    );
    for (outcome, count) in &tally.outcomes {
        println!("  {outcome:<32} {count:>8}");
    }
    println!(
        "  outside the promise (hang, error, other status): {}",
        tally.failure_count
    );
    println!(
        "latency ms: p50 {} p99 {} max {} (the longest any request waited)",
        pct(0.50),
        pct(0.99),
        latencies.last().map_or(0, Duration::as_millis)
    );
    println!("banks stopped and continued: {stops}");
    for (i, restart) in restarts.iter().enumerate() {
        let down = restart.back - restart.killed;
        // The first 200 of a deposit sent after the server was back.
        let recovered = tally
            .oks
            .iter()
            .filter(|(start, _)| *start >= restart.back)
            .map(|(_, end)| *end - restart.back)
            .min();
        println!(
            "restart {}: down {} ms; first 200 deposit {} ms after it was back",
            i + 1,
            down.as_millis(),
            recovered.map_or("never".to_owned(), |d| d.as_millis().to_string())
        );
    }
    println!("lost updates: {}", lost.len());
}
