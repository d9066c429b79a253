//! A private Redis Cluster: 3 primaries (and a replica each, for the
//! failover tests) from `redis-server --cluster-enabled yes` on free ports,
//! each in a directory of its own, joined with `redis-cli --cluster create`.
//! Killed on drop.
//!
//! Starting one takes ≈ 2 s (`redis-cli` waits for the nodes to agree), so
//! a test binary whose tests need no faults shares one cluster among its
//! tests ([`RedisCluster::shared`]), isolating them by key prefix; fault
//! tests start their own. Every node gets `PR_SET_PDEATHSIG`, spawned from
//! a thread that lives as long as its owner needs it (for the shared one,
//! as long as the test binary): no node outlives the tests, even when the
//! binary exits without running destructors.
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::redis_server::{command, spawn_with};

const START_TIMEOUT: Duration = Duration::from_secs(10);
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Failure detection: a primary is deemed failed (and its replica takes
/// over) about this long after it stops answering.
pub const NODE_TIMEOUT_MS: u64 = 1000;

struct Node {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// A running private cluster.
pub struct RedisCluster {
    nodes: Mutex<Vec<Node>>,
    ports: Vec<u16>,
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    pub failed: bool,
    /// This line describes the node that answered.
    pub myself: bool,
    /// The primary's id, for a replica.
    pub primary_id: Option<String>,
    /// Inclusive slot ranges (primaries).
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// 3 primaries, no replicas.
    pub fn start() -> Self {
        Self::start_with(0)
    }

    /// 3 primaries with `replicas` replicas each.
    pub fn start_with(replicas: usize) -> Self {
        Self::start_on_this_thread(3, replicas)
    }

    /// The cluster shared by this test binary (3 primaries, no replicas),
    /// started on first use. Tests on it must keep to a key prefix of
    /// their own and must not stop nodes.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            // The nodes die with the thread that spawned them: this one
            // parks until the binary exits.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                tx.send(Self::start_on_this_thread(3, 0)).unwrap();
                loop {
                    std::thread::park();
                }
            });
            rx.recv().expect("starting the shared cluster")
        })
    }

    fn start_on_this_thread(primaries: usize, replicas: usize) -> Self {
        let total = primaries * (1 + replicas);
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            nodes.push(start_node());
        }
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        let cluster = RedisCluster {
            nodes: Mutex::new(nodes),
            ports,
        };
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for port in &cluster.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli (Debian: apt-get install -y redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_ready(primaries, replicas);
        cluster
    }

    /// Every node's port, in start order.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The URLs joined by commas (the bank's `--redis-cluster`).
    pub fn urls_arg(&self) -> String {
        self.urls().join(",")
    }

    /// One command on node `port` (see `RedisServer::cmd`).
    pub fn cmd(&self, port: u16, args: &[&str]) -> String {
        command(port, args).unwrap_or_else(|e| panic!("redis command {args:?} on {port}: {e}"))
    }

    /// One command on whichever node owns `key`'s slot.
    pub fn cmd_for_key(&self, key: &str, args: &[&str]) -> String {
        let slot: u16 = self
            .cmd(self.live_port(), &["CLUSTER", "KEYSLOT", key])
            .parse()
            .unwrap();
        self.cmd(self.owner_of(slot), args)
    }

    /// A node that is running.
    pub fn live_port(&self) -> u16 {
        let nodes = self.nodes.lock().unwrap();
        nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node")
            .port
    }

    /// The ports of the nodes that are running.
    fn live_ports(&self) -> Vec<u16> {
        let nodes = self.nodes.lock().unwrap();
        nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER NODES` as a live node sees it.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        parse_nodes(&self.cmd(self.live_port(), &["CLUSTER", "NODES"]))
    }

    /// The port of the primary owning `slot`, as that primary itself says.
    ///
    /// Each live node is asked about itself only: right after a failover the
    /// promoted replica claims the slot at once, while the other nodes learn
    /// of it by gossip a moment later, so a bystander's map can still name
    /// the dead primary or no one. Waits (bounded) until exactly one live
    /// node claims the slot.
    pub fn owner_of(&self, slot: u16) -> u16 {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let live = self.live_ports();
            let claims: Vec<u16> = live
                .into_iter()
                .filter(|&port| {
                    command(port, &["CLUSTER", "NODES"]).is_ok_and(|text| {
                        parse_nodes(&text).iter().any(|n| {
                            n.myself
                                && n.primary
                                && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
                        })
                    })
                })
                .collect();
            match claims[..] {
                [port] => return port,
                _ if Instant::now() > deadline => {
                    panic!("slot {slot}: claimed by {claims:?}, not by exactly one live primary")
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// A lock name (global scope, default prefix `lock:`) whose slot the
    /// primary `port` owns: `<stem><n>` for the first `n` that fits.
    pub fn lock_name_on(&self, port: u16, stem: &str) -> String {
        (0..)
            .map(|i| format!("{stem}{i}"))
            .find(|name| {
                let slot: u16 = self
                    .cmd(
                        self.live_port(),
                        &["CLUSTER", "KEYSLOT", &format!("lock:{{g:{name}}}")],
                    )
                    .parse()
                    .unwrap();
                self.owner_of(slot) == port
            })
            .unwrap()
    }

    /// Stop node `port` from serving its clients for `ms` milliseconds
    /// (`CLIENT PAUSE ... ALL`): a stalled shard. The cluster bus goes on,
    /// so the other nodes do not fail it over. Nothing ends it early (a
    /// `CLIENT UNPAUSE` would wait for the pause itself).
    pub fn pause(&self, port: u16, ms: u64) {
        assert_eq!(
            self.cmd(port, &["CLIENT", "PAUSE", &ms.to_string(), "ALL"]),
            "OK"
        );
    }

    /// The primaries' ports.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes()
            .into_iter()
            .filter(|n| n.primary && !n.failed)
            .map(|n| n.port)
            .collect()
    }

    /// The sum of `DBSIZE` over the primaries.
    pub fn keys(&self) -> usize {
        self.primaries()
            .into_iter()
            .map(|p| self.cmd(p, &["DBSIZE"]).parse::<usize>().unwrap())
            .sum()
    }

    /// SIGKILL node `port`.
    pub fn kill(&self, port: u16) {
        let mut nodes = self.nodes.lock().unwrap();
        let node = nodes.iter_mut().find(|n| n.port == port).expect("a node");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start node `port` again (it rejoins with its saved cluster config).
    pub fn restart(&self, port: u16) {
        let mut nodes = self.nodes.lock().unwrap();
        let node = nodes.iter_mut().find(|n| n.port == port).expect("a node");
        assert!(node.child.is_none(), "node {port} is running");
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = spawn_node(port, &node.dir) {
                node.child = Some(child);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("could not restart node {port}");
    }

    /// Wait until every live node says `cluster_state:ok`, all slots are
    /// served by live primaries that every node agrees on, and (with
    /// replicas) every primary has a replica in sync.
    pub fn wait_ready(&self, primaries: usize, replicas: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.readiness(primaries, replicas) {
                Ok(()) => return,
                Err(why) if Instant::now() > deadline => panic!("cluster not ready: {why}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn readiness(&self, primaries: usize, replicas: usize) -> Result<(), String> {
        let live = self.live_ports();
        let mut views = Vec::new();
        for &port in &live {
            let info = command(port, &["CLUSTER", "INFO"]).map_err(|e| e.to_string())?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("{port}: not ok"));
            }
            let nodes =
                parse_nodes(&command(port, &["CLUSTER", "NODES"]).map_err(|e| e.to_string())?);
            let mut owners: Vec<(u16, Vec<(u16, u16)>)> = nodes
                .iter()
                .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
                .map(|n| (n.port, n.slots.clone()))
                .collect();
            owners.sort();
            if owners.len() != primaries || owners.iter().any(|(p, _)| !live.contains(p)) {
                return Err(format!("{port}: primaries {owners:?}"));
            }
            views.push(owners);
        }
        if views.windows(2).any(|w| w[0] != w[1]) {
            return Err("nodes disagree on the slot map".into());
        }
        if replicas > 0 {
            let synced = live
                .iter()
                .filter(|&&p| {
                    command(p, &["INFO", "replication"]).is_ok_and(|i| {
                        i.contains("role:slave") && i.contains("master_link_status:up")
                    })
                })
                .count();
            if synced < primaries * replicas {
                return Err(format!("{synced} replicas in sync"));
            }
        }
        Ok(())
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        for node in nodes.iter_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let _ = std::fs::remove_dir_all(&node.dir);
        }
    }
}

/// Parse `CLUSTER NODES`.
pub fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let addr = f[1].split('@').next().unwrap();
            let port = addr.rsplit(':').next().unwrap().parse().unwrap();
            let flags = f[2];
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (s.parse().unwrap(), s.parse().unwrap()),
                })
                .collect();
            NodeInfo {
                id: f[0].to_owned(),
                port,
                primary: flags.contains("master"),
                failed: flags.contains("fail") && !flags.contains("fail?"),
                myself: flags.contains("myself"),
                primary_id: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            }
        })
        .collect()
}

/// A port that is free, and whose cluster bus port (+10000) is free too,
/// never handed out before in this process: a port is free only until its
/// node binds it, and two tests starting clusters at once could otherwise
/// be given the same one (the second node then failed to bind, and its
/// readiness check found the first test's node on that port: CI failed
/// with "node is not empty" when creating the second cluster).
fn free_ports() -> u16 {
    static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        if port > 55_000 {
            continue;
        }
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        if taken.contains(&port) || taken.contains(&(port + 10_000)) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            taken.extend([port, port + 10_000]);
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn start_node() -> Node {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    for _ in 0..20 {
        let port = free_ports();
        let dir = std::env::temp_dir().join(format!(
            "tower-lock-cluster-{}-{}-{}",
            std::process::id(),
            port,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("node dir");
        if let Some(child) = spawn_node(port, &dir) {
            return Node {
                port,
                dir,
                child: Some(child),
            };
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    panic!("could not start a cluster node after 20 attempts");
}

fn spawn_node(port: u16, dir: &PathBuf) -> Option<Child> {
    let args: Vec<String> = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &NODE_TIMEOUT_MS.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    spawn_with(port, dir, &args, START_TIMEOUT, |cmd| {
        // SAFETY: prctl is async-signal-safe; nothing else runs here.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    })
}
