//! A private etcd cluster: 3 members from Debian's `etcd` (package
//! `etcd-server`) on free loopback ports, each in a directory of its own,
//! stopped by pid on drop.
//!
//! Starting one takes ≈ 1-2 s (the members elect a leader), so a test binary
//! whose tests need no faults shares one cluster among its tests
//! ([`EtcdCluster::shared`]), isolating them by key prefix; fault tests start
//! their own. Every member gets `PR_SET_PDEATHSIG`, spawned from a thread
//! that lives as long as its owner needs it (for the shared one, as long as
//! the test binary): no member outlives the tests.
//!
//! The data directories live in `/dev/shm` when there is one: etcd fsyncs
//! its log on every write, and on tmpfs that costs nothing, which keeps the
//! test suite fast. A killed member keeps its data there and restarts from
//! it. Benchmarks run on a real disk (`scripts/bench.sh`). The shared
//! cluster is never dropped (it lives until the binary exits), and a killed
//! test binary drops nothing: each start first removes the directories of
//! test processes that are gone, so that they never pile up in memory.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const BINARY: &str = "etcd";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Raft timing of the test members: a heartbeat every 50 ms, an election
/// after 500 ms without one. Leases then count from 1 s (etcd's shortest
/// lease is 1.5 election timeouts, in whole seconds).
pub const HEARTBEAT_MS: u64 = 50;
pub const ELECTION_MS: u64 = 500;

struct Member {
    name: String,
    client: u16,
    peer: u16,
    dir: PathBuf,
    child: Option<Child>,
    stopped: bool,
}

/// A running private cluster.
pub struct EtcdCluster {
    members: Mutex<Vec<Member>>,
    clients: Vec<u16>,
    initial: String,
}

impl EtcdCluster {
    /// A cluster of `n` members (1 or 3 in the tests), every member started
    /// from this thread (their parent-death signal follows it).
    pub fn start(n: usize) -> Self {
        for _ in 0..10 {
            if let Some(cluster) = Self::try_start(n) {
                return cluster;
            }
        }
        panic!("could not start a {n}-member etcd cluster after 10 attempts");
    }

