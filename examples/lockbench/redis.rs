//! Redis: the raw client baselines, round trips, and the tower-lock backend.
use std::time::Instant;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self as client, Client};

use super::args::{Api, Args, Workload};
use super::locks::{LockCycle, Locker, err};
use super::report::{Report, round, us};
use super::timing::{Cycle, alternate, percentile, run_loops, run_tally};
use super::{HELD_REDIS, HOLD, IDLE_RTT_SAMPLES, PARALLEL, RTT_SAMPLES, run_locks};

/// Compare-and-delete, as the raw-rust peer.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

pub(crate) async fn run(url: &str, args: &Args, mut r: Report) -> Result<Report, String> {
    let client = Client::open(url).map_err(err)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let (rtt_p50, rtt_p99) = rtt(&mut conn).await?;
    // A handoff follows a hold during which the process (and often the
    // server) sat idle; on a VM, waking up costs a round trip far more
    // than `rtt_p50_us` shows.
    let idle_rtt_p50 = match args.workload {
        Workload::Contended16 => Some(idle_rtt(&mut conn).await?),
        _ => None,
    };
    let workers = match args.workload {
        Workload::RawSerial | Workload::Serial => 1,
        _ => PARALLEL,
    };
    match args.workload {
        Workload::RawSerial | Workload::RawParallel32 => {
            r.put("api", "redis MultiplexedConnection");
            let sha = load_release(&mut conn).await?;
            let summary = run_loops(workers, args.seconds, |w| RawCycle {
                conn: conn.clone(),
                sha: sha.clone(),
                prefix: format!("raw:{w}:"),
            })
            .await?;
            summary.put(&mut r);
            r.put("seconds", args.seconds);
        }
        Workload::Serial | Workload::Parallel32 => {
            // The same loop on the raw client in alternating slices of
            // this run, so `ratio_to_raw` does not carry the machine's
            // drift between two runs (the raw-* workloads still report
            // the contiguous figure).
            let locker = Locker {
                backend: tower_backend::connect(url, args.min_replicas)?,
                api: args.api,
            };
            let sha = load_release(&mut conn).await?;
            let (raw, ours) = alternate(
                args.seconds,
                async |s| {
                    run_tally(workers, s, |w| RawCycle {
                        conn: conn.clone(),
                        sha: sha.clone(),
                        prefix: format!("raw:{w}:"),
                    })
                    .await
                },
                async |s| {
                    run_tally(workers, s, |w| LockCycle {
                        locker: locker.clone(),
                        prefix: if workers == 1 {
                            "s:".to_owned()
                        } else {
                            format!("p{w}:")
                        },
                    })
                    .await
                },
            )
            .await?;
            r.put(
                "api",
                match args.api {
                    Api::Owned => "OwnedLock",
                    Api::Backend => "LockBackend",
                },
            );
            ours.put(&mut r);
            r.put("raw_ops_per_s", round(raw.ops_per_s, 1));
            r.put("raw_p50_us", us(raw.p50_ns));
            r.put("raw_p99_us", us(raw.p99_ns));
            r.put("raw_errors", raw.errors);
            r.put("ratio_to_raw", round(ours.ops_per_s / raw.ops_per_s, 4));
            r.put("seconds", args.seconds);
        }
        _ => {
            let locker = Locker {
                backend: tower_backend::connect(url, args.min_replicas)?,
                api: args.api,
            };
            // `held` compares with an empty keyspace on the same server:
            // the next database number (its own, empty hash table).
            let empty = match args.workload {
                Workload::Held => {
                    let other = other_db(url)?;
                    r.put("empty_url_db", other.1);
                    Some(Locker {
                        backend: tower_backend::connect(&other.0, args.min_replicas)?,
                        api: args.api,
                    })
                }
                _ => None,
            };
            run_locks(&locker, empty.as_ref(), args, HELD_REDIS, &mut r).await?;
        }
    }
    r.put("rtt_p50_us", rtt_p50);
    r.put("rtt_p99_us", rtt_p99);
    if let Some(idle) = idle_rtt_p50 {
        r.put("idle_rtt_p50_us", idle);
    }
    if let Some((n, ms)) = args.min_replicas {
        r.put("min_replicas", n);
        r.put("min_replicas_timeout_ms", ms);
    }
    Ok(r)
}

