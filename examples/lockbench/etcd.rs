//! etcd: the raw put-if-absent loop as the baseline, round trips, and the
//! tower-lock backend.
//!
//! The raw loop is the least a lock on etcd costs: one etcd-client `Client`
//! on every endpoint (its balanced channel), a lease granted before timing,
//! and per cycle a transaction `create_revision(key) == 0 → put key with
//! the lease` then a `delete`: no fence check, no queue, no TTL of its own.
//! `serial` and `parallel32` run it in alternating slices with tower-lock
//! (`raw_*`, `ratio_to_raw`); `raw-serial`/`raw-parallel32` alone. The
//! backend's keys live under `lockbench/` (emptied first); `held` compares
//! with an empty prefix; every run reports `keys_after` (keys left under the
//! prefix once its locks were released) and `held` also locks and releases
//! 100,000 keys of their own and reports `release_check_keys_after`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use tower_lock::backend::{AcquireRequest, Holder};
use tower_lock::{EtcdBackend, LockError, LockKey, SharedBackend};

use super::args::{Api, Args, Workload};
use super::locks::{LockCycle, Locker, err};
use super::report::{Report, round, us};
use super::timing::{Cycle, alternate, percentile, run_loops, run_tally};
use super::{PARALLEL, RTT_SAMPLES, TTL, run_locks};

/// Keys held by `held`, as on Redis and PostgreSQL.
const HELD_ETCD: usize = 100_000;
const PREFIX: &str = "lockbench/";
const EMPTY_PREFIX: &str = "lockbench-empty/";
const RELEASE_PREFIX: &str = "lockbench-release/";
const RAW_PREFIX: &str = "lockbench-raw/";

pub(crate) async fn run(
    endpoints: &[String],
    args: &Args,
    mut r: Report,
) -> Result<Report, String> {
    let client = Client::connect(endpoints, None)
        .await
        .map_err(|e| format!("connecting to {endpoints:?}: {e}"))?;
    for prefix in [PREFIX, EMPTY_PREFIX, RELEASE_PREFIX, RAW_PREFIX] {
        delete_prefix(&client, prefix).await?;
    }
    let (rtt_p50, rtt_p99) = rtt(&client).await?;
    let workers = match args.workload {
        Workload::RawSerial | Workload::Serial => 1,
        _ => PARALLEL,
    };
    let backend = |prefix: &str| -> Result<SharedBackend, String> {
        Ok(SharedBackend::new(
            EtcdBackend::from_endpoints(endpoints)
                .map_err(err)?
                .prefix(prefix),
        ))
    };
    match args.workload {
        Workload::RawSerial | Workload::RawParallel32 => {
            r.put(
                "api",
                "etcd-client txn put-if-absent with a lease, then delete",
            );
            let raw = Raw::new(&client).await?;
            let summary = run_loops(workers, args.seconds, |w| raw.cycle(w)).await?;
            summary.put(&mut r);
            r.put("seconds", args.seconds);
        }
        Workload::Serial | Workload::Parallel32 => {
            let locker = Locker {
                backend: backend(PREFIX)?,
                api: args.api,
            };
            let raw = Raw::new(&client).await?;
            let (raw, ours) = alternate(
                args.seconds,
                async |s| run_tally(workers, s, |w| raw.cycle(w)).await,
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
            r.put("keys_after", count_prefix(&client, PREFIX).await?);
        }
        _ => {
            let locker = Locker {
                backend: backend(PREFIX)?,
                api: args.api,
            };
            let empty = match args.workload {
                Workload::Held => Some(Locker {
                    backend: backend(EMPTY_PREFIX)?,
                    api: args.api,
                }),
                _ => None,
            };
            run_locks(&locker, empty.as_ref(), args, HELD_ETCD, &mut r).await?;
            if let Workload::Held = args.workload {
                // The held keys are still held (until their TTL): the
                // release check has a prefix of its own.
                let started = Instant::now();
                let unavailable = lock_and_release(&backend(RELEASE_PREFIX)?, HELD_ETCD).await?;
                r.put("release_check_keys", HELD_ETCD);
                r.put("release_check_unavailable", unavailable);
                r.put("release_check_s", round(started.elapsed().as_secs_f64(), 3));
                r.put(
                    "release_check_keys_after",
                    count_prefix(&client, RELEASE_PREFIX).await?,
                );
            } else {
                r.put("keys_after", count_prefix(&client, PREFIX).await?);
            }
        }
    }
    r.put("members", endpoints.len());
    r.put("rtt_p50_us", rtt_p50);
    r.put("rtt_p99_us", rtt_p99);
    Ok(r)
}

/// Lock `n` fresh keys and release each (32 tasks); the calls that failed
/// with `503` (tried again, the same acquisition: a retry of a grant whose
/// reply was lost gets the same lock back).
async fn lock_and_release(backend: &SharedBackend, n: usize) -> Result<usize, String> {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..PARALLEL)
        .map(|_| {
            let (backend, next) = (backend.clone(), next.clone());
            tokio::spawn(async move {
                let mut unavailable = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<usize, String>(unavailable);
                    }
                    let key = LockKey::global(format!("r:{i}")).map_err(err)?;
                    let owner = uuid::Uuid::new_v4().to_string();
                    let req = AcquireRequest::new(key, owner, TTL, Duration::ZERO).map_err(err)?;
                    let lease = loop {
                        match backend.acquire(&req).await {
                            Err(LockError::BackendUnavailable(_)) => unavailable += 1,
                            other => break other.map_err(err)?,
                        }
                    };
                    let holder = Holder::new(req.owner(), lease.fence);
                    loop {
                        match backend.release(req.key(), holder).await {
                            Err(LockError::BackendUnavailable(_)) => unavailable += 1,
                            other => break other.map_err(err)?,
                        }
                    }
                }
            })
        })
        .collect();
    let mut unavailable = 0;
    for t in tasks {
        unavailable += t.await.map_err(err)??;
    }
    Ok(unavailable)
}

