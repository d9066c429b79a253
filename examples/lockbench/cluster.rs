//! Redis Cluster: the workloads through `RedisBackend::from_cluster_urls`,
//! with what the servers did for them, and (`--single-node`) the same
//! workload on one server in the same run.
//!
//! Fields beyond the common ones:
//! - `shards`: the cluster's primaries; `shard_share`: each primary's share
//!   of the scripts run during the run (`cmdstat_evalsha` calls, from
//!   `INFO commandstats` before and after), i.e. how the keys spread;
//! - `server_cpu_us_per_op`: the primaries' CPU time (`used_cpu_sys` +
//!   `used_cpu_user` from `INFO cpu`, summed) over the run, per lock cycle
//!   (warm-up cycles are in the numerator, not in `ops`: ~200 of them);
//! - with `--single-node URL`: `single_ops_per_s`, `single_p50_us`,
//!   `single_p99_us`, `single_errors`, `single_server_cpu_us_per_op` and
//!   `ratio_to_single`: `serial` and `parallel32` alternate between the
//!   cluster and the server in slices of one run (S seconds each, as
//!   `ratio_to_raw` on Redis), so the ratio does not carry the machine's
//!   drift; `contended16` runs on the server right after the cluster.

use deadpool_redis::redis::{self as client, Client};
use serde_json::Value;
use tower_lock::SharedBackend;
use tower_lock::backend::redis::RedisBackend;

use super::args::{Args, Workload};
use super::locks::{LockCycle, Locker, err};
use super::redis::tower_backend::configure;
use super::report::{Report, round, us};
use super::timing::{Summary, Tally, alternate, run_tally};
use super::{PARALLEL, run_locks};

pub(crate) async fn run(nodes: &[String], args: &Args, mut r: Report) -> Result<Report, String> {
    let backend = RedisBackend::from_cluster_urls(nodes.iter().map(String::as_str))
        .map_err(|e| format!("RedisBackend::from_cluster_urls: {e}"))?;
    let locker = Locker {
        backend: SharedBackend::new(configure(backend, args.min_replicas)),
        api: args.api,
    };
    let primaries = primaries(&nodes[0]).await?;
    if let (Some(url), Workload::Serial | Workload::Parallel32) = (&args.single_node, args.workload)
    {
        return alternating(&locker, &primaries, url, args, r).await;
    }
    let before = sample(&primaries).await?;
    run_locks(&locker, None, args, 0, &mut r).await?;
    let after = sample(&primaries).await?;
    let ops = ops_of(&r);
    let scripts: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a.scripts - b.scripts) as f64)
        .collect();
    let total: f64 = scripts.iter().sum();
    let cpu: f64 = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.cpu_s - b.cpu_s)
        .sum();
    r.put("shards", primaries.len());
    r.put(
        "shard_share",
        Value::from(
            scripts
                .iter()
                .map(|s| round(s / total.max(1.0), 3))
                .collect::<Vec<_>>(),
        ),
    );
    r.put("server_cpu_us_per_op", round(cpu * 1e6 / ops.max(1.0), 2));
    if let Some(url) = &args.single_node {
        let backend = RedisBackend::from_url(url).map_err(|e| format!("--single-node: {e}"))?;
        let single = Locker {
            backend: SharedBackend::new(configure(backend, args.min_replicas)),
            api: args.api,
        };
        let server = vec![url.clone()];
        let before = sample(&server).await?;
        let mut s = Report::new("redis", args.workload);
        run_locks(&single, None, args, 0, &mut s).await?;
        let after = sample(&server).await?;
        let single_cpu = after[0].cpu_s - before[0].cpu_s;
        for (from, to) in [
            ("ops_per_s", "single_ops_per_s"),
            ("p50_us", "single_p50_us"),
            ("p99_us", "single_p99_us"),
            ("errors", "single_errors"),
        ] {
            r.put(to, s.get(from).cloned().unwrap_or(Value::Null));
        }
        r.put(
            "single_server_cpu_us_per_op",
            round(single_cpu * 1e6 / ops_of(&s).max(1.0), 2),
        );
        let ratio = match (
            r.get("ops_per_s").and_then(Value::as_f64),
            s.get("ops_per_s").and_then(Value::as_f64),
        ) {
            (Some(c), Some(s)) if s > 0.0 => Value::from(round(c / s, 4)),
            _ => Value::Null,
        };
        r.put("ratio_to_single", ratio);
    }
    if let Some((n, ms)) = args.min_replicas {
        r.put("min_replicas", n);
        r.put("min_replicas_timeout_ms", ms);
    }
    Ok(r)
}

fn ops_of(r: &Report) -> f64 {
    r.get("ops").and_then(Value::as_f64).unwrap_or(0.0)
}