    /// The 3-member cluster shared by this test binary, started on first
    /// use. Tests on it must keep to a key prefix of their own and must not
    /// stop members.
    pub fn shared() -> &'static EtcdCluster {
        static SHARED: OnceLock<EtcdCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            // The members die with the thread that spawned them: this one
            // parks until the binary exits.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                tx.send(Self::start(3)).unwrap();
                loop {
                    std::thread::park();
                }
            });
            rx.recv().expect("starting the shared etcd cluster")
        })
    }

    fn try_start(n: usize) -> Option<Self> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let ports = free_ports(2 * n);
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        static SWEPT: OnceLock<()> = OnceLock::new();
        SWEPT.get_or_init(|| sweep_dead(&base));
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let dir = base.join(format!(
                "tower-lock-etcd-{}-{}-{i}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("member dir");
            members.push(Member {
                name: format!("m{i}"),
                client: ports[2 * i],
                peer: ports[2 * i + 1],
                dir,
                child: None,
                stopped: false,
            });
        }
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        for m in &mut members {
            m.child = Some(spawn(m, &initial, "new"));
        }
        let cluster = EtcdCluster {
            clients: members.iter().map(|m| m.client).collect(),
            members: Mutex::new(members),
            initial,
        };
        if cluster.wait_ready(READY_TIMEOUT).is_err() {
            // A port taken meanwhile: the cluster is dropped (killed) and
            // started again on other ports.
            return None;
        }
        Some(cluster)
    }

    /// Every member's client endpoint, `http://127.0.0.1:<port>`, in start
    /// order.
    pub fn endpoints(&self) -> Vec<String> {
        self.clients
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    /// The client endpoints joined by commas (the bank's `--etcd`).
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// The client port of every member.
    pub fn client_ports(&self) -> &[u16] {
        &self.clients
    }

    /// The member count.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// The index of the member that is leader now, as a running member
    /// sees it; `None` while there is none.
    pub fn leader(&self) -> Option<usize> {
        for (i, &port) in self.clients.iter().enumerate() {
            if !self.is_running(i) {
                continue;
            }
            let Ok(status) = gateway(port, "/v3/maintenance/status", "{}") else {
                continue;
            };
            let (Some(leader), Some(me)) = (
                json_field(&status, "leader"),
                json_field(&status, "member_id"),
            ) else {
                continue;
            };
            if leader == "0" {
                return None;
            }
            if leader == me {
                return Some(i);
            }
            // Another member leads: find which by asking it.
            for (j, &other) in self.clients.iter().enumerate() {
                if j != i
                    && self.is_running(j)
                    && let Ok(s) = gateway(other, "/v3/maintenance/status", "{}")
                    && json_field(&s, "member_id").as_deref() == Some(leader.as_str())
                {
                    return Some(j);
                }
            }
        }
        None
    }

    /// Whether member `i` runs (not killed, not stopped).
    pub fn is_running(&self, i: usize) -> bool {
        let members = self.members.lock().unwrap();
        members[i].child.is_some() && !members[i].stopped
    }

    /// The pid of member `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        let members = self.members.lock().unwrap();
        members[i].child.as_ref().map(Child::id)
    }

    /// SIGKILL member `i` and wait until it is gone (its data stays).
    pub fn kill(&self, i: usize) {
        let mut members = self.members.lock().unwrap();
        let m = &mut members[i];
        if let Some(mut child) = m.child.take() {
            if m.stopped {
                signal(child.id(), libc::SIGCONT);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        m.stopped = false;
    }

    /// Start member `i` again from its data (it rejoins the cluster).
    pub fn restart(&self, i: usize) {
        let mut members = self.members.lock().unwrap();
        let initial = self.initial.clone();
        let m = &mut members[i];
        assert!(m.child.is_none(), "member {i} is running");
        m.child = Some(spawn(m, &initial, "existing"));
    }

    /// SIGSTOP member `i`: it keeps its sockets but answers nothing, as a
    /// machine cut off from the others would.
    pub fn stop(&self, i: usize) {
        let mut members = self.members.lock().unwrap();
        let m = &mut members[i];
        if let Some(child) = &m.child {
            signal(child.id(), libc::SIGSTOP);
            m.stopped = true;
        }
    }

    /// SIGCONT member `i`.
    pub fn resume(&self, i: usize) {
        let mut members = self.members.lock().unwrap();
        let m = &mut members[i];
        if let Some(child) = &m.child {
            signal(child.id(), libc::SIGCONT);
            m.stopped = false;
        }
    }

    /// Wait until every running member answers `/health` and one of them
    /// leads.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let why = self.readiness();
            match why {
                Ok(()) => return Ok(()),
                Err(why) if Instant::now() > deadline => return Err(why),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn readiness(&self) -> Result<(), String> {
        {
            let mut members = self.members.lock().unwrap();
            for m in members.iter_mut() {
                if let Some(child) = m.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Err(format!("member {} exited: {status}", m.name));
                }
            }
        }
        for (i, &port) in self.clients.iter().enumerate() {
            if !self.is_running(i) {
                continue;
            }
            let health = http(port, "GET", "/health", "").map_err(|e| e.to_string())?;
            if !health.contains("\"health\":\"true\"") {
                return Err(format!("member {i}: {health}"));
            }
        }
        self.leader().map(drop).ok_or_else(|| "no leader".into())
    }

    /// Every key under `prefix` (as etcd's JSON gateway gives them, base64),
    /// counted.
    pub fn count_prefix(&self, prefix: &str) -> usize {
        let port = (0..self.len())
            .find(|&i| self.is_running(i))
            .map(|i| self.clients[i])
            .expect("a running member");
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().expect("a prefix") += 1;
        let body = format!(
            "{{\"key\":\"{}\",\"range_end\":\"{}\",\"count_only\":true}}",
            base64(prefix.as_bytes()),
            base64(&end)
        );
        let reply = gateway(port, "/v3/kv/range", &body).expect("range");
        json_field(&reply, "count").map_or(0, |c| c.parse().unwrap_or(0))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        for m in members.iter_mut() {
            if let Some(mut child) = m.child.take() {
                if m.stopped {
                    signal(child.id(), libc::SIGCONT);
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            let _ = std::fs::remove_dir_all(&m.dir);
        }
    }
}

/// Remove the member directories under `base` left by test processes that
/// are gone (named `tower-lock-etcd-<pid>-…`).
fn sweep_dead(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("tower-lock-etcd-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: kill(2) with signal 0 only checks that the pid exists.
        #[allow(unsafe_code)]
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

fn spawn(m: &Member, initial: &str, state: &str) -> Child {
    let client = format!("http://127.0.0.1:{}", m.client);
    let peer = format!("http://127.0.0.1:{}", m.peer);
    let mut cmd = Command::new(BINARY);
    cmd.args(["--name", &m.name])
        .arg("--data-dir")
        .arg(&m.dir)
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", initial])
        .args(["--initial-cluster-state", state])
        .args(["--initial-cluster-token", "tower-lock-test"])
        .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
        .args(["--election-timeout", &ELECTION_MS.to_string()])
        .args(["--logger", "zap", "--log-level", "error"])
        // More flags for every member, e.g. a compaction to run the checker
        // with ("--auto-compaction-mode=periodic --auto-compaction-retention=1s").
        .args(
            std::env::var("TOWER_LOCK_ETCD_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: prctl is async-signal-safe; nothing else runs here.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{BINARY} not found: these tests need a local etcd \
             (Debian/Ubuntu: `apt-get install -y etcd-server`)"
        ),
        Err(e) => panic!("could not run {BINARY}: {e}"),
    }
}

/// `n` distinct free ports (held together while they are picked).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

/// A JSON call to etcd's gRPC gateway on the client port.
pub fn gateway(port: u16, path: &str, body: &str) -> std::io::Result<String> {
    http(port, "POST", path, body)
}

/// One HTTP/1.1 request on a fresh connection; the body of the reply.
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let (head, rest) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(
            head.lines().next().unwrap_or("").to_owned(),
        ));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(unchunk(rest));
    }
    Ok(rest.to_owned())
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The text of field `name` of a flat JSON reply (string or number); enough
/// for the gateway's status and count replies.
fn json_field(json: &str, name: &str) -> Option<String> {
    let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = json[at..].trim_start();
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest.find(['"', ',', '}'])?;
    Some(rest[..end].to_owned())
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
