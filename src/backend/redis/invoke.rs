//! Calling a script: `EVALSHA` by its hash, and on `NOSCRIPT` (first use,
//! a restart, `SCRIPT FLUSH`, a promoted replica) `EVAL` with its source.
//!
//! `redis::Script` answers `NOSCRIPT` with `SCRIPT LOAD`, which a cluster
//! client sends to every primary and waits for all of them: one paused or
//! unreachable shard would then fail the first call on every healthy one.
//! `EVAL` is routed like `EVALSHA` (by the first key's slot), so the script
//! reaches the one node the call needs, in the same round trip that runs
//! it; the node caches it for the next `EVALSHA`.

use deadpool_redis::redis::aio::ConnectionLike;
use deadpool_redis::redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, ToRedisArgs, Value};

/// A script's source and its SHA-1, hashed once per process.
pub(super) struct Script {
    hash: String,
    code: String,
}

impl Script {
    pub(super) fn new(code: &str) -> Self {
        Script {
            hash: deadpool_redis::redis::Script::new(code)
                .get_hash()
                .to_owned(),
            code: code.to_owned(),
        }
    }

    /// The script's SHA-1, as `EVALSHA` names it.
    #[cfg(test)]
    pub(super) fn hash(&self) -> &str {
        &self.hash
    }

    /// A call of this script, to be given its keys and arguments.
    pub(super) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Script`]: its keys and arguments.
pub(super) struct Invocation<'a> {
    script: &'a Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    /// Add `KEYS[n + 1]`.
    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Add `ARGV[n + 1]`.
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// `EVALSHA` (`by_hash`) or `EVAL` with these keys and arguments.
    fn cmd(&self, by_hash: bool) -> Cmd {
        let mut cmd = Cmd::new();
        if by_hash {
            cmd.arg("EVALSHA").arg(self.script.hash.as_bytes());
        } else {
            cmd.arg("EVAL").arg(self.script.code.as_bytes());
        }
        cmd.arg(self.keys.len()).arg(&*self.keys).arg(&*self.args);
        cmd
    }

    /// Run the script on `conn`: by hash, and with its source when the
    /// server does not have it (see the module docs).
    pub(super) async fn invoke(&self, conn: &mut impl ConnectionLike) -> RedisResult<Value> {
        match self.cmd(true).query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.cmd(false).query_async(conn).await
            }
            other => other,
        }
    }
}
