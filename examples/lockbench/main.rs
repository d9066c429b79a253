//! lockbench: tower-lock measured the way other lock libraries were (the
//! workloads and accounting are defined in `BENCHMARKS.md`), one JSON line
//! per run.
//!
//! ```sh
//! cargo run --release --example lockbench -- --backend memory --workload serial --seconds 5
//! cargo run --release --example lockbench -- --backend redis://127.0.0.1:6390 --workload contended16 --seconds 5
//! cargo run --release --features postgres --example lockbench -- --backend postgres://postgres@127.0.0.1:5433/postgres --workload serial --seconds 5
//! cargo run --release --features etcd --example lockbench -- --backend etcd://127.0.0.1:2379,127.0.0.1:22379,127.0.0.1:32379 --workload serial --seconds 5
//! ```
//!
//! Prints exactly one JSON line on stdout; progress and errors go to stderr.
//! Bad flags: usage on stderr, exit status 2. A run that cannot start (server
//! unreachable, backend missing from this build): message on stderr, exit 1.
//!
//! # Which API
//!
//! `serial`, `parallel32`, `contended16` and `held` take their locks the way
//! a background job would: [`OwnedLock::acquire`] with a global
//! [`LockSpec`] (a random owner token per acquisition), then
//! [`OwnedLock::release`]. `--api backend` runs the same loops one layer
//! down, on [`LockBackend::acquire`]/[`LockBackend::release`] with an
//! [`AcquireRequest`], to split the cost between the handle and the backend.
//! `http` goes through [`LockLayer`] on an axum route; `raw-*` use the redis
//! client directly (no tower-lock at all).
//!
//! # Accounting (identical to the peers)
//!
//! 200 uncontended warm-up cycles before timing. Window = `--seconds`. `ops`
//! = cycles that completed (released) inside the window, `ops_per_s = ops /
//! seconds`. Workers start no cycle after the window; the ones in flight
//! finish ("drain", in `elapsed_s`, not in `ops`). Latency samples are the
//! successful cycles *started* in the window (drain included); nearest-rank
//! p50/p99. Failures are counted in `errors`, not in the percentiles. The
//! runtime is tokio multi-thread with 2 workers, like the raw-rust peer.
//!
//! # Workloads beyond the peers'
//!
//! - `http`: an axum app on 127.0.0.1:0 in this process, `GET /locked/{id}`
//!   behind [`LockLayer`] (key `req:{id}`, a distinct id per request) and
//!   `GET /open/{id}` without it; 32 client tasks, each with its own
//!   keep-alive HTTP/1 connection (hyper), S seconds on each route. The two
//!   routes alternate in slices of about 0.5 s (A B, B A, ...) so a change
//!   in the shared machine's load cannot bias the ratio; each slice opens
//!   fresh connections and warms them up first. Then the same with ONE
//!   connection for S/2 seconds each (`one_conn_*`): the latency the layer
//!   adds to an unloaded server, where the 32-connection p50 is queueing.
//!   `unlocked_ops`, `one_conn_ops`, `one_conn_unlocked_ops`: requests
//!   counted per phase (with `ops`), to divide a `perf stat` of one side by.
//! - `held`: `serial` while 1,000,000 (memory) / 100,000 (Redis) other keys
//!   are held, pre-filled through `LockBackend::acquire` by 32 tasks, as a
//!   ratio to `serial` on an empty backend measured in the same run. Memory:
//!   the empty backend is a second `MemoryBackend`; Redis: the same server's
//!   next database (`/N+1`, an empty keyspace of its own). The two alternate
//!   in slices after the pre-fill.
//! - `raw-serial`, `raw-parallel32` (Redis only): the same loops on the redis
//!   client alone, one shared `MultiplexedConnection`: `SET key token NX PX
//!   30000`, then `EVALSHA` of a compare-and-delete script loaded before
//!   timing. On Redis, `serial` and `parallel32` also run that raw loop in
//!   alternating slices of the same run (`raw_*`, `ratio_to_raw`: S seconds
//!   each), so the ratio does not carry the drift between two runs. Every
//!   Redis run also reports `rtt_p50_us`/`rtt_p99_us`: 2,000 back-to-back
//!   PINGs before the warm-up. Redis `contended16` adds `idle_rtt_p50_us`:
//!   300 PINGs, each right after a 1-ms sleep (the hold), as a handoff's
//!   release starts from an idle process.
//! - `raw-serial`, `raw-parallel32` on PostgreSQL: the cheapest correct
//!   lease loop in SQL, prepared, one connection per task (as pgbench runs
//!   a prepared script per client): `INSERT … ON CONFLICT (key) DO UPDATE …
//!   WHERE expires_at < now()` to acquire, `DELETE … WHERE key AND owner` to
//!   release, on a `lockbench_leases` table; beside it, in alternating
//!   slices, `pg_try_advisory_lock`/`pg_advisory_unlock` (`advisory_*`:
//!   session-bound, no TTL, no fence). `serial` and `parallel32` alternate
//!   with the lease loop as on Redis (`ratio_to_raw`); `held` compares with
//!   an empty table of the same server; the backend's schema is
//!   `lockbench`, migrated and emptied first; `rtt_*` from `SELECT 1`.
//!
//! - `flight64`: bursts of 64 concurrent identical requests (one keep-alive
//!   connection each) to an axum route behind [`SingleFlightLayer`] whose
//!   handler sleeps 50 ms; a new key per burst, result TTL 0, bursts one
//!   after the other for S seconds after 3 warm-up bursts. Reports
//!   `bursts`, handler runs per burst (`runs_per_burst_mean`/`_max`: the
//!   goal is 1), and the requests' latency (`p50_ms`, `p99_ms`, `max_ms`,
//!   `p99_over_handler_ms` = p99 - 50 ms). Each burst alternates with one on
//!   the same handler without the layer (`plain_p50_ms`, `plain_p99_ms`,
//!   `p99_over_plain_ms`): what 64 concurrent requests cost here anyway.
//!
//! - etcd (`etcd://HOST:PORT[,…]`, feature `etcd`): every workload; the raw
//!   loop is a bare etcd-client transaction put-if-absent with a lease,
//!   then a delete (see `etcd.rs`); `serial`/`parallel32` alternate with it
//!   (`ratio_to_raw`); `keys_after` counts the keys left once the locks were
//!   released; `held` also locks and releases 100,000 keys of their own
//!   (`release_check_keys_after`); `rtt_*` from serializable reads.
//!
//! - `readers64`: 64 tasks on one key, shared holds of 1 ms (`kind`
//!   shared), each waiting up to 10 s; `permits4`: 16 tasks on one key, 4
//!   permits, holds of 1 ms. Both report `ops_per_s`, the waits
//!   (`p50_us`, `p99_us`), `max_concurrent_holders` (never above the
//!   kind's bound), `utilisation` (holders at once on average: total hold
//!   time in the window / window) and `same_worker_reacquire_pct` (a grant
//!   to the worker that gave a hold back last). `kinds-serial`: one task
//!   cycling fresh keys, exclusive against shared, then against permits(4),
//!   in alternating slices: `shared_ratio`/`permits_ratio` = the kind's
//!   cycle time over the exclusive one's.
//!
//! `LOCKBENCH_ONLY=a|b` (profiling aid) runs one side of an alternating
//! comparison only: `a` = unlocked route / empty backend, `b` = locked route
//! / held backend, e.g. to `perf stat` one side alone.