/// The primaries' `redis://` URLs, from `CLUSTER NODES` on `seed`
/// (credentials and scheme as `seed`'s).
async fn primaries(seed: &str) -> Result<Vec<String>, String> {
    let mut conn = Client::open(seed)
        .map_err(err)?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting to {seed}: {e}"))?;
    let nodes: String = client::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    let auth = rest.rsplit_once('@').map(|(a, _)| format!("{a}@"));
    let mut urls: Vec<String> = nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let primary = f.get(2)?.contains("master") && !f[2].contains("fail");
            let addr = f.get(1)?.split('@').next()?;
            primary.then(|| format!("{scheme}://{}{addr}", auth.as_deref().unwrap_or("")))
        })
        .collect();
    urls.sort();
    if urls.is_empty() {
        return Err(format!("{seed} lists no primary"));
    }
    Ok(urls)
}

struct Sample {
    cpu_s: f64,
    scripts: u64,
}

/// CPU seconds and scripts run so far, per server.
async fn sample(urls: &[String]) -> Result<Vec<Sample>, String> {
    let mut out = Vec::with_capacity(urls.len());
    for url in urls {
        let mut conn = Client::open(url.as_str())
            .map_err(err)?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
        let info: String = client::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let scripts = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|v| v.split(',').next()?.parse().ok())
            .unwrap_or(0);
        out.push(Sample {
            cpu_s: field("used_cpu_sys:") + field("used_cpu_user:"),
            scripts,
        });
    }
    Ok(out)
}

/// `serial`/`parallel32` on the server and on the cluster in alternating
/// slices, with each side's servers' CPU summed over its own slices.
async fn alternating(
    cluster: &Locker,
    primaries: &[String],
    url: &str,
    args: &Args,
    mut r: Report,
) -> Result<Report, String> {
    let backend = RedisBackend::from_url(url).map_err(|e| format!("--single-node: {e}"))?;
    let single = Locker {
        backend: SharedBackend::new(configure(backend, args.min_replicas)),
        api: args.api,
    };
    let server = vec![url.to_owned()];
    let workers = if args.workload == Workload::Serial {
        1
    } else {
        PARALLEL
    };
    let slice = async |locker: &Locker, servers: &[String], s: f64| {
        let before = sample(servers).await?;
        let (tally, elapsed) = run_tally(workers, s, |w| LockCycle {
            locker: locker.clone(),
            prefix: if workers == 1 {
                "s:".to_owned()
            } else {
                format!("p{w}:")
            },
        })
        .await?;
        let after = sample(servers).await?;
        Ok::<_, String>((tally, elapsed, before, after))
    };
    let (mut cpu_single, mut cpu_cluster) = (0.0, 0.0);
    let mut scripts = vec![0u64; primaries.len()];
    let (one, many): (Summary, Summary) = alternate(
        args.seconds,
        async |s| {
            let (t, e, before, after) = slice(&single, &server, s).await?;
            cpu_single += after[0].cpu_s - before[0].cpu_s;
            Ok::<(Tally, _), String>((t, e))
        },
        async |s| {
            let (t, e, before, after) = slice(cluster, primaries, s).await?;
            for (i, (b, a)) in before.iter().zip(&after).enumerate() {
                cpu_cluster += a.cpu_s - b.cpu_s;
                scripts[i] += a.scripts - b.scripts;
            }
            Ok((t, e))
        },
    )
    .await?;
    r.put(
        "api",
        match args.api {
            super::args::Api::Owned => "OwnedLock",
            super::args::Api::Backend => "LockBackend",
        },
    );
    many.put(&mut r);
    r.put("seconds", args.seconds);
    let total = scripts.iter().sum::<u64>().max(1) as f64;
    r.put("shards", primaries.len());
    r.put(
        "shard_share",
        Value::from(
            scripts
                .iter()
                .map(|&s| round(s as f64 / total, 3))
                .collect::<Vec<_>>(),
        ),
    );
    r.put(
        "server_cpu_us_per_op",
        round(cpu_cluster * 1e6 / (many.ops.max(1) as f64), 2),
    );
    r.put("single_ops_per_s", round(one.ops_per_s, 1));
    r.put("single_p50_us", us(one.p50_ns));
    r.put("single_p99_us", us(one.p99_ns));
    r.put("single_errors", one.errors);
    r.put(
        "single_server_cpu_us_per_op",
        round(cpu_single * 1e6 / (one.ops.max(1) as f64), 2),
    );
    r.put(
        "ratio_to_single",
        if one.ops_per_s > 0.0 {
            Value::from(round(many.ops_per_s / one.ops_per_s, 4))
        } else {
            Value::Null
        },
    );
    if let Some((n, ms)) = args.min_replicas {
        r.put("min_replicas", n);
        r.put("min_replicas_timeout_ms", ms);
    }
    Ok(r)
}
