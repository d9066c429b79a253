//! The command line.

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum BackendArg {
    Memory,
    Redis(String),
    Postgres(String),
    /// `redis-cluster://HOST:PORT[,HOST:PORT…]`: the nodes' `redis://` URLs.
    RedisCluster(Vec<String>),
    /// `etcd://HOST:PORT[,HOST:PORT…]`: the members' `http://` endpoints.
    Etcd(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Workload {
    Serial,
    Parallel32,
    Contended16,
    Http,
    Held,
    RawSerial,
    RawParallel32,
    Flight64,
    Readers64,
    Permits4,
    KindsSerial,
}

impl Workload {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "serial" => Workload::Serial,
            "parallel32" => Workload::Parallel32,
            "contended16" => Workload::Contended16,
            "http" => Workload::Http,
            "held" => Workload::Held,
            "raw-serial" => Workload::RawSerial,
            "raw-parallel32" => Workload::RawParallel32,
            "flight64" => Workload::Flight64,
            "readers64" => Workload::Readers64,
            "permits4" => Workload::Permits4,
            "kinds-serial" => Workload::KindsSerial,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Serial => "serial",
            Workload::Parallel32 => "parallel32",
            Workload::Contended16 => "contended16",
            Workload::Http => "http",
            Workload::Held => "held",
            Workload::RawSerial => "raw-serial",
            Workload::RawParallel32 => "raw-parallel32",
            Workload::Flight64 => "flight64",
            Workload::Readers64 => "readers64",
            Workload::Permits4 => "permits4",
            Workload::KindsSerial => "kinds-serial",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Api {
    Owned,
    Backend,
}

#[derive(Debug)]
pub(crate) struct Args {
    pub(crate) backend: BackendArg,
    pub(crate) workload: Workload,
    pub(crate) seconds: f64,
    pub(crate) api: Api,
    /// `--single-node redis://…` (with a cluster backend): the same workload
    /// on one server in the same run, reported beside the cluster's.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(crate) single_node: Option<String>,
    /// `--min-replicas N[:TIMEOUT_MS]` (Redis backends): `RedisBackend::min_replicas`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) min_replicas: Option<(u32, u64)>,
}

impl Args {
    /// `Ok(None)`: help was asked for.
    pub(crate) fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
        let (mut backend, mut workload, mut seconds, mut api) = (None, None, None, Api::Owned);
        let (mut single_node, mut min_replicas) = (None, None);
        while let Some(flag) = it.next() {
            if flag == "-h" || flag == "--help" {
                return Ok(None);
            }
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
                _ => (flag.clone(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match name.as_str() {
                "--backend" => {
                    let v = value()?;
                    backend = Some(if v == "memory" {
                        BackendArg::Memory
                    } else if v.starts_with("redis://") || v.starts_with("rediss://") {
                        BackendArg::Redis(v)
                    } else if v.starts_with("postgres://") || v.starts_with("postgresql://") {
                        BackendArg::Postgres(v)
                    } else if let Some(nodes) = v.strip_prefix("redis-cluster://") {
                        let nodes: Vec<String> = nodes
                            .split(',')
                            .filter(|n| !n.is_empty())
                            .map(|n| format!("redis://{n}"))
                            .collect();
                        if nodes.is_empty() {
                            return Err(format!("no node in `{v}`"));
                        }
                        BackendArg::RedisCluster(nodes)
                    } else if let Some(members) = v.strip_prefix("etcd://") {
                        let members: Vec<String> = members
                            .split(',')
                            .filter(|n| !n.is_empty())
                            .map(|n| format!("http://{n}"))
                            .collect();
                        if members.is_empty() {
                            return Err(format!("no member in `{v}`"));
                        }
                        BackendArg::Etcd(members)
                    } else {
                        return Err(format!("unknown backend `{v}`"));
                    });
                }
                "--workload" => {
                    let v = value()?;
                    workload =
                        Some(Workload::parse(&v).ok_or_else(|| format!("unknown workload `{v}`"))?);
                }
                "--seconds" => {
                    let v = value()?;
                    let s: f64 = v
                        .parse()
                        .map_err(|_| format!("--seconds: not a number: `{v}`"))?;
                    if !(s > 0.0 && s.is_finite() && s <= 86_400.0) {
                        return Err(format!("--seconds must be in (0, 86400], got {v}"));
                    }
                    seconds = Some(s);
                }
                "--single-node" => {
                    let v = value()?;
                    if !(v.starts_with("redis://") || v.starts_with("rediss://")) {
                        return Err(format!("--single-node takes a redis:// URL, got `{v}`"));
                    }
                    single_node = Some(v);
                }
                "--min-replicas" => {
                    let v = value()?;
                    let (n, ms) = v.split_once(':').unwrap_or((&v, "1000"));
                    let parsed = n.parse::<u32>().ok().zip(ms.parse::<u64>().ok());
                    min_replicas =
                        Some(parsed.filter(|&(n, ms)| n > 0 && ms > 0).ok_or_else(|| {
                            format!("--min-replicas takes N or N:TIMEOUT_MS (both > 0), got `{v}`")
                        })?);
                }
                "--api" => {
                    api = match value()?.as_str() {
                        "owned" => Api::Owned,
                        "backend" => Api::Backend,
                        v => return Err(format!("unknown api `{v}`")),
                    };
                }
                _ => return Err(format!("unknown argument `{flag}`")),
            }
        }
        let backend = backend.ok_or("--backend is required")?;
        let workload = workload.ok_or("--workload is required")?;
        let seconds = seconds.ok_or("--seconds is required")?;
        if matches!(workload, Workload::RawSerial | Workload::RawParallel32)
            && backend == BackendArg::Memory
        {
            return Err(format!(
                "{} needs a redis://, postgres:// or etcd:// backend",
                workload.name()
            ));
        }
        let cluster = matches!(backend, BackendArg::RedisCluster(_));
        if cluster
            && !matches!(
                workload,
                Workload::Serial | Workload::Parallel32 | Workload::Contended16
            )
        {
            return Err(format!(
                "{} is not measured on a cluster (serial, parallel32, contended16 are)",
                workload.name()
            ));
        }
        if single_node.is_some() && !cluster {
            return Err("--single-node goes with a redis-cluster:// backend".to_owned());
        }
        if min_replicas.is_some()
            && !matches!(backend, BackendArg::Redis(_) | BackendArg::RedisCluster(_))
            || min_replicas.is_some()
                && matches!(workload, Workload::RawSerial | Workload::RawParallel32)
        {
            return Err(
                "--min-replicas needs a Redis backend and a tower-lock workload".to_owned(),
            );
        }
        Ok(Some(Args {
            backend,
            workload,
            seconds,
            api,
            single_node,
            min_replicas,
        }))
    }
}