mod args;
mod flight;
mod http;
mod kinds;
mod locks;
mod report;
mod timing;

#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "postgres")]
mod postgres;

#[cfg(feature = "redis-cluster")]
mod cluster;

#[cfg(not(feature = "redis-cluster"))]
mod cluster {
    use super::args::Args;
    use super::report::Report;

    pub(crate) async fn run(_nodes: &[String], _args: &Args, _r: Report) -> Result<Report, String> {
        Err("built without the `redis-cluster` feature".into())
    }
}

#[cfg(feature = "etcd")]
mod etcd;

#[cfg(not(feature = "etcd"))]
mod etcd {
    use super::args::Args;
    use super::report::Report;

    pub(crate) async fn run(
        _endpoints: &[String],
        _args: &Args,
        _r: Report,
    ) -> Result<Report, String> {
        Err("built without the `etcd` feature".into())
    }
}

#[cfg(not(feature = "postgres"))]
mod postgres {
    use super::args::Args;
    use super::report::Report;

    pub(crate) async fn run(_url: &str, _args: &Args, _r: Report) -> Result<Report, String> {
        Err("built without the `postgres` feature".into())
    }
}

#[cfg(not(feature = "redis"))]
mod redis {
    use super::args::Args;
    use super::report::Report;

    pub(crate) async fn run(_url: &str, _args: &Args, _r: Report) -> Result<Report, String> {
        Err("built without the `redis` feature".into())
    }
}

use std::process::ExitCode;
use std::time::Duration;

use tower_lock::{LockKind, MemoryBackend, SharedBackend};

use self::args::{Api, Args, BackendArg, Workload};
use self::http::http;
use self::locks::{Locker, contended, held, parallel, serial};
use self::report::Report;

