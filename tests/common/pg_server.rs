//! A private PostgreSQL per test: `initdb` once per test binary into a
//! template directory, then per server a copy of it on a free port with a
//! private socket directory, `fsync=off`, stopped (immediate shutdown) and
//! removed on drop.
//!
//! Why a server per test rather than one per binary with a database each:
//! the fault tests kill and restart their server, and a copy of the
//! template starts in ~0.2 s (initdb takes ~1 s), so every test can own its
//! server, and no process outlives its test (a server shared by a whole
//! binary would have no owner to stop it when the binary exits).
//!
//! `initdb` refuses to run as root: as root, the servers run as the
//! `postgres` user (Debian's package creates it), with directories it owns.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(20);
const READY: &str = "database system is ready to accept connections";

/// A running (or killed) private PostgreSQL.
pub struct PgServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PgServer {
    /// Start a server on a free port; retries on a port collision.
    pub fn start() -> Self {
        let template = template();
        for _ in 0..20 {
            let port = free_port();
            let dir = temp_dir(&format!("srv-{port}"));
            copy_dir(template, &dir.join("data"));
            std::fs::create_dir_all(dir.join("sock")).expect("socket dir");
            own(&dir);
            let mut server = PgServer {
                port,
                dir,
                child: None,
            };
            if let Some(child) = server.spawn() {
                server.child = Some(child);
                return server;
            }
            // Dropped: its directory goes.
        }
        panic!("could not start PostgreSQL on a free port after 20 attempts");
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port (stays the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory (to add `pg_hba.conf` lines, certificates, ...).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Turn TLS on with a fresh self-signed certificate for 127.0.0.1, and
    /// refuse TCP connections without it. Returns the certificate (the CA a
    /// client must trust). Needs the `openssl` command.
    pub fn require_tls(&self) -> PathBuf {
        let data = self.data_dir();
        let (cert, key) = (data.join("server.crt"), data.join("server.key"));
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=127.0.0.1"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl (Debian: apt-get install -y openssl)");
        assert!(made.status.success(), "{made:?}");
        // The server reads its key only when it is private to its user.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "chmod 600 '{k}' && chown --reference='{d}' '{k}' '{c}'",
                k = key.display(),
                c = cert.display(),
                d = data.display()
            ))
            .status()
            .expect("chmod/chown");
        assert!(status.success());
        self.psql("ALTER SYSTEM SET ssl = on");
        self.psql("SELECT pg_reload_conf()");
        let hba = data.join("pg_hba.conf");
        let rest = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        std::fs::write(
            &hba,
            format!(
                "hostnossl all all 127.0.0.1/32 reject\nhostssl all all 127.0.0.1/32 trust\n{rest}"
            ),
        )
        .expect("pg_hba.conf");
        self.psql("SELECT pg_reload_conf()");
        cert
    }

    /// Client connections (other than psql's own) that are not encrypted.
    pub fn plain_client_connections(&self) -> usize {
        self.psql(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.backend_type = 'client backend' AND NOT s.ssl AND a.pid <> pg_backend_pid()",
        )
        .parse()
        .expect("a count")
    }

    /// SIGKILL the postmaster and its backends, as a crash of the machine
    /// would, and wait until the postmaster is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The postmaster's backends outlive it for a moment (each exits
            // when it notices), still serving their sessions: a crashed
            // server has none, so they go too.
            let backends = children_of(child.id());
            let _ = child.kill();
            for pid in backends {
                // SAFETY: kill(2) with a pid read from /proc; a pid gone
                // meanwhile gets ESRCH, which is fine.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            let _ = child.wait();
        }
    }

    /// Kill the server (if running) and start it again on the same port
    /// and data directory: what was committed is still there.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            // The old backends may hold the port or the shared memory a
            // moment longer.
            if let Some(child) = self.spawn() {
                self.child = Some(child);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("could not restart PostgreSQL on port {}", self.port);
    }

    /// Run `sql` with psql as the superuser (blocking; for set-up and
    /// inspection) and return its unaligned, tuples-only output, trimmed.
    /// Panics on an SQL error.
    pub fn psql(&self, sql: &str) -> String {
        let out = self.try_psql(sql);
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// [`PgServer::psql`] without the check.
    pub fn try_psql(&self, sql: &str) -> Output {
        psql_on(self.port, sql)
    }

    /// Spawn on our port and wait until this very process accepts
    /// connections (a port collision makes it exit, and another server on
    /// the port must not be mistaken for ours). `None` if it exited or
    /// never got ready.
    fn spawn(&self) -> Option<Child> {
        let log = self.dir.join("log");
        let _ = std::fs::remove_file(&log);
        let log_file = std::fs::File::create(&log).expect("log file");
        own(&log);
        let mut cmd = Command::new(bindir().join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.join("sock"))
            .args(["-c", "listen_addresses=127.0.0.1"])
            // No fsync (speed), but synchronous commits: a commit reaches the
            // OS before it is acknowledged, so it survives a SIGKILL of the
            // server as the fault tests need.
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off"])
            .args(["-c", "max_connections=200", "-c", "shared_buffers=16MB"])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        as_server_user(&mut cmd);
        let mut child = cmd.spawn().expect("spawn postgres");
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return None;
            }
            if std::fs::read_to_string(&log).is_ok_and(|l| l.contains(READY)) {
                return Some(child);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown: the postmaster ends its backends too.
            let _ = Command::new("kill")
                .args(["-QUIT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `sql` through psql on the server at `port`, unchecked (see
/// [`PgServer::try_psql`]; this one needs no hold of the server, so two can
/// run at once).
pub fn psql_on(port: u16, sql: &str) -> Output {
    Command::new(bindir().join("psql"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-X", "-A", "-t", "-q"])
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .stdin(Stdio::null())
        .output()
        .expect("run psql")
}

/// The PostgreSQL binaries: `$TOWER_LOCK_PG_BINDIR`, `pg_config --bindir`,
/// or the newest `/usr/lib/postgresql/*/bin`.
pub fn bindir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("TOWER_LOCK_PG_BINDIR") {
            return PathBuf::from(dir);
        }
        let from_pg_config = Command::new("pg_config")
            .arg("--bindir")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .filter(|d| d.join("initdb").is_file());
        if let Some(dir) = from_pg_config {
            return dir;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|d| d.join("initdb").is_file())
            .collect();
        found.sort_by_key(|d| {
            d.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
        });
        found.pop().unwrap_or_else(|| {
            panic!(
                "PostgreSQL binaries (initdb, postgres) not found: these tests start \
                 private servers (Debian/Ubuntu: `apt-get install -y postgresql`, \
                 or set TOWER_LOCK_PG_BINDIR)"
            )
        })
    })
}

/// The initdb'd cluster every server of this test binary copies.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        remove_stale();
        let dir = temp_dir("template");
        own(&dir);
        let data = dir.join("data");
        let mut cmd = Command::new(bindir().join("initdb"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale", "C"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_server_user(&mut cmd);
        let out = cmd.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        data
    })
}

/// The user and group the server runs as: `postgres` when we are root
/// (initdb and postgres refuse root), else ourselves.
fn server_user() -> Option<(u32, u32)> {
    static USER: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *USER.get_or_init(|| {
        let id = |args: &[&str]| -> Option<u32> {
            let out = Command::new("id").args(args).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        if id(&["-u"]) != Some(0) {
            return None;
        }
        let uid = id(&["-u", "postgres"])
            .expect("running as root: the tests run PostgreSQL as the `postgres` user, which is missing (apt-get install -y postgresql creates it)");
        let gid = id(&["-g", "postgres"]).expect("the postgres user's group");
        Some((uid, gid))
    })
}

fn as_server_user(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = server_user() {
        cmd.uid(uid).gid(gid);
    }
}

/// Give `path` (recursively) to the server's user.
fn own(path: &Path) {
    if let Some((uid, gid)) = server_user() {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(path)
            .status()
            .expect("run chown");
        assert!(status.success(), "chown {}", path.display());
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        status.success(),
        "copy {} to {}",
        from.display(),
        to.display()
    );
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

const PREFIX: &str = "tower-lock-pg-";

/// A fresh directory `tower-lock-pg-<pid>-<what>-<n>` in the temp dir, the
/// server's user allowed to reach it.
fn temp_dir(what: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "{PREFIX}{}-{what}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir for PostgreSQL");
    dir
}

/// Remove what test binaries that are gone left behind (templates; servers
/// of a killed run).
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The pids whose parent is `pid` (from `/proc/<pid>/stat`).
fn children_of(pid: u32) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // "pid (comm) state ppid ...": comm may hold spaces, so
                // read after its closing parenthesis.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}
