//! The servers a schedule runs against, and the faults each can suffer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_lock::backend::BoxFuture;
use tower_lock::{MemoryBackend, SharedBackend};

use super::clock::{MS, now_ns};
use super::history::Fault;
use super::rng::Rng;
use super::run::BackendSpec;

/// A fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGSTOP a client process for a while (longer than most TTLs).
    Pause,
    /// SIGKILL a client process (never the last one): its locks and queue
    /// entries stay on the server with nobody to release or leave them.
    /// The run does it, not the rig (see `run::crash`).
    Crash,
    /// SIGKILL the server, start it again on its data.
    Restart,
    /// The server forgets everything (restart without persistence).
    Wipe,
    /// Every client connection is reset.
    Reset,
    /// The next reply is lost and its connection reset.
    DropReply,
    /// Clients' traffic to the server is held back for a while.
    Delay,
    /// The wake-up connections (pub/sub, LISTEN) are killed by the server.
    KillSubscriber,
    /// Every client session is terminated by the server.
    TerminateSessions,
    /// A cluster primary is killed; its replica takes over.
    KillPrimary,
    /// The etcd leader is killed (SIGKILL) and started again on its data.
    KillLeader,
    /// An etcd member is stopped (SIGSTOP) for a while: a partitioned
    /// minority, possibly the leader, possibly the member a client talks to.
    StopMember,
    /// PostgreSQL server processes of client sessions are stopped
    /// (SIGSTOP) for a few ms each, one after another for a while: a
    /// statement stalls wherever it was (after drawing a fence, holding a
    /// row lock, waiting for one), as a stalled backend process would.
    StopSessions,
    /// For a while, some of the PostgreSQL statements that write a lock's
    /// row stall between drawing its fence (and reading the clock) and
    /// writing it, as a backend process stalled there would (a trigger of
    /// the rig's sleeps before the insert).
    StallInserts,
    /// For a while, some of the PostgreSQL statements that update a lock's
    /// row stall there, holding the row (a release handing the lock on, an
    /// extend, a waiter's re-check), as a backend process stalled there
    /// would: every call on the key waits behind it (the same trigger,
    /// before the update).
    StallUpdates,
    /// For a while, another session holds the PostgreSQL lock rows (`FOR
    /// UPDATE`; every row, or the relay keys' alone) for 50-300 ms at a
    /// time, as a slow transaction on the table would: the calls that come meanwhile queue for the row and go
    /// on in their order when it lets go, so a release that hands a lock on
    /// runs after the waiter's re-check began (its TTL must count from the
    /// hand-off, not from the re-check's start).
    HoldRows,
}

/// The servers of one backend configuration.
pub trait Rig: Send {
    fn name(&self) -> &'static str;
    fn menu(&self) -> &'static [FaultKind];
    /// What the client processes connect to (through the proxy, if any).
    fn client_backend(&self) -> BackendSpec;
    /// The in-memory backend the tasks share (memory only).
    fn memory(&self) -> Option<MemoryBackend> {
        None
    }
    /// A handle straight on the servers, for the liveness look.
    fn checker_backend(&self, op_timeout: Duration) -> SharedBackend;
    /// How long the server may still hold a stopped client process's locks
    /// (see `Bounds::stopped_holder_ns`); 0: not past their TTL.
    fn stopped_holder_ms(&self) -> u64 {
        0
    }
    /// How far apart one release may grant the readers at the head of the
    /// queue (see `Bounds::together_ns`).
    fn together_ms(&self) -> u64 {
        10
    }
    fn inject<'a>(
        &'a mut self,
        kind: FaultKind,
        pids: &'a [(u32, u32)],
        rng: &'a mut Rng,
    ) -> BoxFuture<'a, Fault>;
}

pub fn fault(what: String, at: u64) -> Fault {
    Fault {
        what,
        at,
        until: now_ns(),
        process: None,
        loses_locks: false,
        lost_by: None,
        resets_fences: false,
        crash: false,
        quiet: false,
    }
}

/// SIGSTOP one client process for 200 ms to 1.2 s (past most TTLs), then
/// SIGCONT.
async fn pause(pids: &[(u32, u32)], rng: &mut Rng) -> Fault {
    let &(p, pid) = rng.pick(pids);
    let d = rng.range(200, 1_200);
    let at = now_ns();
    signal(pid, libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(d)).await;
    signal(pid, libc::SIGCONT);
    let mut f = fault(format!("sigstop p{p} {d}ms"), at);
    f.process = Some(p);
    f
}

pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) takes two integers; a process gone meanwhile is ESRCH.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// The in-memory backend: tasks of one process; faults are the tasks' own
/// (pauses inside critical sections, calls cancelled midway).
pub struct MemoryRig(pub MemoryBackend);

impl Rig for MemoryRig {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn menu(&self) -> &'static [FaultKind] {
        &[]
    }
    fn client_backend(&self) -> BackendSpec {
        BackendSpec::Memory
    }
    fn memory(&self) -> Option<MemoryBackend> {
        Some(self.0.clone())
    }
    fn checker_backend(&self, _: Duration) -> SharedBackend {
        SharedBackend::new(self.0.clone())
    }
    fn inject<'a>(
        &'a mut self,
        kind: FaultKind,
        _: &'a [(u32, u32)],
        _: &'a mut Rng,
    ) -> BoxFuture<'a, Fault> {
        Box::pin(async move { fault(format!("{kind:?} (none on memory)"), now_ns()) })
    }
}

#[cfg(feature = "redis")]
pub use redis::RedisRig;

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::common::redis_server::{RedisServer, command};
    use crate::proxy::Proxy;

    /// One Redis (append-only file, fsync always: a restart keeps the locks)
    /// behind the fault proxy.
    pub struct RedisRig {
        server: Arc<Mutex<RedisServer>>,
        port: u16,
        proxy: Proxy,
    }

    impl RedisRig {
        pub async fn start() -> RedisRig {
            let server = tokio::task::spawn_blocking(|| {
                RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
            })
            .await
            .expect("start redis");
            let port = server.port();
            RedisRig {
                server: Arc::new(Mutex::new(server)),
                port,
                proxy: Proxy::start(port).await,
            }
        }

        /// Kill the server and start it again after `down_ms` (`wipe`:
        /// without its data); when it was dead.
        async fn restart(&self, wipe: bool, down_ms: u64) -> u64 {
            let (server, port) = (self.server.clone(), self.port);
            tokio::task::spawn_blocking(move || {
                let mut server = server.lock().unwrap();
                if wipe {
                    let _ = command(port, &["FLUSHALL"]);
                }
                server.kill();
                let dead = now_ns();
                std::thread::sleep(Duration::from_millis(down_ms));
                server.restart();
                dead
            })
            .await
            .expect("restart redis")
        }
    }

    impl Rig for RedisRig {
        fn name(&self) -> &'static str {
            "redis"
        }
        fn menu(&self) -> &'static [FaultKind] {
            use FaultKind::*;
            &[
                Pause,
                Pause,
                Crash,
                Restart,
                Wipe,
                Reset,
                DropReply,
                Delay,
                KillSubscriber,
            ]
        }
        fn client_backend(&self) -> BackendSpec {
            BackendSpec::Redis(format!("redis://127.0.0.1:{}", self.proxy.port))
        }
        fn checker_backend(&self, op_timeout: Duration) -> SharedBackend {
            SharedBackend::new(
                tower_lock::RedisBackend::from_url(&format!("redis://127.0.0.1:{}", self.port))
                    .expect("url")
                    .op_timeout(op_timeout),
            )
        }
        fn inject<'a>(
            &'a mut self,
            kind: FaultKind,
            pids: &'a [(u32, u32)],
            rng: &'a mut Rng,
        ) -> BoxFuture<'a, Fault> {
            Box::pin(async move {
                let at = now_ns();
                match kind {
                    FaultKind::Pause => pause(pids, rng).await,
                    FaultKind::Restart => {
                        let down = rng.range(50, 500);
                        let _ = self.restart(false, down).await;
                        fault(format!("restart (down {down}ms)"), at)
                    }
                    FaultKind::Wipe => {
                        let down = rng.range(50, 300);
                        let dead = self.restart(true, down).await;
                        let mut f = fault(format!("restart without data (down {down}ms)"), at);
                        f.loses_locks = true;
                        f.lost_by = Some(dead);
                        f.resets_fences = true;
                        f
                    }
                    FaultKind::Reset => {
                        self.proxy.reset_all();
                        fault("connections reset".into(), at)
                    }
                    FaultKind::DropReply => {
                        self.proxy.drop_next_reply();
                        let mut f = fault("next reply dropped".into(), at);
                        f.until = at + 100 * MS;
                        f
                    }
                    FaultKind::Delay => {
                        let d = rng.range(50, 400);
                        self.proxy.hold(true);
                        tokio::time::sleep(Duration::from_millis(d)).await;
                        self.proxy.hold(false);
                        fault(format!("traffic held {d}ms"), at)
                    }
                    FaultKind::KillSubscriber => {
                        let port = self.port;
                        let _ = tokio::task::spawn_blocking(move || {
                            command(port, &["CLIENT", "KILL", "TYPE", "pubsub"])
                        })
                        .await;
                        fault("pub/sub connections killed".into(), at)
                    }
                    other => fault(format!("{other:?} (not on this rig)"), at),
                }
            })
        }
    }
}

