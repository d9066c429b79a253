//! Command line: `--backend redis://…|postgres://… --workload readers64|permits4 --seconds S`.

pub(crate) const USAGE: &str = "\
usage: distributed-lock-peer-bench --backend redis://HOST:PORT|postgres://… --workload readers64|permits4 --seconds S

  readers64: 64 tasks, one key, read locks of the reader-writer lock, hold 1 ms
  permits4:  16 tasks, one key, a semaphore of max count 4, hold 1 ms (Redis only:
             distributed-lock 0.2's PostgreSQL provider has no semaphore)
  S: length of the measured window, in seconds (> 0)

Prints one JSON line on stdout.";

#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Redis(String),
    Postgres(String),
}

impl Backend {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Redis(_) => "redis",
            Backend::Postgres(_) => "postgres",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    Readers64,
    Permits4,
}

impl Workload {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Readers64 => "readers64",
            Workload::Permits4 => "permits4",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) backend: Backend,
    pub(crate) workload: Workload,
    pub(crate) seconds: f64,
}

impl Args {
    /// `Ok(None)`: `--help` was asked for.
    pub(crate) fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
        let (mut backend, mut workload, mut seconds) = (None, None, None);
        while let Some(flag) = it.next() {
            if flag == "--help" || flag == "-h" {
                return Ok(None);
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--backend" => {
                    backend = Some(if value.starts_with("redis://") {
                        Backend::Redis(value)
                    } else if value.starts_with("postgres://") || value.starts_with("postgresql://")
                    {
                        Backend::Postgres(value)
                    } else {
                        return Err(format!("unknown backend {value:?}"));
                    })
                }
                "--workload" => {
                    workload = Some(match value.as_str() {
                        "readers64" => Workload::Readers64,
                        "permits4" => Workload::Permits4,
                        _ => return Err(format!("unknown workload {value:?}")),
                    })
                }
                "--seconds" => {
                    let s: f64 = value
                        .parse()
                        .map_err(|_| format!("--seconds: not a number: {value:?}"))?;
                    if !(s > 0.0 && s.is_finite()) {
                        return Err(format!("--seconds must be > 0, not {value}"));
                    }
                    seconds = Some(s);
                }
                _ => return Err(format!("unknown flag {flag:?}")),
            }
        }
        Ok(Some(Args {
            backend: backend.ok_or("--backend is required")?,
            workload: workload.ok_or("--workload is required")?,
            seconds: seconds.ok_or("--seconds is required")?,
        }))
    }
}
