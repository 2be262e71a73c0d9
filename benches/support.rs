//! Load helpers shared by the benchmarks: an HTTP client, lead bodies,
//! closed-loop and fixed-rate load with every request accounted for,
//! latency percentiles, the service and mock buyers as child processes, and
//! CPU time read from /proc. Each benchmark uses a part of them.
#![allow(dead_code)]

use std::cell::RefCell;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The service binary the benches run: this build's, or `LEADROUTER_BIN`
/// (an earlier build, to compare two in the same run).
fn binary() -> String {
    std::env::var("LEADROUTER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_leadrouter").into())
}

/// One load run. Every request sent is acknowledged (200/202), failed (an
/// HTTP answer that is neither) or lost (no answer): a run with a lost
/// request is void.
#[derive(Default)]
pub struct LoadResult {
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub sent: usize,
    pub acknowledged: usize,
    pub failed: usize,
}

impl LoadResult {
    /// Panics unless every request sent got an answer: a benchmark that
    /// lost requests silently would report a rate it did not reach.
    pub fn accounted(self, phase: &str) -> Self {
        assert_eq!(
            self.sent,
            self.acknowledged + self.failed,
            "{phase}: VOID, {} sent but {} acknowledged + {} failed",
            self.sent,
            self.acknowledged,
            self.failed
        );
        self
    }

    /// "sent N = acknowledged A + failed F".
    pub fn tally(&self) -> String {
        format!(
            "sent {} = acknowledged {} + failed {}",
            self.sent, self.acknowledged, self.failed
        )
    }
}

/// What became of one request.
pub enum Answer {
    Acknowledged(Duration),
    Failed,
    Lost,
}

/// Latencies and counts gathered while a load runs.
#[derive(Default)]
pub struct Tally {
    latencies: Vec<Duration>,
    sent: usize,
    failed: usize,
}

impl Tally {
    pub fn count(&mut self, answer: Answer) {
        self.sent += 1;
        match answer {
            Answer::Acknowledged(latency) => self.latencies.push(latency),
            Answer::Failed => self.failed += 1,
            Answer::Lost => {}
        }
    }

    /// Rates over `elapsed`, percentiles of the acknowledged requests.
    pub fn summarize(mut self, elapsed: Duration) -> LoadResult {
        self.latencies.sort();
        let latencies = &self.latencies;
        let percentile = |p: f64| {
            latencies
                .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
        };
        LoadResult {
            rate: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: percentile(0.50),
            p99_ms: percentile(0.99),
            sent: self.sent,
            acknowledged: latencies.len(),
            failed: self.failed,
        }
    }
}

pub fn client(clients: usize) -> awc::Client {
    awc::Client::builder()
        .connector(awc::Connector::new().limit(clients * 2))
        .timeout(Duration::from_secs(30))
        .finish()
}

/// Phone numbers handed out so far in this process: every lead of a run is
/// a different person (same-person duplicates take intake's slow path).
static PHONES_USED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A lead of a person no earlier lead of this process named.
pub fn lead_body() -> String {
    let id = leadrouter::domain::new_id();
    let phone = PHONES_USED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    assert!(phone < 10_000_000, "the bench ran out of phone numbers");
    format!(
        r#"{{"email":"bench-{id}@example.com","phone":"555{phone:07}","first_name":"Bench","state":"CA","utm_source":"bench","consent_text":"I agree to be contacted."}}"#,
    )
}

pub async fn post_lead(client: &awc::Client, url: &str) -> Answer {
    let started = Instant::now();
    let response = client
        .post(url)
        .insert_header(("Content-Type", "application/json"))
        .send_body(lead_body())
        .await;
    // The answer is read, as a sender reads its lead's id: an unread body
    // makes awc close the connection, and every lead would pay for a new one.
    match response {
        Ok(mut response) => {
            let acknowledged = matches!(response.status().as_u16(), 200 | 202);
            match response.body().await {
                // 200 accepted, 202 pending (e.g. held in the spool): both acknowledged.
                Ok(_) if acknowledged => Answer::Acknowledged(started.elapsed()),
                Ok(_) => Answer::Failed,
                Err(_) => Answer::Lost,
            }
        }
        Err(_) => Answer::Lost,
    }
}

