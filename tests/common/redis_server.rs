//! A private `redis-server` per test: a free port, no persistence, its own
//! directory, killed on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const BINARY: &str = "redis-server";
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running (or killed) private Redis.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// Extra `redis-server` arguments, kept for restarts.
    args: Vec<String>,
}

impl RedisServer {
    /// Start a server on a free port; retries on a port collision.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`RedisServer::start`] with extra `redis-server` arguments.
    pub fn start_with(args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        for _ in 0..20 {
            let port = free_port();
            let dir = temp_dir(port);
            if let Some(child) = spawn(port, &dir, &args, START_TIMEOUT) {
                return RedisServer {
                    port,
                    dir,
                    child: Some(child),
                    args,
                };
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("could not start {BINARY} on a free port after 20 attempts");
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port (stays the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL the server and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP the server: it keeps its sockets and its data but answers
    /// nothing (a partition, a stalled host), until [`RedisServer::resume`].
    pub fn stop(&self) {
        if let Some(child) = &self.child {
            signal(child.id(), libc::SIGSTOP);
        }
    }

    /// SIGCONT the server.
    pub fn resume(&self) {
        if let Some(child) = &self.child {
            signal(child.id(), libc::SIGCONT);
        }
    }

    /// Kill the server (if running) and start an empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = spawn(self.port, &self.dir, &self.args, START_TIMEOUT) {
                self.child = Some(child);
                return;
            }
            // The port may be held a moment longer by the dead process.
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("could not restart {BINARY} on port {}", self.port);
    }

    /// Run one command on a fresh connection (blocking; for test set-up and
    /// inspection) and return the reply as text: simple strings and integers
    /// as they are, bulk strings as their content, arrays as lines, nil as
    /// `(nil)`, errors as `ERR…` text prefixed by `-`.
    pub fn cmd(&self, args: &[&str]) -> String {
        command(self.port, args).unwrap_or_else(|e| panic!("redis command {args:?}: {e}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

fn temp_dir(port: u16) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tower-lock-redis-{}-{}-{}",
        std::process::id(),
        port,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir for redis-server");
    dir
}

/// Spawn on `port` and wait until it answers as this very process (a port
/// collision makes our server exit, and another server must not be mistaken
/// for ours). `None` if it exited or never answered.
fn spawn(port: u16, dir: &PathBuf, args: &[String], timeout: Duration) -> Option<Child> {
    spawn_with(port, dir, args, timeout, |_| {})
}

/// [`spawn`], with `configure` applied to the command first.
pub fn spawn_with(
    port: u16,
    dir: &PathBuf,
    args: &[String],
    timeout: Duration,
    configure: impl FnOnce(&mut Command),
) -> Option<Child> {
    let mut server = Command::new(BINARY);
    configure(&mut server);
    let spawned = server
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "{BINARY} not found: these tests need a local Redis binary \
             (Debian/Ubuntu: `apt-get install -y redis-server`)"
        ),
        Err(e) => panic!("could not run {BINARY}: {e}"),
    };
    let pid = format!("process_id:{}", child.id());
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if let Ok(info) = command(port, &["INFO", "server"])
            && info.lines().any(|l| l.trim() == pid)
        {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Watch the commands the server on `port` runs (`MONITOR`) and return the
/// first line `seen` accepts, as soon as the server has it: a call it shows
/// has run (or is running) there, and a command sent afterwards runs after
/// it. Blocking: call it from `spawn_blocking`. `None` after `timeout`.
pub fn monitor_until(
    port: u16,
    timeout: Duration,
    seen: impl Fn(&str) -> bool,
) -> std::io::Result<Option<String>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.write_all(b"*1\r\n$7\r\nMONITOR\r\n")?;
    let end = Instant::now() + timeout;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        reader.get_ref().set_read_timeout(Some(left))?;
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(_) if seen(&line) => return Ok(Some(line)),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A minimal RESP client: one command, one reply (see [`RedisServer::cmd`]).
pub fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.write_all(out.as_bytes())?;
    let mut reader = BufReader::new(stream);
    read_reply(&mut reader)
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(1.min(line.len()));
    let bad = || std::io::Error::new(ErrorKind::InvalidData, format!("bad reply {line:?}"));
    match kind {
        "+" | ":" => Ok(rest.to_owned()),
        "-" => Ok(line.to_owned()),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                return Ok("(nil)".to_owned());
            }
            let mut buf = vec![0; len as usize + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(len as usize);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        "*" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_reply(reader)?);
            }
            Ok(items.join("\n"))
        }
        _ => Err(bad()),
    }
}