#[cfg(feature = "postgres")]
pub use postgres::PostgresRig;

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use crate::common::pg_server::{PgServer, psql_on};
    use crate::proxy::Proxy;

    /// One PostgreSQL behind the fault proxy.
    pub struct PostgresRig {
        server: Arc<Mutex<PgServer>>,
        url: String,
        proxy: Proxy,
    }

    impl PostgresRig {
        pub async fn start() -> PostgresRig {
            let server = tokio::task::spawn_blocking(PgServer::start)
                .await
                .expect("start postgres");
            let url = server.url();
            tower_lock::PostgresBackend::from_url(&url)
                .expect("url")
                .migrate()
                .await
                .expect("migrate");
            let out = server.try_psql(STALL_TRIGGER);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let port = server.port();
            PostgresRig {
                server: Arc::new(Mutex::new(server)),
                url,
                proxy: Proxy::start(port).await,
            }
        }

        async fn psql(&self, sql: &'static str) -> String {
            let server = self.server.clone();
            let out = tokio::task::spawn_blocking(move || server.lock().unwrap().try_psql(sql));
            out.await
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        }

        /// Stop client sessions' server processes one at a time, 2-40 ms
        /// each, for 200-800 ms; each is continued before the next stops
        /// (and if this future is dropped). A stopped process is rarely in
        /// the middle of a statement (they take a ms or so), so one turn in
        /// four makes sure some are: a transaction of the rig's holds every
        /// lock row for 20-80 ms, as a session stalled mid-statement would,
        /// and one statement found waiting for a row meanwhile (it has read
        /// its clock, and an acquire has drawn its fence) is stopped from
        /// then until 100-600 ms after the rows are let go, past most TTLs,
        /// while the others take, hand on and give back the keys.
        async fn stop_sessions(&self, rng: &mut Rng) -> String {
            let pids: Vec<u32> = self
                .psql(
                    "SELECT pid FROM pg_stat_activity \
                     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                )
                .await
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if pids.is_empty() {
                return "no session to stop".into();
            }
            let port = self.server.lock().unwrap().port();
            let total = rng.range(200, 800);
            let end = now_ns() + total * MS;
            let (mut stops, mut stalls) = (0, 0);
            while now_ns() < end {
                let pid = *rng.pick(&pids);
                let d = rng.range(2, 40);
                let (rows, hold, long) = (rng.chance(25), rng.range(20, 80), rng.range(100, 600));
                let which = rng.range(0, u64::from(u32::MAX));
                if rows && stall_a_waiter(port, hold, long, which).await {
                    stalls += 1;
                    continue;
                }
                signal(pid, libc::SIGSTOP);
                let stopped = Continue(pid);
                tokio::time::sleep(Duration::from_millis(d)).await;
                drop(stopped);
                stops += 1;
            }
            format!(
                "{stops} session stops over {total}ms ({} sessions), {stalls} waiting for a row stopped 100-600ms",
                pids.len()
            )
        }

        /// [`FaultKind::HoldRows`]: every lock row (or the relay keys'
        /// rows) held by a session of the rig's, 50-300 ms at a time with
        /// gaps of 100-400 ms, for 200-800 ms; or, a third of the time, the
        /// row of a relay key with waiters held across its holder's expiry.
        async fn hold_rows(&self, rng: &mut Rng) -> String {
            let port = self.server.lock().unwrap().port();
            if rng.chance(33) {
                let (before, after) = (rng.range(20, 60), rng.range(30, 150));
                let held =
                    tokio::task::spawn_blocking(move || hold_across_an_expiry(port, before, after))
                        .await
                        .ok()
                        .filter(|o| o.status.success())
                        // The key, in the block's notice.
                        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
                        .unwrap_or_default();
                return format!(
                    "a relay row with waiters held from {before}ms before its holder's expiry \
                     to {after}ms after ({})",
                    if held.is_empty() { "none found" } else { &held }
                );
            }
            let total = rng.range(200, 800);
            let end = now_ns() + total * MS;
            let mut holds = 0;
            while now_ns() < end {
                // Gaps about as long as a short TTL: a waiter handed the
                // lock as a hold ends calls again near its TTL's end
                // (release, extend) mostly while no hold delays that call,
                // whose answer then tells what the server kept.
                let (hold, gap) = (rng.range(50, 300), rng.range(100, 400));
                // Every row, or only the relay keys' (their hand-offs are
                // shaped for this): fewer calls wait, so fewer wait for a
                // pooled connection as well, which would change their order.
                let rows = if rng.chance(50) {
                    ""
                } else {
                    " WHERE key LIKE '%-relay%'"
                };
                let _ = tokio::task::spawn_blocking(move || hold_rows_for(port, rows, hold)).await;
                holds += 1;
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
            format!(
                "lock rows (all or the relay keys') held 50-300ms at a time, {holds} times over {total}ms"
            )
        }
    }

    /// The rig's stall: while `chaos.stall` says so, an insert into the
    /// locks table sleeps before its row is written (after its VALUES, so
    /// after a fence drawn there), or an update sleeps with the row locked
    /// (`op`: `INSERT` or `UPDATE`), `percent` of them for up to `max_ms`.
    const STALL_TRIGGER: &str = "\
        CREATE SCHEMA IF NOT EXISTS chaos; \
        CREATE TABLE IF NOT EXISTS chaos.stall \
          (until timestamptz NOT NULL, percent int NOT NULL, max_ms int NOT NULL, op text NOT NULL); \
        CREATE OR REPLACE FUNCTION chaos.stall() RETURNS trigger LANGUAGE plpgsql AS $$ \
        DECLARE s record; \
        BEGIN \
          SELECT * INTO s FROM chaos.stall LIMIT 1; \
          IF FOUND AND s.op = TG_OP AND clock_timestamp() < s.until \
             AND random() * 100 < s.percent THEN \
            PERFORM pg_sleep(random() * s.max_ms / 1000.0); \
          END IF; \
          RETURN NEW; \
        END $$; \
        DROP TRIGGER IF EXISTS chaos_stall ON tower_lock.locks; \
        CREATE TRIGGER chaos_stall BEFORE INSERT OR UPDATE ON tower_lock.locks \
          FOR EACH ROW EXECUTE FUNCTION chaos.stall();";

    /// Continues a stopped process when dropped.
    struct Continue(u32);

    impl Drop for Continue {
        fn drop(&mut self) {
            signal(self.0, libc::SIGCONT);
        }
    }

    /// Hold the lock rows `rows` selects (a `WHERE` clause, or every row)
    /// `FOR UPDATE` in a transaction of its own for `hold` ms (blocking).
    fn hold_rows_for(port: u16, rows: &str, hold: u64) -> std::process::Output {
        psql_on(
            port,
            &format!(
                "BEGIN; SELECT count(*) FROM (SELECT 1 FROM tower_lock.locks{rows} FOR UPDATE) AS r; \
                 SELECT pg_sleep({}); COMMIT;",
                hold as f64 / 1000.0
            ),
        )
    }

    /// Hold the row of the relay key with waiters whose holder's lease ends
    /// next (in 80 ms to 1 s; looked for during 1 s) `FOR UPDATE` from `before` ms before its
    /// expiry to `after` ms after (blocking; the key in a notice). A holder that
    /// lets go just before its TTL runs out (the relay's holds do) then
    /// releases into the held row, and the head waiter's re-check, due as
    /// that TTL runs out, queues behind the release: the release hands the
    /// lock to the waiter first, and the re-check finds it granted.
    fn hold_across_an_expiry(port: u16, before: u64, after: u64) -> std::process::Output {
        psql_on(
            port,
            &format!(
                "DO $$ DECLARE k text; e timestamptz; BEGIN \
                   FOR i IN 1..100 LOOP \
                     SELECT l.key, l.expires_at INTO k, e FROM tower_lock.locks AS l \
                     WHERE l.key LIKE '%-relay%' \
                       AND l.expires_at BETWEEN clock_timestamp() + interval '80 ms' \
                                            AND clock_timestamp() + interval '1 s' \
                       AND EXISTS (SELECT 1 FROM tower_lock.locks_waiters AS q \
                                   WHERE q.key = l.key) \
                     ORDER BY l.expires_at LIMIT 1; \
                     EXIT WHEN k IS NOT NULL; \
                     PERFORM pg_sleep(0.01); \
                   END LOOP; \
                   IF k IS NULL THEN RETURN; END IF; \
                   PERFORM pg_sleep(extract(epoch FROM e - clock_timestamp()) - {b}); \
                   PERFORM 1 FROM tower_lock.locks AS l WHERE l.key = k FOR UPDATE; \
                   PERFORM pg_sleep(extract(epoch FROM e - clock_timestamp()) + {a}); \
                   RAISE NOTICE '%', k; \
                 END $$",
                b = before as f64 / 1000.0,
                a = after as f64 / 1000.0,
            ),
        )
    }

    /// Hold every lock row for `hold` ms; stop one of the statements that
    /// waits for one (the `which`th, wrapping) until `long` ms after. False
    /// if none was waiting.
    async fn stall_a_waiter(port: u16, hold: u64, long: u64, which: u64) -> bool {
        let rows = tokio::task::spawn_blocking(move || hold_rows_for(port, "", hold));
        tokio::time::sleep(Duration::from_millis(hold / 2)).await;
        let waiting = tokio::task::spawn_blocking(move || {
            psql_on(
                port,
                "SELECT pid FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND wait_event_type = 'Lock' \
                 AND query NOT LIKE 'BEGIN; SELECT count(*)%'",
            )
        })
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
        let waiting: Vec<u32> = waiting
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let stopped = waiting
            .get((which % waiting.len().max(1) as u64) as usize)
            .map(|&w| {
                signal(w, libc::SIGSTOP);
                Continue(w)
            });
        let _ = rows.await;
        if stopped.is_some() {
            tokio::time::sleep(Duration::from_millis(long)).await;
        }
        stopped.is_some()
    }

    impl Rig for PostgresRig {
        fn name(&self) -> &'static str {
            "postgres"
        }
        fn menu(&self) -> &'static [FaultKind] {
            use FaultKind::*;
            &[
                Pause,
                Pause,
                Crash,
                Restart,
                Reset,
                DropReply,
                Delay,
                KillSubscriber,
                TerminateSessions,
                StopSessions,
                StallInserts,
                StallUpdates,
                HoldRows,
            ]
        }
        fn client_backend(&self) -> BackendSpec {
            BackendSpec::Postgres(format!(
                "postgres://postgres@127.0.0.1:{}/postgres",
                self.proxy.port
            ))
        }
        fn checker_backend(&self, op_timeout: Duration) -> SharedBackend {
            SharedBackend::new(
                tower_lock::PostgresBackend::builder()
                    .op_timeout(op_timeout)
                    .build(&self.url)
                    .expect("url"),
            )
        }
        fn inject<'a>(
            &'a mut self,
            kind: FaultKind,
            pids: &'a [(u32, u32)],
            rng: &'a mut Rng,
        ) -> BoxFuture<'a, Fault> {
            Box::pin(async move {
                let at = now_ns();
                match kind {
                    FaultKind::Pause => pause(pids, rng).await,
                    FaultKind::Restart => {
                        let down = rng.range(50, 500);
                        let server = self.server.clone();
                        tokio::task::spawn_blocking(move || {
                            let mut server = server.lock().unwrap();
                            server.kill();
                            std::thread::sleep(Duration::from_millis(down));
                            server.restart();
                        })
                        .await
                        .expect("restart postgres");
                        fault(format!("restart (down {down}ms)"), at)
                    }
                    FaultKind::Reset => {
                        self.proxy.reset_all();
                        fault("connections reset".into(), at)
                    }
                    FaultKind::DropReply => {
                        self.proxy.drop_next_reply();
                        let mut f = fault("next reply dropped".into(), at);
                        f.until = at + 100 * MS;
                        f
                    }
                    FaultKind::Delay => {
                        let d = rng.range(50, 400);
                        self.proxy.hold(true);
                        tokio::time::sleep(Duration::from_millis(d)).await;
                        self.proxy.hold(false);
                        fault(format!("traffic held {d}ms"), at)
                    }
                    FaultKind::KillSubscriber => {
                        self.psql(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                             WHERE query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()",
                        )
                        .await;
                        fault("LISTEN sessions terminated".into(), at)
                    }
                    FaultKind::TerminateSessions => {
                        self.psql(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                        )
                        .await;
                        fault("every session terminated".into(), at)
                    }
                    FaultKind::StopSessions => {
                        let mut f = fault(self.stop_sessions(rng).await, at);
                        f.quiet = true;
                        f
                    }
                    FaultKind::StallInserts | FaultKind::StallUpdates => {
                        let (total, percent, max) =
                            (rng.range(200, 800), rng.range(10, 50), rng.range(50, 400));
                        let (op, what) = if kind == FaultKind::StallInserts {
                            ("INSERT", "inserts")
                        } else {
                            ("UPDATE", "updates")
                        };
                        let sql = format!(
                            "DELETE FROM chaos.stall; INSERT INTO chaos.stall VALUES \
                             (clock_timestamp() + interval '{total} ms', {percent}, {max}, '{op}')"
                        );
                        let port = self.server.lock().unwrap().port();
                        let _ = tokio::task::spawn_blocking(move || psql_on(port, &sql)).await;
                        tokio::time::sleep(Duration::from_millis(total + max)).await;
                        let mut f = fault(
                            format!("{percent}% of {what} stalled up to {max}ms for {total}ms"),
                            at,
                        );
                        f.quiet = true;
                        f
                    }
                    FaultKind::HoldRows => {
                        let mut f = fault(self.hold_rows(rng).await, at);
                        f.quiet = true;
                        f
                    }
                    other => fault(format!("{other:?} (not on this rig)"), at),
                }
            })
        }
    }
}