/// `clients` connections sending one lead after another, as fast as answered.
pub async fn closed_loop(url: &str, clients: usize, seconds: u64) -> LoadResult {
    let client = client(clients);
    let tally = Rc::new(RefCell::new(Tally::default()));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks = (0..clients).map(|_| {
        let (client, url, tally) = (client.clone(), url.to_string(), tally.clone());
        async move {
            while Instant::now() < deadline {
                let answer = post_lead(&client, &url).await;
                tally.borrow_mut().count(answer);
            }
        }
    });
    futures_util::future::join_all(tasks).await;
    tally.take().summarize(started.elapsed())
}

/// `total` leads over `clients` connections, as fast as answered.
pub async fn submit_count(url: &str, total: u64, clients: usize) -> LoadResult {
    let client = client(clients);
    let next = Rc::new(std::cell::Cell::new(0u64));
    let tally = Rc::new(RefCell::new(Tally::default()));
    let started = Instant::now();
    let workers = (0..clients).map(|_| {
        let (client, url, next, tally) =
            (client.clone(), url.to_string(), next.clone(), tally.clone());
        async move {
            loop {
                let n = next.get();
                if n >= total {
                    break;
                }
                next.set(n + 1);
                let answer = post_lead(&client, &url).await;
                tally.borrow_mut().count(answer);
            }
        }
    });
    futures_util::future::join_all(workers).await;
    tally
        .take()
        .summarize(started.elapsed())
        .accounted("submitting leads")
}

/// An open loop: one lead every 1/`per_second` s, whatever the answers do.
pub async fn fixed_rate(url: &str, clients: usize, per_second: u64, seconds: u64) -> LoadResult {
    let client = client(clients);
    let tally = Rc::new(RefCell::new(Tally::default()));
    let total = per_second * seconds;
    let interval = Duration::from_secs_f64(1.0 / per_second as f64);
    let started = Instant::now();
    let mut requests = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = started + interval * n as u32;
        actix_web::rt::time::sleep_until(due.into()).await;
        let (client, url, tally) = (client.clone(), url.to_string(), tally.clone());
        requests.push(actix_web::rt::spawn(async move {
            let answer = post_lead(&client, &url).await;
            tally.borrow_mut().count(answer);
        }));
    }
    futures_util::future::join_all(requests).await;
    tally.take().summarize(started.elapsed())
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A loopback address nobody listens on yet.
pub fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

