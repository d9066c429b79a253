//! What the watchdog's renewals cost (issue 27): 200 watched locks (TTL
//! 900 ms, so a round every 300 ms) for 6 s, on one Redis and on a
//! 3-primary cluster. Prints the renewals the servers ran, their socket
//! reads per node and round (about one when a round's renewals go out
//! together: one round trip per node), and this process's CPU time per
//! renewal. A measurement, not a check:
//!
//!     cargo test --release --all-features --test renewal_cost -- --ignored --nocapture
#![cfg(feature = "redis-cluster")]

mod common;

use std::time::Duration;

use common::redis_cluster::RedisCluster;
use common::redis_server::RedisServer;
use tower_lock::backend::redis::RedisBackend;
use tower_lock::{JobSpec, OwnedLock, SharedBackend};

const LOCKS: usize = 200;
const TTL: Duration = Duration::from_millis(900);
const RUN: Duration = Duration::from_secs(6);

/// User + system CPU time of this process.
fn cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Scripts run (`EVALSHA` calls) and socket reads by the servers at
/// `ports`, summed.
fn counters(cmd: &dyn Fn(u16, &[&str]) -> String, ports: &[u16]) -> (u64, u64) {
    let field = |text: &str, prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|r| r.split(',').next()?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    ports.iter().fold((0, 0), |(scripts, reads), &p| {
        let stats = cmd(p, &["INFO", "commandstats"]);
        let io = cmd(p, &["INFO", "stats"]);
        (
            scripts + field(&stats, "cmdstat_evalsha:calls="),
            reads + field(&io, "total_reads_processed:"),
        )
    })
}

async fn measure(name: &str, backend: RedisBackend, nodes: usize, count: impl Fn() -> (u64, u64)) {
    let shared = SharedBackend::new(backend);
    let mut locks = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        let spec = JobSpec::new(format!("renew-{i}"), TTL);
        let mut lock = OwnedLock::acquire(shared.clone(), &spec).await.unwrap();
        lock.start_watchdog();
        locks.push(lock);
    }
    let (cpu0, (n0, r0)) = (cpu(), count());
    tokio::time::sleep(RUN).await;
    let (cpu1, (n1, r1)) = (cpu(), count());
    let renewals = n1 - n0;
    assert!(
        locks.iter().all(|l| !l.is_lost()),
        "{name}: a lock was lost"
    );
    let rounds = RUN.as_secs_f64() / (TTL.as_secs_f64() / 3.0);
    println!(
        "{name}: {renewals} renewals in {RUN:?}, {:.1} server reads per node per round \
         (the INFO calls included), {:.1} µs CPU per renewal",
        (r1 - r0) as f64 / (nodes as f64 * rounds),
        (cpu1 - cpu0).as_secs_f64() * 1e6 / renewals as f64
    );
    OwnedLock::release_all(locks).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn renewal_cost() {
    let server = RedisServer::start();
    let port = server.port();
    measure(
        "one server",
        RedisBackend::from_url(&server.url()).unwrap(),
        1,
        || {
            counters(
                &|p, a| common::redis_server::command(p, a).unwrap(),
                &[port],
            )
        },
    )
    .await;

    let cluster = RedisCluster::start();
    let primaries = cluster.primaries();
    measure(
        "cluster",
        RedisBackend::from_cluster_urls(cluster.urls().iter().map(String::as_str)).unwrap(),
        primaries.len(),
        || counters(&|p, a| cluster.cmd(p, a), &primaries),
    )
    .await;
}