#[cfg(feature = "redis-cluster")]
pub use cluster::ClusterRig;

#[cfg(feature = "redis-cluster")]
mod cluster {
    use super::*;
    use crate::common::redis_cluster::RedisCluster;
    use crate::common::redis_server::command;

    /// A Redis Cluster: the binary's shared one (3 primaries: pauses and
    /// killed subscribers), or one of its own with a replica per primary
    /// (also primaries killed, their replicas promoted).
    pub struct ClusterRig {
        cluster: Arc<ClusterRef>,
        failover: bool,
        /// The nodes' thread (a cluster of the rig's own): see
        /// [`ClusterRig::with_replicas`].
        nodes: Option<std::sync::mpsc::Sender<Job>>,
    }

    enum ClusterRef {
        Shared(&'static RedisCluster),
        Own(RedisCluster),
    }

    impl ClusterRef {
        fn get(&self) -> &RedisCluster {
            match self {
                ClusterRef::Shared(c) => c,
                ClusterRef::Own(c) => c,
            }
        }
    }

    type Job = Box<dyn FnOnce() + Send>;

    impl ClusterRig {
        pub async fn shared() -> ClusterRig {
            let cluster = tokio::task::spawn_blocking(RedisCluster::shared)
                .await
                .expect("cluster");
            ClusterRig {
                cluster: Arc::new(ClusterRef::Shared(cluster)),
                failover: false,
                nodes: None,
            }
        }