pub(crate) const USAGE: &str = "\
usage: lockbench --backend memory|redis://HOST:PORT|postgres://…|etcd://HOST:PORT[,HOST:PORT…] --workload W --seconds S [--api owned|backend]
       lockbench --backend redis-cluster://HOST:PORT[,HOST:PORT…] --workload W --seconds S [--single-node redis://HOST:PORT]

  W: serial | parallel32 | contended16 | http | held | flight64 | readers64 | permits4
     | kinds-serial | raw-serial | raw-parallel32
     (raw-* need a redis://, postgres:// or etcd:// backend; a cluster runs serial, parallel32, contended16)
  S: length of the measured window, in seconds (> 0)
  --api: owned (default) = OwnedLock::acquire/release, backend = LockBackend::acquire/release
  --single-node URL: with a cluster, the same workload on this one server in the same run
  --min-replicas N[:MS]: Redis backends confirm each acquisition on N replicas (timeout MS, default 1000)

Prints one JSON line on stdout.";

/// TTL of every lock taken in the loops (as the peers).
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// Uncontended cycles before timing (as the peers).
pub(crate) const WARMUP: u64 = 200;
/// The longest wait in contended16 (as the peers).
pub(crate) const CONTENDED_WAIT: Duration = Duration::from_secs(10);
pub(crate) const HOLD: Duration = Duration::from_millis(1);
pub(crate) const PARALLEL: usize = 32;
pub(crate) const CONTENDERS: usize = 16;
pub(crate) const HTTP_CONNECTIONS: usize = 32;
pub(crate) const HELD_MEMORY: usize = 1_000_000;
#[cfg(feature = "redis")]
pub(crate) const HELD_REDIS: usize = 100_000;
#[cfg(feature = "postgres")]
pub(crate) const HELD_POSTGRES: usize = 100_000;
/// Back-to-back PINGs for `rtt_p50_us`.
#[cfg(any(feature = "redis", feature = "postgres", feature = "etcd"))]
pub(crate) const RTT_SAMPLES: usize = 2_000;
/// PINGs after a `HOLD` sleep each, for contended16's `idle_rtt_p50_us`.
#[cfg(feature = "redis")]
pub(crate) const IDLE_RTT_SAMPLES: usize = 300;

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            eprintln!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("lockbench: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(report) => {
            println!("{}", report.line());
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("lockbench: {msg}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<Report, String> {
    let backend_name = match &args.backend {
        BackendArg::Memory => "memory",
        BackendArg::Redis(_) => "redis",
        BackendArg::Postgres(_) => "postgres",
        BackendArg::RedisCluster(_) => "redis-cluster",
        BackendArg::Etcd(_) => "etcd",
    };
    let mut r = Report::new(backend_name, args.workload);
    match &args.backend {
        BackendArg::Redis(url) => return redis::run(url, &args, r).await,
        BackendArg::Postgres(url) => return postgres::run(url, &args, r).await,
        BackendArg::RedisCluster(nodes) => return cluster::run(nodes, &args, r).await,
        BackendArg::Etcd(members) => return etcd::run(members, &args, r).await,
        BackendArg::Memory => {}
    }
    let locker = Locker {
        backend: SharedBackend::new(MemoryBackend::new()),
        api: args.api,
    };
    // `held` compares with a second, empty backend.
    let empty = Locker {
        backend: SharedBackend::new(MemoryBackend::new()),
        api: args.api,
    };
    run_locks(&locker, Some(&empty), &args, HELD_MEMORY, &mut r).await?;
    Ok(r)
}

/// The workloads through tower-lock, whatever the backend.
pub(crate) async fn run_locks(
    locker: &Locker,
    empty: Option<&Locker>,
    args: &Args,
    held_keys: usize,
    r: &mut Report,
) -> Result<(), String> {
    let api = match args.api {
        Api::Owned => "OwnedLock",
        Api::Backend => "LockBackend",
    };
    match args.workload {
        Workload::Serial => {
            r.put("api", api);
            serial(locker, args.seconds, "s:").await?.put(r);
        }
        Workload::Parallel32 => {
            r.put("api", api);
            parallel(locker, args.seconds).await?.put(r);
        }
        Workload::Contended16 => {
            r.put("api", api);
            contended(locker, args.seconds, r).await?;
        }
        Workload::Held => {
            r.put("api", api);
            held(locker, empty, held_keys, args.seconds, r).await?;
        }
        Workload::Http => {
            r.put("api", "LockLayer");
            http(locker.backend.clone(), args.seconds, r).await?;
        }
        Workload::Flight64 => {
            r.put("api", "SingleFlightLayer");
            flight::bursts(locker.backend.clone(), args.seconds, r).await?;
        }
        Workload::Readers64 => {
            r.put("api", api);
            kinds::holders(locker, LockKind::Shared, 64, args.seconds, r).await?;
        }
        Workload::Permits4 => {
            r.put("api", api);
            kinds::holders(locker, LockKind::Permits(4), 16, args.seconds, r).await?;
        }
        Workload::KindsSerial => {
            r.put("api", api);
            kinds::serial(locker, args.seconds, r).await?;
        }
        Workload::RawSerial | Workload::RawParallel32 => {
            unreachable!("rejected by the argument parser")
        }
    }
    r.put("seconds", args.seconds);
    Ok(())
}
