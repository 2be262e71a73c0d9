//! The real `leadrouter` binary as a child process, for what only a process
//! shows: `kill -9`, SIGTERM, actor restarts, several instances. Also a TCP
//! proxy the test can cut, to put between leadrouter and PostgreSQL.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::helpers::{open_store, wait_until, TestApp, ADMIN_TOKEN, BUYER_TOKEN, SOURCES};

/// A configuration file and spool directory that outlive restarts of the
/// service within one test.
pub struct ServiceConfig {
    dir: tempfile::TempDir,
    /// More `[routing]` keys, one per line.
    routing: String,
    /// Where the test itself reads the database (not through a proxy).
    pub test_database_url: String,
}

impl ServiceConfig {
    /// Writes `leadrouter.toml`: the test sources, a 1 s database acquire
    /// timeout, a 2 s lease, a 200 ms sweep, `shutdown_grace`, and `extra`
    /// TOML (buyers, other sections).
    pub fn write(database_url: &str, shutdown_grace: &str, extra: &str) -> Self {
        Self::write_with_routing(database_url, shutdown_grace, "", extra)
    }

    /// As [`ServiceConfig::write`], with more `[routing]` keys.
    pub fn write_with_routing(
        database_url: &str,
        shutdown_grace: &str,
        routing: &str,
        extra: &str,
    ) -> Self {
        let config = Self {
            dir: tempfile::tempdir().expect("temp dir"),
            routing: routing.to_string(),
            test_database_url: database_url.to_string(),
        };
        config.write_file(database_url, shutdown_grace, extra);
        config
    }

    /// Writes the file again with other `extra` TOML (for reloads).
    pub fn rewrite(&self, extra: &str) {
        let text = std::fs::read_to_string(self.path()).expect("config read");
        let database_url = text
            .lines()
            .find_map(|line| line.strip_prefix("url = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .expect("database url")
            .to_string();
        let grace = text
            .lines()
            .find_map(|line| line.strip_prefix("shutdown_grace = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .expect("grace")
            .to_string();
        self.write_file(&database_url, &grace, extra);
    }

    fn write_file(&self, database_url: &str, shutdown_grace: &str, extra: &str) {
        let spool = self.dir.path().join("spool");
        let text = format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_token = "{ADMIN_TOKEN}"
shutdown_grace = "{shutdown_grace}"

[database]
url = "{database_url}"
acquire_timeout = "1s"

[intake]
spool_dir = "{spool}"

[routing]
lease = "2s"
sweep_interval = "200ms"
{routing}
{SOURCES}
{extra}
"#,
            spool = spool.display(),
            routing = self.routing,
        );
        std::fs::write(self.path(), text).expect("config written");
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("leadrouter.toml")
    }

    pub fn spool_dir(&self) -> PathBuf {
        self.dir.path().join("spool")
    }
}

/// A running `leadrouter serve`.
pub struct Service {
    child: Child,
    pub app: TestApp,
    log: Arc<Mutex<String>>,
    /// What it wrote to stderr alone: the log, without stdout's lines.
    stderr: Arc<Mutex<String>>,
}

impl Service {
    /// Starts the binary and waits until it says where it listens.
    pub async fn start(config: &ServiceConfig) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leadrouter"))
            .arg("serve")
            .arg("--config")
            .arg(config.path())
            .env("RUST_LOG", "info,sqlx=warn,sea_orm=warn")
            .env("TEST_BUYER_TOKEN", BUYER_TOKEN)
            .env_remove("DATABASE_URL")
            .env_remove("LEADROUTER_LISTEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("leadrouter binary starts");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let address = Arc::new(Mutex::new(None));
        collect_lines(
            child.stdout.take().unwrap(),
            vec![log.clone()],
            Some(address.clone()),
        );
        collect_lines(
            child.stderr.take().unwrap(),
            vec![log.clone(), stderr.clone()],
            None,
        );
        let mut exited = None;
        wait_until("leadrouter to listen", Duration::from_secs(60), || {
            exited = child.try_wait().ok().flatten();
            let ready = address.lock().unwrap().is_some() || exited.is_some();
            async move { ready }
        })
        .await;
        if let Some(status) = exited {
            panic!(
                "leadrouter exited at start ({status}):\n{}",
                log.lock().unwrap()
            );
        }
        let address = address.lock().unwrap().clone().unwrap();
        let store = open_store(&config.test_database_url).await;
        Self {
            child,
            app: TestApp::at(address, store),
            log,
            stderr,
        }
    }

    /// `kill -9`: no chance to clean up.
    pub fn kill_9(&mut self) {
        self.child.kill().expect("SIGKILL sent");
        self.child.wait().expect("child reaped");
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends a signal by name (`TERM`, `HUP`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "SIG{name} sent");
    }

    /// Waits for the process to exit on its own; panics after `within`.
    pub async fn exit_status(&mut self, within: Duration) -> ExitStatus {
        let mut status = None;
        wait_until("leadrouter to exit", within, || {
            status = self.child.try_wait().expect("child status");
            let exited = status.is_some();
            async move { exited }
        })
        .await;
        status.unwrap()
    }

    pub fn child_is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Everything the process printed so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// What the process wrote to stderr so far (its log).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Copies a child's output into each of `logs` on a thread of its own;
/// the line that says where the service listens fills `address`.
fn collect_lines(
    output: impl Read + Send + 'static,
    logs: Vec<Arc<Mutex<String>>>,
    address: Option<Arc<Mutex<Option<String>>>>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { return };
            if let (Some(address), Some(url)) =
                (&address, line.strip_prefix("leadrouter listening on "))
            {
                *address.lock().unwrap() = Some(url.trim().to_string());
            }
            for log in &logs {
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        }
    });
}

/// A TCP proxy on a loopback port the test controls: `cut` closes every
/// connection through it and refuses new ones until `restore`.
pub struct TcpProxy {
    pub address: SocketAddr,
    open: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl TcpProxy {
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (accepting, tracked) = (open.clone(), streams.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if !accepting.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut tracked = tracked.lock().unwrap();
                    tracked.push(client.try_clone().unwrap());
                    tracked.push(server.try_clone().unwrap());
                }
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Self {
            address,
            open,
            streams,
        }
    }

    /// The database becomes unreachable: connections drop, new ones are refused.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for stream in self.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    if to.write_all(&buffer[..read]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// `postgres://user@host:port/db` with `host:port` replaced by `address`.
pub fn through(url: &str, address: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, path) = rest.split_once('/').expect("a database path");
    let credentials = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"));
    format!(
        "{scheme}://{}{address}/{path}",
        credentials.unwrap_or_default()
    )
}

/// The `host:port` a database URL names.
pub fn server_of(url: &str) -> SocketAddr {
    let rest = url.split_once("://").expect("a URL").1;
    let authority = rest.split('/').next().unwrap();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host_port = if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    std::net::ToSocketAddrs::to_socket_addrs(&host_port)
        .expect("database address resolves")
        .next()
        .unwrap()
}

/// Journal files left in a spool directory.
pub fn journals_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "jsonl"))
                .count()
        })
        .unwrap_or(0)
}