        /// A cluster of the rig's own, started, and its nodes restarted,
        /// on one thread that lives as long as the rig: a node gets
        /// `SIGKILL` when the thread that spawned it ends
        /// (`PR_SET_PDEATHSIG`), and a blocking-pool thread ends after
        /// 10 s idle. A node restarted from one died that way in two long
        /// runs (seeds 1078 and 1015: "a node refused connections").
        pub async fn with_replicas() -> ClusterRig {
            let (jobs, queue) = std::sync::mpsc::channel::<Job>();
            let (ready, started) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = ready.send(Arc::new(ClusterRef::Own(RedisCluster::start_with(1))));
                // Until the rig is dropped.
                while let Ok(job) = queue.recv() {
                    job();
                }
            });
            ClusterRig {
                cluster: started.await.expect("cluster"),
                failover: true,
                nodes: Some(jobs),
            }
        }

        /// Run `job` on the nodes' thread; its answer.
        async fn on_nodes<T: Send + 'static>(
            &self,
            job: impl FnOnce(&RedisCluster) -> T + Send + 'static,
        ) -> T {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let cluster = Arc::clone(&self.cluster);
            let job: Job = Box::new(move || {
                let _ = tx.send(job(cluster.get()));
            });
            let nodes = self.nodes.as_ref().expect("a cluster of the rig's own");
            nodes.send(job).expect("the nodes' thread");
            rx.await.expect("the nodes' thread")
        }
    }

    impl Rig for ClusterRig {
        fn name(&self) -> &'static str {
            if self.failover {
                "redis-cluster-failover"
            } else {
                "redis-cluster"
            }
        }
        fn menu(&self) -> &'static [FaultKind] {
            use FaultKind::*;
            if self.failover {
                &[Pause, Crash, KillSubscriber, KillPrimary]
            } else {
                &[Pause, Pause, Crash, KillSubscriber]
            }
        }
        fn client_backend(&self) -> BackendSpec {
            BackendSpec::Cluster(self.cluster.get().urls())
        }
        fn checker_backend(&self, op_timeout: Duration) -> SharedBackend {
            SharedBackend::new(
                tower_lock::RedisBackend::from_cluster_urls(self.cluster.get().urls())
                    .expect("urls")
                    .op_timeout(op_timeout),
            )
        }
        fn inject<'a>(
            &'a mut self,
            kind: FaultKind,
            pids: &'a [(u32, u32)],
            rng: &'a mut Rng,
        ) -> BoxFuture<'a, Fault> {
            Box::pin(async move {
                let at = now_ns();
                match kind {
                    FaultKind::Pause => pause(pids, rng).await,
                    FaultKind::KillSubscriber => {
                        let cluster = self.cluster.clone();
                        let _ = tokio::task::spawn_blocking(move || {
                            for &port in cluster.get().ports() {
                                let _ = command(port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
                            }
                        })
                        .await;
                        fault("pub/sub connections killed on every node".into(), at)
                    }
                    FaultKind::KillPrimary => {
                        let pick = rng.next();
                        let (what, dead) = self
                            .on_nodes(move |c| {
                                let primaries = c.primaries();
                                let port = primaries[(pick % primaries.len() as u64) as usize];
                                c.kill(port);
                                let dead = now_ns();
                                c.wait_ready(3, 0);
                                c.restart(port);
                                c.wait_ready(3, 1);
                                (format!("primary {port} killed, replica promoted"), dead)
                            })
                            .await;
                        let mut f = fault(what, at);
                        f.lost_by = Some(dead);
                        // Replication is asynchronous: a grant not yet on
                        // the replica is lost, and its fence may come again
                        // (the README's documented limit).
                        f.loses_locks = true;
                        f.resets_fences = true;
                        f
                    }
                    other => fault(format!("{other:?} (not on this rig)"), at),
                }
            })
        }
    }
}

