//! PostgreSQL: the raw SQL lease loop and advisory locks as baselines, round
//! trips, and the tower-lock backend.

use std::sync::Arc;
use std::time::Instant;

use tokio_postgres::{Client, NoTls, Statement};
use tower_lock::SharedBackend;
use tower_lock::backend::postgres::PostgresBackend;

use super::args::{Api, Args, Workload};
use super::locks::{LockCycle, Locker, err};
use super::report::{Report, round, us};
use super::timing::{Cycle, Tally, alternate, percentile, run_tally};
use super::{HELD_POSTGRES, PARALLEL, RTT_SAMPLES, run_locks};

/// The raw loop's table: the cheapest correct lease (key, owner, expiry).
const RAW_TABLE: &str = "CREATE TABLE IF NOT EXISTS lockbench_leases \
     (key text PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL)";
/// Take a free or expired lease in one statement (one row = taken).
const RAW_ACQUIRE: &str = "INSERT INTO lockbench_leases (key, owner, expires_at) \
     VALUES ($1, $2, now() + interval '30 s') \
     ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at \
     WHERE lockbench_leases.expires_at < now()";
/// Give it back if still ours (one row = released).
const RAW_RELEASE: &str = "DELETE FROM lockbench_leases WHERE key = $1 AND owner = $2";
const ADVISORY_LOCK: &str = "SELECT pg_try_advisory_lock($1::bigint)";
const ADVISORY_UNLOCK: &str = "SELECT pg_advisory_unlock($1::bigint)";
/// The schema the benchmark's backends use, and the table of `held`'s
/// empty side.
const SCHEMA: &str = "lockbench";
const EMPTY_TABLE: &str = "empty_locks";