async fn delete_prefix(client: &Client, prefix: &str) -> Result<(), String> {
    client
        .kv_client()
        .delete(prefix, Some(DeleteOptions::new().with_prefix()))
        .await
        .map_err(err)?;
    Ok(())
}

async fn count_prefix(client: &Client, prefix: &str) -> Result<i64, String> {
    let reply = client
        .kv_client()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .map_err(err)?;
    Ok(reply.count())
}

/// p50/p99 of back-to-back serializable reads (one member, no Raft), µs.
async fn rtt(client: &Client) -> Result<(f64, f64), String> {
    let mut kv = client.kv_client();
    let mut samples = Vec::with_capacity(RTT_SAMPLES);
    for _ in 0..RTT_SAMPLES {
        let t0 = Instant::now();
        kv.get("lockbench-rtt", Some(GetOptions::new().with_serializable()))
            .await
            .map_err(err)?;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    Ok((
        us(percentile(&samples, 50.0)),
        us(percentile(&samples, 99.0)),
    ))
}

/// The raw loop's client and lease.
struct Raw {
    client: Client,
    lease: i64,
}

impl Raw {
    async fn new(client: &Client) -> Result<Self, String> {
        // Long enough for every slice of the run: no keep-alive needed.
        let lease = client
            .lease_client()
            .grant(3_600, None)
            .await
            .map_err(err)?
            .id();
        Ok(Raw {
            client: client.clone(),
            lease,
        })
    }

    fn cycle(&self, worker: usize) -> RawCycle {
        RawCycle {
            client: self.client.clone(),
            lease: self.lease,
            prefix: format!("{RAW_PREFIX}{worker}:"),
        }
    }
}

struct RawCycle {
    client: Client,
    lease: i64,
    prefix: String,
}

impl Cycle for RawCycle {
    async fn cycle(&mut self, i: u64) -> Result<(), String> {
        let key = format!("{}{i}", self.prefix);
        let owner = uuid::Uuid::new_v4().to_string();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                owner,
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        let mut kv = self.client.kv_client();
        if !kv.txn(txn).await.map_err(err)?.succeeded() {
            return Err(format!("{key} is held"));
        }
        kv.delete(key.as_str(), None).await.map_err(err)?;
        Ok(())
    }
}