#[cfg(feature = "etcd")]
pub use etcd::EtcdRig;

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use crate::common::etcd_cluster::EtcdCluster;
    use crate::proxy::Proxy;

    /// A 3-member etcd cluster of its own, each member behind the fault
    /// proxy. The members are children of a thread of the rig's own (a
    /// member dies with the thread that started it), which runs every
    /// kill and restart.
    pub struct EtcdRig {
        members: std::sync::mpsc::Sender<Job>,
        endpoints: Vec<String>,
        proxies: Vec<Proxy>,
    }

    type Job = Box<dyn FnOnce(&EtcdCluster) + Send>;

    impl EtcdRig {
        pub async fn start() -> EtcdRig {
            let (jobs, queue) = std::sync::mpsc::channel::<Job>();
            let (ready, started) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let cluster = EtcdCluster::start(3);
                let _ = ready.send((cluster.endpoints(), cluster.client_ports().to_vec()));
                // Until the rig is dropped.
                while let Ok(job) = queue.recv() {
                    job(&cluster);
                }
            });
            let (endpoints, ports) = started.await.expect("start etcd");
            let mut proxies = Vec::new();
            for port in ports {
                proxies.push(Proxy::start(port).await);
            }
            EtcdRig {
                members: jobs,
                endpoints,
                proxies,
            }
        }

        /// Run `job` on the members' thread; its answer.
        async fn on_members<T: Send + 'static>(
            &self,
            job: impl FnOnce(&EtcdCluster) -> T + Send + 'static,
        ) -> T {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let job: Job = Box::new(move |c| {
                let _ = tx.send(job(c));
            });
            self.members.send(job).expect("the members' thread");
            rx.await.expect("the members' thread")
        }
    }

    impl Rig for EtcdRig {
        fn name(&self) -> &'static str {
            "etcd"
        }
        fn menu(&self) -> &'static [FaultKind] {
            use FaultKind::*;
            &[
                Pause, Pause, Crash, KillLeader, StopMember, Reset, DropReply, Delay,
            ]
        }
        fn client_backend(&self) -> BackendSpec {
            BackendSpec::Etcd(
                self.proxies
                    .iter()
                    .map(|p| format!("http://127.0.0.1:{}", p.port))
                    .collect(),
            )
        }
        fn checker_backend(&self, op_timeout: Duration) -> SharedBackend {
            SharedBackend::new(
                tower_lock::EtcdBackend::from_endpoints(&self.endpoints)
                    .expect("endpoints")
                    .op_timeout(op_timeout),
            )
        }
        fn stopped_holder_ms(&self) -> u64 {
            // The workload's TTLs (600 ms at most) go on 2 s leases, kept
            // alive every 500 ms, reaped by etcd up to 500 ms late.
            3_500
        }
        fn together_ms(&self) -> u64 {
            // One Raft commit per reader: seed 1038 of a long run beside
            // another and two builds saw two 15 ms apart; up to 3 readers
            // follow the first in the workload.
            100
        }
        fn inject<'a>(
            &'a mut self,
            kind: FaultKind,
            pids: &'a [(u32, u32)],
            rng: &'a mut Rng,
        ) -> BoxFuture<'a, Fault> {
            Box::pin(async move {
                let at = now_ns();
                match kind {
                    FaultKind::Pause => pause(pids, rng).await,
                    FaultKind::KillLeader => {
                        let down = rng.range(100, 1_000);
                        let what = self
                            .on_members(move |c| {
                                let Some(leader) = c.leader() else {
                                    return "no leader to kill".to_owned();
                                };
                                c.kill(leader);
                                std::thread::sleep(Duration::from_millis(down));
                                c.restart(leader);
                                let _ = c.wait_ready(Duration::from_secs(20));
                                format!("leader m{leader} killed, restarted after {down}ms")
                            })
                            .await;
                        fault(what, at)
                    }
                    FaultKind::StopMember => {
                        let d = rng.range(300, 1_500);
                        let pick = rng.next();
                        let what = self
                            .on_members(move |c| {
                                let m = (pick % c.len() as u64) as usize;
                                let leader = c.leader() == Some(m);
                                c.stop(m);
                                std::thread::sleep(Duration::from_millis(d));
                                c.resume(m);
                                let _ = c.wait_ready(Duration::from_secs(20));
                                let role = if leader { "leader" } else { "follower" };
                                format!("{role} m{m} stopped {d}ms")
                            })
                            .await;
                        fault(what, at)
                    }
                    FaultKind::Reset => {
                        self.proxies.iter().for_each(Proxy::reset_all);
                        fault("connections reset".into(), at)
                    }
                    FaultKind::DropReply => {
                        self.proxies.iter().for_each(Proxy::drop_next_reply);
                        let mut f = fault("next reply dropped".into(), at);
                        f.until = at + 100 * MS;
                        f
                    }
                    FaultKind::Delay => {
                        let d = rng.range(50, 400);
                        self.proxies.iter().for_each(|p| p.hold(true));
                        tokio::time::sleep(Duration::from_millis(d)).await;
                        self.proxies.iter().for_each(|p| p.hold(false));
                        fault(format!("traffic held {d}ms"), at)
                    }
                    other => fault(format!("{other:?} (not on this rig)"), at),
                }
            })
        }
    }
}