pub(crate) async fn run(url: &str, args: &Args, mut r: Report) -> Result<Report, String> {
    let admin = connect(url).await?;
    admin.batch_execute(RAW_TABLE).await.map_err(err)?;
    admin
        .batch_execute("TRUNCATE lockbench_leases")
        .await
        .map_err(err)?;
    let (rtt_p50, rtt_p99) = rtt(&admin).await?;
    let workers = match args.workload {
        Workload::RawSerial | Workload::Serial => 1,
        _ => PARALLEL,
    };
    match args.workload {
        Workload::RawSerial | Workload::RawParallel32 => {
            r.put("api", "tokio-postgres, prepared, a connection per task");
            // The lease loop and advisory locks in alternating slices.
            let raw = RawLoop::connect(url, workers, RawKind::Lease).await?;
            let advisory = RawLoop::connect(url, workers, RawKind::Advisory).await?;
            let (lease, adv) = alternate(
                args.seconds,
                async |s| raw.tally(workers, s).await,
                async |s| advisory.tally(workers, s).await,
            )
            .await?;
            lease.put(&mut r);
            r.put("advisory_ops_per_s", round(adv.ops_per_s, 1));
            r.put("advisory_p50_us", us(adv.p50_ns));
            r.put("advisory_p99_us", us(adv.p99_ns));
            r.put("advisory_errors", adv.errors);
            r.put("connections", workers);
            r.put("seconds", args.seconds);
        }
        Workload::Serial | Workload::Parallel32 => {
            let locker = Locker {
                backend: backend(url, None).await?,
                api: args.api,
            };
            let raw = RawLoop::connect(url, workers, RawKind::Lease).await?;
            let (raw, ours) = alternate(
                args.seconds,
                async |s| raw.tally(workers, s).await,
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
            r.put("raw_connections", workers);
            r.put("ratio_to_raw", round(ours.ops_per_s / raw.ops_per_s, 4));
            r.put("seconds", args.seconds);
        }
        _ => {
            let locker = Locker {
                backend: backend(url, None).await?,
                api: args.api,
            };
            // `held` compares with an empty table of the same server.
            let empty = match args.workload {
                Workload::Held => Some(Locker {
                    backend: backend(url, Some(EMPTY_TABLE)).await?,
                    api: args.api,
                }),
                _ => None,
            };
            run_locks(&locker, empty.as_ref(), args, HELD_POSTGRES, &mut r).await?;
            let rows: i64 = admin
                .query_one(
                    "SELECT count(*) FROM lockbench.locks WHERE expires_at > now()",
                    &[],
                )
                .await
                .map_err(err)?
                .get(0);
            r.put("live_rows_after", rows);
        }
    }
    r.put("rtt_p50_us", rtt_p50);
    r.put("rtt_p99_us", rtt_p99);
    Ok(r)
}

/// The tower-lock backend on `url`, its schema migrated and emptied.
async fn backend(url: &str, table: Option<&str>) -> Result<SharedBackend, String> {
    let mut builder = PostgresBackend::builder().schema(SCHEMA);
    if let Some(table) = table {
        builder = builder.table(table);
    }
    let backend = builder
        .build(url)
        .map_err(|e| format!("PostgresBackend::builder().build: {e}"))?;
    backend.migrate().await.map_err(err)?;
    let admin = connect(url).await?;
    let table = table.unwrap_or(PostgresBackend::DEFAULT_TABLE);
    admin
        .batch_execute(&format!(
            "TRUNCATE \"{SCHEMA}\".\"{table}\", \"{SCHEMA}\".\"{table}_waiters\""
        ))
        .await
        .map_err(err)?;
    Ok(SharedBackend::new(backend))
}

async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// p50/p99 of back-to-back `SELECT 1`, µs.
async fn rtt(client: &Client) -> Result<(f64, f64), String> {
    let one = client.prepare("SELECT 1").await.map_err(err)?;
    let mut samples = Vec::with_capacity(RTT_SAMPLES);
    for _ in 0..RTT_SAMPLES {
        let t0 = Instant::now();
        client.query_one(&one, &[]).await.map_err(err)?;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    Ok((
        us(percentile(&samples, 50.0)),
        us(percentile(&samples, 99.0)),
    ))
}

#[derive(Clone, Copy)]
enum RawKind {
    /// `RAW_ACQUIRE` / `RAW_RELEASE`.
    Lease,
    /// `pg_try_advisory_lock` / `pg_advisory_unlock` (session-bound: no TTL,
    /// no fence, no queue).
    Advisory,
}

/// One connection per worker with the two statements prepared, as pgbench
/// runs a prepared script per client.
struct RawLoop {
    kind: RawKind,
    conns: Vec<Arc<(Client, Statement, Statement)>>,
}

impl RawLoop {
    async fn connect(url: &str, workers: usize, kind: RawKind) -> Result<Self, String> {
        let (take, give) = match kind {
            RawKind::Lease => (RAW_ACQUIRE, RAW_RELEASE),
            RawKind::Advisory => (ADVISORY_LOCK, ADVISORY_UNLOCK),
        };
        let mut conns = Vec::with_capacity(workers);
        for _ in 0..workers {
            let client = connect(url).await?;
            let take = client.prepare(take).await.map_err(err)?;
            let give = client.prepare(give).await.map_err(err)?;
            conns.push(Arc::new((client, take, give)));
        }
        Ok(RawLoop { kind, conns })
    }

    async fn tally(
        &self,
        workers: usize,
        seconds: f64,
    ) -> Result<(Tally, std::time::Duration), String> {
        run_tally(workers, seconds, |w| RawCycle {
            kind: self.kind,
            conn: self.conns[w].clone(),
            worker: w as i64,
        })
        .await
    }
}

struct RawCycle {
    kind: RawKind,
    conn: Arc<(Client, Statement, Statement)>,
    worker: i64,
}

impl Cycle for RawCycle {
    async fn cycle(&mut self, i: u64) -> Result<(), String> {
        let (client, take, give) = &*self.conn;
        match self.kind {
            RawKind::Lease => {
                let key = format!("raw:{}:{i}", self.worker);
                let owner = uuid::Uuid::new_v4().to_string();
                if client.execute(take, &[&key, &owner]).await.map_err(err)? != 1 {
                    return Err(format!("{key} is held"));
                }
                if client.execute(give, &[&key, &owner]).await.map_err(err)? != 1 {
                    return Err(format!("{key} was no longer ours"));
                }
            }
            RawKind::Advisory => {
                // A key per worker and cycle, as the lease loop.
                let key = (self.worker << 40) | (i as i64 & ((1 << 40) - 1));
                let took: bool = client.query_one(take, &[&key]).await.map_err(err)?.get(0);
                if !took {
                    return Err(format!("advisory lock {key} is held"));
                }
                let gave: bool = client.query_one(give, &[&key]).await.map_err(err)?.get(0);
                if !gave {
                    return Err(format!("advisory lock {key} was not ours"));
                }
            }
        }
        Ok(())
    }
}