/// `url` with the next database number (`/N` → `/N+1`, none → `/1`).
fn other_db(url: &str) -> Result<(String, u32), String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let (authority, db) = match base[after_scheme..].find('/') {
        None => (base, 0),
        Some(i) => {
            let (authority, db) = base.split_at(after_scheme + i);
            let db = match &db[1..] {
                "" => 0,
                n => n
                    .parse()
                    .map_err(|_| format!("cannot read the database number in {url}"))?,
            };
            (authority, db)
        }
    };
    let other = (db + 1) % 16;
    Ok((format!("{authority}/{other}{query}"), other))
}

/// Load the compare-and-delete script; its hash.
async fn load_release(conn: &mut MultiplexedConnection) -> Result<String, String> {
    client::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RELEASE)
        .query_async(conn)
        .await
        .map_err(err)
}

/// p50/p99 of back-to-back PINGs, µs.
async fn rtt(conn: &mut MultiplexedConnection) -> Result<(f64, f64), String> {
    let mut samples = Vec::with_capacity(RTT_SAMPLES);
    for _ in 0..RTT_SAMPLES {
        let t0 = Instant::now();
        let _: String = client::cmd("PING").query_async(conn).await.map_err(err)?;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    Ok((
        us(percentile(&samples, 50.0)),
        us(percentile(&samples, 99.0)),
    ))
}

/// p50 of PINGs each sent right after a `HOLD` sleep, µs: a round trip
/// that starts from idle, as a release after a hold does.
async fn idle_rtt(conn: &mut MultiplexedConnection) -> Result<f64, String> {
    let mut samples = Vec::with_capacity(IDLE_RTT_SAMPLES);
    for _ in 0..IDLE_RTT_SAMPLES {
        tokio::time::sleep(HOLD).await;
        let t0 = Instant::now();
        let _: String = client::cmd("PING").query_async(conn).await.map_err(err)?;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    Ok(us(percentile(&samples, 50.0)))
}

/// `SET key token NX PX 30000`, then EVALSHA compare-and-delete.
struct RawCycle {
    conn: MultiplexedConnection,
    sha: String,
    prefix: String,
}

impl Cycle for RawCycle {
    async fn cycle(&mut self, i: u64) -> Result<(), String> {
        let key = format!("{}{i}", self.prefix);
        let token = uuid::Uuid::new_v4().to_string();
        let set: Option<String> = client::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut self.conn)
            .await
            .map_err(err)?;
        if set.is_none() {
            return Err(format!("{key} is held"));
        }
        let deleted: i64 = client::cmd("EVALSHA")
            .arg(&self.sha)
            .arg(1)
            .arg(&key)
            .arg(&token)
            .query_async(&mut self.conn)
            .await
            .map_err(err)?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("{key} was no longer ours"))
        }
    }
}

/// The tower-lock Redis backend: the only code here that names its API.
pub(crate) mod tower_backend {

    use std::time::Duration;

    use tower_lock::SharedBackend;
    use tower_lock::backend::redis::RedisBackend;

    pub(crate) fn connect(
        url: &str,
        min_replicas: Option<(u32, u64)>,
    ) -> Result<SharedBackend, String> {
        let backend =
            RedisBackend::from_url(url).map_err(|e| format!("RedisBackend::from_url: {e}"))?;
        Ok(SharedBackend::new(configure(backend, min_replicas)))
    }

    /// The settings every lockbench Redis backend has.
    pub(crate) fn configure(
        backend: RedisBackend,
        min_replicas: Option<(u32, u64)>,
    ) -> RedisBackend {
        let backend = backend
            .prefix("lockbench:")
            .op_timeout(Duration::from_secs(2));
        match min_replicas {
            Some((n, ms)) => backend.min_replicas(n, Duration::from_millis(ms)),
            None => backend,
        }
    }
}