pub fn wait_for_port(address: &str) {
    let started = Instant::now();
    while std::net::TcpStream::connect(address).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{address} never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process of the leadrouter binary, killed when dropped.
pub struct Process {
    pub address: String,
    child: Child,
}

impl Process {
    /// `leadrouter <args…>` with `--listen`-style address already in `args`,
    /// once `address` accepts connections.
    fn start(address: String, args: &[&str], log: &str) -> Self {
        let child = Command::new(binary())
            .args(args)
            .env("RUST_LOG", log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_port(&address);
        Self { address, child }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User + system CPU time so far.
    pub fn cpu_ms(&self) -> f64 {
        cpu_ms(self.pid())
    }

    /// Resident memory now (MiB).
    pub fn rss_mib(&self) -> f64 {
        resident_mib_of(self.pid(), "VmRSS")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `leadrouter mock-buyer` with these behaviour flags.
pub fn mock_buyer(args: &[&str]) -> Process {
    mock_buyer_at(free_address(), args)
}

/// `leadrouter mock-buyer` listening on `address`.
pub fn mock_buyer_at(address: String, args: &[&str]) -> Process {
    let mut all = vec!["mock-buyer", "--listen", &address];
    all.extend_from_slice(args);
    Process::start(address.clone(), &all, "warn")
}

/// The base URLs of these mock buyers.
pub fn bases(buyers: &[Process]) -> Vec<String> {
    buyers.iter().map(Process::base).collect()
}

/// `[[buyers]]` for mock buyers at these base URLs: `b0`, `b1`, … in
/// priority order, each with 64 slots, reading the mock buyer's answers;
/// `extra` is added to each (e.g. a `[buyers.circuit]` table).
pub fn buyers_toml(bases: &[String], extra: &str) -> String {
    bases
        .iter()
        .enumerate()
        .map(|(index, base)| {
            format!(
                "[[buyers]]\nid = \"b{index}\"\npriority = {index}\nmax_concurrency = 64\n\
                 [buyers.ping]\nurl = \"{base}/ping\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nbid_path = \"/bid\"\nping_id_path = \"/leadAuctionId\"\n\
                 [buyers.post]\nurl = \"{base}/post\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nprice_path = \"/price\"\n{extra}\n"
            )
        })
        .collect()
}

/// `leadrouter serve` on a configuration written to `dir`: `[server]` and
/// `[database]` are added to `rest`.
pub fn serve(dir: &std::path::Path, database_url: &str, rest: &str) -> Process {
    let address = free_address();
    let config = dir.join("leadrouter.toml");
    std::fs::write(
        &config,
        format!("[server]\nlisten = \"{address}\"\n[database]\nurl = \"{database_url}\"\n{rest}"),
    )
    .unwrap();
    let config = config.to_string_lossy().into_owned();
    Process::start(address, &["serve", "--config", &config], "warn")
}

/// Resident memory of a process now, from /proc (MiB; 0 once it is gone):
/// `VmRSS`, or one of its parts, `RssAnon` (the process's own memory) or
/// `RssFile` (pages of mapped files: its binary and libraries, and any
/// file it maps).
pub fn resident_mib_of(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// User + system CPU time of a process, from /proc (clock ticks of 10 ms).
pub fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After the name: state is field 0, utime field 11, stime field 12.
    (ticks(11) + ticks(12)) * 10.0
}

/// CPU time of every PostgreSQL server process so far (backends come and
/// go, so compare two readings only across a phase that keeps its pool).
pub fn postgres_cpu_ms() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|name| name.trim() == "postgres")
        })
        .map(cpu_ms)
        .sum()
}

/// Busy CPU time of the whole machine so far (every core), from /proc/stat.
pub fn machine_busy_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|value| value.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …: all but idle and iowait.
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).unwrap_or(&0.0) + ticks.get(4).unwrap_or(&0.0);
    (total - idle) * 10.0
}

/// Pages the machine read back while a phase ran: major faults (program
/// and library pages) and file pages refaulted after the kernel dropped
/// them. Where the kernel pages out idle memory (a DAMON `pageout` scheme,
/// as on this project's 2-core machines: pages idle for a minute), these
/// come in bursts that stall whatever touches them, and a fixed-rate
/// phase's p99 is then the machine's as much as the service's.
pub struct PageReads {
    major_faults: u64,
    refaulted: u64,
}

impl PageReads {
    /// From now.
    pub fn start() -> Self {
        Self {
            major_faults: vmstat("pgmajfault"),
            refaulted: vmstat("workingset_refault_file"),
        }
    }
}

impl std::fmt::Display for PageReads {
    /// The counts since `start`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pages read back meanwhile: {} major faults, {} file pages refaulted",
            vmstat("pgmajfault").saturating_sub(self.major_faults),
            vmstat("workingset_refault_file").saturating_sub(self.refaulted)
        )
    }
}

/// One counter of /proc/vmstat (0 where there is none).
fn vmstat(name: &str) -> u64 {
    let stat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    stat.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// CPU spent over one phase: by the service, by PostgreSQL, by the mock
/// buyers, by this process (the load generator), by the whole machine
/// (everything else is the difference).
pub struct CpuUse {
    service: f64,
    postgres: f64,
    buyers: f64,
    generator: f64,
    machine: f64,
    started: Instant,
}

impl CpuUse {
    /// From now, with these mock buyers (none in an intake run).
    pub fn start(service: &Process, buyers: &[Process]) -> Self {
        Self {
            service: service.cpu_ms(),
            postgres: postgres_cpu_ms(),
            buyers: buyers_cpu_ms(buyers),
            generator: cpu_ms(std::process::id()),
            machine: machine_busy_ms(),
            started: Instant::now(),
        }
    }

    /// CPU per lead since `start`, by process.
    pub fn per_lead(&self, service: &Process, buyers: &[Process], leads: usize) -> CpuPerLead {
        let leads = leads.max(1) as f64;
        let wall = self.started.elapsed().as_secs_f64() * 1000.0;
        let machine = machine_busy_ms() - self.machine;
        CpuPerLead {
            service: (service.cpu_ms() - self.service) / leads,
            postgres: (postgres_cpu_ms() - self.postgres) / leads,
            buyers: (!buyers.is_empty()).then(|| (buyers_cpu_ms(buyers) - self.buyers) / leads),
            generator: (cpu_ms(std::process::id()) - self.generator) / leads,
            all: machine / leads,
            cores_busy: machine / wall,
        }
    }
}

/// CPU per lead (ms), by process, and the cores busy meanwhile.
pub struct CpuPerLead {
    pub service: f64,
    pub postgres: f64,
    /// The mock buyers', when there were any.
    pub buyers: Option<f64>,
    /// This process's: the load generator.
    pub generator: f64,
    /// Every process's, the machine's busy time.
    pub all: f64,
    pub cores_busy: f64,
}

impl CpuPerLead {
    /// The leads/s the machine's two cores allow at this CPU per lead.
    pub fn machine_bound(&self) -> f64 {
        2000.0 / self.all
    }
}

impl std::fmt::Display for CpuPerLead {
    /// "CPU per lead: service …, PostgreSQL …, [mock buyers …,] load
    /// generator …, all processes …; cores busy …".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU per lead: service {:.3} ms, PostgreSQL {:.3} ms, ",
            self.service, self.postgres
        )?;
        if let Some(buyers) = self.buyers {
            write!(f, "mock buyers {buyers:.3} ms, ")?;
        }
        write!(
            f,
            "load generator {:.3} ms, all processes {:.3} ms; {:.2} of 2 cores busy",
            self.generator, self.all, self.cores_busy
        )
    }
}

fn buyers_cpu_ms(buyers: &[Process]) -> f64 {
    buyers.iter().map(Process::cpu_ms).sum()
}

/// What a mock buyer answered so far (`GET /stats`): calls, and the time
/// it held them in all (ms).
#[derive(Debug, Default, Clone, Copy)]
pub struct Answered {
    pub calls: u64,
    pub held_ms: f64,
}

impl Answered {
    pub async fn read(base: &str) -> Self {
        let stats: serde_json::Value = awc::Client::default()
            .get(format!("{base}/stats"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        Self {
            calls: stats["calls"].as_u64().unwrap(),
            held_ms: stats["held_ms"].as_f64().unwrap(),
        }
    }

    /// The mean time a call answered between `earlier` and this reading
    /// was held.
    pub fn mean_ms_since(&self, earlier: &Self) -> f64 {
        (self.held_ms - earlier.held_ms) / (self.calls - earlier.calls).max(1) as f64
    }
}

/// The service's own intake latency histogram (`leadrouter_intake_seconds`,
/// from the handing over of a lead to its answer) as (upper bound in s,
/// cumulative count) pairs, read from `/metrics`.
pub async fn intake_histogram(base: &str) -> Vec<(f64, u64)> {
    let mut response = awc::Client::default()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap();
    let body = response.body().limit(1 << 22).await.unwrap();
    String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("leadrouter_intake_seconds_bucket{le=\"")?;
            let (bound, count) = rest.split_once("\"} ")?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            Some((bound, count.trim().parse().ok()?))
        })
        .collect()
}

/// The bucket bound (ms) under which 99 % of the observations made between
/// two readings of `intake_histogram` fall.
pub fn p99_bound_ms(before: &[(f64, u64)], after: &[(f64, u64)]) -> f64 {
    let counted = |bucket: usize| after[bucket].1 - before.get(bucket).map_or(0, |b| b.1);
    let total = after.last().map_or(0, |_| counted(after.len() - 1));
    (0..after.len())
        .find(|&bucket| counted(bucket) as f64 >= total as f64 * 0.99)
        .map_or(f64::NAN, |bucket| after[bucket].0 * 1000.0)
}
