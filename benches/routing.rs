//! Routing benchmark: leadrouter (`serve`, a child process) selling leads to
//! three `leadrouter mock-buyer` processes, against an intake-only run of
//! the same binary measured in the same run. Reports routed leads/s (over
//! the whole run, and from the last lead acknowledged on, when routing no
//! longer yields to intake) beside the buyer-bound limit and the
//! machine-bound limit (two cores over the CPU every process spent per
//! lead: service, PostgreSQL, mock buyers, load generator), the rows
//! PostgreSQL wrote per lead (by table, index entries, commits), the
//! server's CPU time per outbound call, and intake latency with healthy and
//! with hanging buyers; then the same buyers sold to by auction, against the
//! waterfall run (leads/s, median time from arrival to sale, calls per lead);
//! last, the waterfall again with the buyers answering at a real buyer's
//! pace, where their slots and not the machine bound the rate.
//!
//! `cargo bench --bench routing` — environment: `BENCH_DB` (`sqlite` or
//! `postgres`, default sqlite), `BENCH_LEADS` (2000), `BENCH_CLIENTS` (32),
//! `BENCH_LATENCY_MS` (each mock buyer's answer time, 20),
//! `BENCH_PACED_LATENCY_MS` (their answer time in the last run, 100).

#[path = "../tests/it/scratch_db.rs"]
mod scratch_db;
mod support;

use std::time::{Duration, Instant};

use actix_web::rt::System;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entity::{attempt, lead, sale};
use leadrouter::config::{DatabaseSettings, Secret};
use leadrouter::store::Store;
use scratch_db::{Backend, TestDatabase};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect, Statement,
};
use support::{
    bases, buyers_toml, env_u64, mock_buyer, serve, submit_count, Answered, CpuPerLead, CpuUse,
    LoadResult, Process,
};

/// Each mock buyer's slots (`support::buyers_toml` gives each 64).
const MOCK_SLOTS: u32 = 64;

fn main() {
    let leads = env_u64("BENCH_LEADS", 2000);
    let clients = env_u64("BENCH_CLIENTS", 32) as usize;
    let latency_ms = env_u64("BENCH_LATENCY_MS", 20);
    let latency = format!("{latency_ms}ms");
    let backend = match std::env::var("BENCH_DB").as_deref() {
        Ok("postgres") => Backend::Postgres,
        _ => Backend::Sqlite,
    };
    println!("== routing on {backend:?}: {leads} leads, {clients} clients, buyers answering in {latency} ==");

    let healthy = answering_buyers(&latency);
    let hanging = [
        mock_buyer(&["--hang"]),
        mock_buyer(&["--hang"]),
        mock_buyer(&["--hang"]),
    ];

    let intake_only = run_phase(backend, "", &[], leads, clients, false);
    println!(
        "intake only:      {:>7.0} leads/s acknowledged, p50 {:>5.2} ms, p99 {:>6.2} ms, server CPU {:>6.3} ms per lead",
        intake_only.load.rate, intake_only.load.p50_ms, intake_only.load.p99_ms, intake_only.cpu_ms / leads as f64
    );
    let routed = run_phase(backend, "", &healthy, leads, clients, true);
    report_routed(&routed, &intake_only, latency_ms, leads);
    println!(
        "intake latency:   healthy buyers p50 {:>5.2} ms p99 {:>6.2} ms",
        routed.load.p50_ms, routed.load.p99_ms
    );
    let stalled = run_phase(backend, "", &hanging, leads, clients, false);
    println!(
        "                  hanging buyers p50 {:>5.2} ms p99 {:>6.2} ms ({:.2}x the healthy p99)",
        stalled.load.p50_ms,
        stalled.load.p99_ms,
        stalled.load.p99_ms / routed.load.p99_ms
    );
    let auction = run_phase(
        backend,
        "mode = \"auction\"\nauction_window = \"500ms\"",
        &healthy,
        leads,
        clients,
        true,
    );
    for (mode, phase) in [("waterfall", &routed), ("auction", &auction)] {
        println!(
            "{mode:<9}         {:>7.0} leads/s routed, median {:>6.1} ms from arrival to sale, {:>4.2} calls per lead, {} sold",
            phase.routed_rate,
            phase.median_to_sale_ms,
            phase.calls as f64 / leads as f64,
            phase.sold
        );
        println!("                  {}", phase.breakdown.line());
    }
    println!(
        "auction / waterfall: {:.2}x leads/s, {:.2}x median time to sale, {:.2}x calls per lead",
        auction.routed_rate / routed.routed_rate,
        auction.median_to_sale_ms / routed.median_to_sale_ms,
        auction.calls as f64 / routed.calls.max(1) as f64
    );
    // At the default 20 ms the busiest buyer's slots allow more than two
    // cores can route (every process here shares them), so the machine
    // binds; at a real buyer's pace the slots bind, and the routed rate
    // shows whether they, not our own work, set it.
    let paced_ms = env_u64("BENCH_PACED_LATENCY_MS", 100);
    let paced_latency = format!("{paced_ms}ms");
    let paced_buyers = answering_buyers(&paced_latency);
    let paced = run_phase(backend, "", &paced_buyers, leads, clients, true);
    println!("== the same buyers answering in {paced_latency} ==");
    report_routed(&paced, &intake_only, paced_ms, leads);
}

/// Three mock buyers accepting 30, 50 and 90 % of pings, each answering
/// in `latency`.
fn answering_buyers(latency: &str) -> [Process; 3] {
    ["0.3", "0.5", "0.9"].map(|rate| mock_buyer(&["--accept-rate", rate, "--latency", latency]))
}

/// Prints a routed phase's rate beside the limits the buyers and the
/// machine set, its CPU per call (routing's share over `intake_only`), and
/// what PostgreSQL wrote per lead.
fn report_routed(routed: &Phase, intake_only: &Phase, latency_ms: u64, leads: u64) {
    let routing_cpu_ms = routed.cpu_ms - intake_only.cpu_ms;
    println!(
        "with 3 buyers:    {:>7.0} leads/s routed to a final state ({:.2}x the intake-only rate), {} outbound calls",
        routed.routed_rate,
        routed.routed_rate / intake_only.load.rate,
        routed.calls
    );
    println!(
        "                  server CPU {:>6.3} ms per outbound call (routing's share: total minus the intake-only run)",
        routing_cpu_ms / routed.calls.max(1) as f64
    );
    let buyer_bound = buyer_bound(routed.busiest_held_ms, routed.busiest_per_lead);
    println!(
        "                  buyer-bound limit {:>7.0} leads/s (the busiest buyer: {MOCK_SLOTS} slots / {:.2} ms per call as it measured its answers, {latency_ms} ms nominal / {:.2} calls per lead); routed = {:.2}x the limit",
        buyer_bound,
        routed.busiest_held_ms,
        routed.busiest_per_lead,
        routed.routed_rate / buyer_bound
    );
    println!(
        "                  (at the nominal {latency_ms} ms the limit would be {:>7.0} leads/s; routed = {:.2}x that)",
        buyer_bound * routed.busiest_held_ms / latency_ms as f64,
        routed.routed_rate / (buyer_bound * routed.busiest_held_ms / latency_ms as f64)
    );
    println!(
        "                  after the last lead was acknowledged: {} leads waiting, routed at {:>7.0} leads/s = {:.2}x the limit (no intake to yield to)",
        routed.waiting_after_intake,
        routed.drain_rate,
        routed.drain_rate / buyer_bound
    );
    if let Some(work) = &routed.database_work {
        println!("                  {}", work.per_lead(leads));
    }
    let cpu = &routed.cpu_per_lead;
    println!("                  {cpu} (from the first lead sent to the last final; time stolen by the hypervisor counts as busy)");
    println!(
        "                  machine-bound limit {:>7.0} leads/s (2 cores / {:.3} ms of CPU per lead, all processes) = {:.2}x the buyer-bound limit; routed = {:.2}x the machine-bound limit",
        cpu.machine_bound(),
        cpu.all,
        cpu.machine_bound() / buyer_bound,
        routed.routed_rate / cpu.machine_bound()
    );
}

struct Phase {
    load: LoadResult,
    routed_rate: f64,
    waiting_after_intake: u64,
    drain_rate: f64,
    /// Calls to the buyer called most, per lead.
    busiest_per_lead: f64,
    /// The mean time that buyer held a call, as it measured its answers.
    busiest_held_ms: f64,
    /// CPU per lead by process, and cores busy, from the first lead sent
    /// to the last final.
    cpu_per_lead: CpuPerLead,
    calls: u64,
    cpu_ms: f64,
    sold: u64,
    median_to_sale_ms: f64,
    breakdown: Breakdown,
    /// What the database wrote, on PostgreSQL (routed phases).
    database_work: Option<DatabaseWork>,
}

/// What a routed run ended as.
#[derive(Default)]
struct Routed {
    rate: f64,
    /// Leads not yet final when the last one was acknowledged.
    waiting_after_intake: u64,
    /// Their rate from then to the last final state: routing alone, no
    /// longer yielding to intake.
    drain_rate: f64,
    calls: u64,
    /// Calls to the buyer called most, per lead.
    busiest_per_lead: f64,
    /// Which buyer that is (its index in the configuration).
    busiest: usize,
    sold: u64,
    median_to_sale_ms: f64,
    /// Where a routed lead's time went.
    breakdown: Breakdown,
}

/// Medians over the routed leads (ms): arrival to its first call, one
/// call's exchange with the buyer, the time between a call's answer and
/// the next call's row (the next row's commit, which after a ping writes
/// its answer too; after a post, the answer's commit before it; the walk's
/// step, the hop to the buyer's actor, a slot), the last answer to the
/// lead's final state
/// (the sale's commit or the settle), and arrival to final.
#[derive(Default, Clone, Copy)]
struct Breakdown {
    to_first_call: f64,
    call: f64,
    between_calls: f64,
    last_answer_to_final: f64,
    arrival_to_final: f64,
}

impl Breakdown {
    fn line(&self) -> String {
        format!(
            "arrival to first call {:.1} ms, call {:.1} ms, between calls {:.1} ms, last answer to final {:.1} ms, arrival to final {:.1} ms (medians)",
            self.to_first_call, self.call, self.between_calls, self.last_answer_to_final, self.arrival_to_final
        )
    }
}

/// The leads/s the buyers allow: the busiest buyer's calls per second
/// (its slots over the time it holds a call) over its calls per lead.
fn buyer_bound(held_ms: f64, busiest_per_lead: f64) -> f64 {
    MOCK_SLOTS as f64 / (held_ms / 1000.0) / busiest_per_lead
}

/// Runs `serve` on a fresh database, selling to `buyers`, submits
/// `leads`, and (if `wait`) waits until every lead is final. CPU is the
/// server process's user + system time.
fn run_phase(
    backend: Backend,
    routing: &str,
    buyers: &[Process],
    leads: u64,
    clients: usize,
    wait: bool,
) -> Phase {
    let buyers_config = buyers_toml(&bases(buyers), "");
    let database = System::new().block_on(TestDatabase::create(backend));
    let dir = tempfile::tempdir().unwrap();
    let server = serve(
        dir.path(),
        &database.url,
        &format!(
            "[routing]\nsweep_interval = \"1s\"\n{routing}\n\
             [[sources]]\nid = \"bench\"\nkind = \"form\"\nrequired = [\"email\"]\n{buyers_config}"
        ),
    );
    let cpu_before = server.cpu_ms();
    let answered_before = System::new().block_on(answered_by(buyers, wait));
    let cpu_use = CpuUse::start(&server, buyers);
    let url = format!("{}/v1/leads?source=bench", server.base());
    let started = Instant::now();
    let load = System::new().block_on(submit_count(&url, leads, clients));
    let (routed, cpu_per_lead) = if wait {
        System::new().block_on(async {
            let store = Store::connect(&DatabaseSettings {
                url: Secret::new(&database.url),
                ..DatabaseSettings::default()
            })
            .await
            .unwrap();
            let drained = until_none_waits(store.connection(), started).await;
            // Taken at the last final state, the span the rate covers:
            // the tally's reads (every lead, every call) would add to
            // PostgreSQL's and this process's CPU.
            let cpu_per_lead = cpu_use.per_lead(&server, buyers, leads as usize);
            (tally(store.connection(), drained).await, cpu_per_lead)
        })
    } else {
        let cpu_per_lead = cpu_use.per_lead(&server, buyers, leads as usize);
        (Routed::default(), cpu_per_lead)
    };
    let answered_after = System::new().block_on(answered_by(buyers, wait));
    let busiest_held_ms = answered_after
        .get(routed.busiest)
        .map_or(f64::NAN, |after| {
            after.mean_ms_since(&answered_before[routed.busiest])
        });
    let cpu_ms = server.cpu_ms() - cpu_before;
    drop(server);
    let database_work = (backend == Backend::Postgres && wait)
        .then(|| System::new().block_on(DatabaseWork::read(&database.url)));
    Phase {
        load,
        routed_rate: routed.rate,
        waiting_after_intake: routed.waiting_after_intake,
        drain_rate: routed.drain_rate,
        busiest_per_lead: routed.busiest_per_lead,
        busiest_held_ms,
        cpu_per_lead,
        calls: routed.calls,
        cpu_ms,
        sold: routed.sold,
        median_to_sale_ms: routed.median_to_sale_ms,
        breakdown: routed.breakdown,
        database_work,
    }
}

/// What each buyer answered so far, when the phase's buyers answer (and
/// are waited for); none for hanging buyers.
async fn answered_by(buyers: &[Process], answering: bool) -> Vec<Answered> {
    let mut answered = Vec::new();
    if answering {
        for buyer in buyers {
            answered.push(Answered::read(&buyer.base()).await);
        }
    }
    answered
}

/// When the last lead reached a final state, and how fast the leads
/// waiting at the end of intake were routed.
struct Drained {
    elapsed: Duration,
    waiting_after_intake: u64,
    drain_rate: f64,
}

/// Waits until no lead waits to be routed (`started`: the first lead sent).
async fn until_none_waits(db: &DatabaseConnection, started: Instant) -> Drained {
    let intake_ended = Instant::now();
    let waiting_after_intake = lead::Entity::find()
        .filter(lead::Column::State.is_in(["received", "routing"]))
        .count(db)
        .await
        .unwrap();
    // Polled every 50 ms, the probe is whether any lead still waits, not
    // how many (counting them took the database 1.7 ms a poll on
    // PostgreSQL, CPU the run would count as routing's), read in the order
    // of `leads_state_received_at` so that it is the first live entry of
    // that index: unordered, PostgreSQL scanned the table from its start,
    // through every routed lead's old versions (1-2.5 ms a poll, growing
    // as the drain went on).
    loop {
        let still_waiting: Option<String> = lead::Entity::find()
            .select_only()
            .column(lead::Column::Id)
            .filter(lead::Column::State.is_in(["received", "routing"]))
            .order_by_asc(lead::Column::State)
            .order_by_asc(lead::Column::ReceivedAt)
            .limit(1)
            .into_tuple()
            .one(db)
            .await
            .unwrap();
        let Some(waiting) = still_waiting else {
            break;
        };
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "lead {waiting} (and maybe others) never finished"
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    Drained {
        elapsed: started.elapsed(),
        waiting_after_intake,
        drain_rate: waiting_after_intake as f64 / intake_ended.elapsed().as_secs_f64(),
    }
}

/// What the drained run came to, from its rows.
async fn tally(db: &DatabaseConnection, drained: Drained) -> Routed {
    let Drained {
        elapsed,
        waiting_after_intake,
        drain_rate,
    } = drained;
    let total = lead::Entity::find().count(db).await.unwrap();
    let buyers_called: Vec<String> = attempt::Entity::find()
        .select_only()
        .column(attempt::Column::BuyerId)
        .filter(attempt::Column::Kind.is_in(["ping", "post"]))
        .into_tuple()
        .all(db)
        .await
        .unwrap();
    let calls = buyers_called.len() as u64;
    let mut per_buyer: HashMap<String, u64> = HashMap::new();
    for buyer in buyers_called {
        *per_buyer.entry(buyer).or_default() += 1;
    }
    let (busiest_id, busiest) = per_buyer
        .into_iter()
        .max_by_key(|(_, calls)| *calls)
        .unwrap_or_default();
    let leads = lead::Entity::find().all(db).await.unwrap();
    let calls_made = attempt::Entity::find()
        .filter(attempt::Column::Kind.is_in(["ping", "post"]))
        .all(db)
        .await
        .unwrap();
    let breakdown = breakdown(&leads, calls_made);
    let arrived: HashMap<String, DateTime<Utc>> = leads
        .into_iter()
        .map(|lead| (lead.id, lead.received_at))
        .collect();
    let mut to_sale: Vec<f64> = sale::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|sale| {
            let arrived = arrived.get(&sale.lead_id)?;
            Some((sale.sold_at - *arrived).num_microseconds()? as f64 / 1000.0)
        })
        .collect();
    Routed {
        rate: total as f64 / elapsed.as_secs_f64(),
        waiting_after_intake,
        drain_rate,
        calls,
        busiest_per_lead: busiest as f64 / total.max(1) as f64,
        busiest: busiest_id.trim_start_matches('b').parse().unwrap_or(0),
        sold: to_sale.len() as u64,
        median_to_sale_ms: median(&mut to_sale),
        breakdown,
    }
}

/// Where the routed leads' time went (see [`Breakdown`]), from their
/// rows: each call's row is written when it starts and holds its duration;
/// a lead's `updated_at` is when it reached its final state.
fn breakdown(leads: &[lead::Model], mut calls: Vec<attempt::Model>) -> Breakdown {
    let ms = |from: DateTime<Utc>, to: DateTime<Utc>| {
        (to - from).num_microseconds().unwrap_or(0) as f64 / 1000.0
    };
    calls.sort_by(|a, b| (&a.lead_id, a.started_at).cmp(&(&b.lead_id, b.started_at)));
    let mut by_lead: HashMap<&str, Vec<&attempt::Model>> = HashMap::new();
    for call in &calls {
        by_lead.entry(call.lead_id.as_str()).or_default().push(call);
    }
    let ended = |call: &attempt::Model| {
        call.started_at + chrono::Duration::milliseconds(call.duration_ms.unwrap_or(0))
    };
    let (mut first, mut exchange, mut between, mut last, mut total) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for lead in leads {
        let Some(calls) = by_lead.get(lead.id.as_str()) else {
            continue;
        };
        first.push(ms(lead.received_at, calls[0].started_at));
        for pair in calls.windows(2) {
            between.push(ms(ended(pair[0]), pair[1].started_at));
        }
        exchange.extend(
            calls
                .iter()
                .map(|call| call.duration_ms.unwrap_or(0) as f64),
        );
        last.push(ms(ended(calls[calls.len() - 1]), lead.updated_at));
        total.push(ms(lead.received_at, lead.updated_at));
    }
    Breakdown {
        to_first_call: median(&mut first),
        call: median(&mut exchange),
        between_calls: median(&mut between),
        last_answer_to_final: median(&mut last),
        arrival_to_final: median(&mut total),
    }
}

/// Rows PostgreSQL wrote over a phase, by table, from its statistics of the
/// phase's own database: counts, not times, so that a change in the
/// database's work per lead shows through this machine's noise (only the
/// heap-only share moves with timing: its pruning waits for older snapshots).
struct DatabaseWork {
    tables: Vec<TableWork>,
    commits: i64,
}

struct TableWork {
    name: String,
    inserted: i64,
    updated: i64,
    /// Updates that wrote no index entry (heap-only tuples).
    hot: i64,
    /// Indexes without a predicate: each gets an entry per row inserted
    /// and per update that is not heap-only.
    full_indexes: i64,
}

impl DatabaseWork {
    /// Read once the service has gone: each backend sends its counts when
    /// it ends, so the phase's connections are waited for first.
    async fn read(url: &str) -> Self {
        let db = sea_orm::Database::connect(url).await.unwrap();
        let others = "SELECT count(*) AS n FROM pg_stat_activity \
                      WHERE datname = current_database() AND pid <> pg_backend_pid()";
        let waited = Instant::now();
        while scalar(&db, others).await > 0 {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the service's connections stayed"
            );
            actix_web::rt::time::sleep(Duration::from_millis(20)).await;
        }
        let rows = db
            .query_all_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT s.relname AS name, s.n_tup_ins AS inserted, s.n_tup_upd AS updated, \
                        s.n_tup_hot_upd AS hot, \
                        (SELECT count(*) FROM pg_index i \
                          WHERE i.indrelid = s.relid AND i.indpred IS NULL) AS full_indexes \
                   FROM pg_stat_user_tables s \
                  WHERE s.n_tup_ins + s.n_tup_upd > 0 AND s.relname <> 'seaql_migrations' \
                  ORDER BY s.n_tup_ins + s.n_tup_upd DESC",
            ))
            .await
            .unwrap();
        let tables = rows
            .iter()
            .map(|row| TableWork {
                name: row.try_get("", "name").unwrap(),
                inserted: row.try_get("", "inserted").unwrap(),
                updated: row.try_get("", "updated").unwrap(),
                hot: row.try_get("", "hot").unwrap(),
                full_indexes: row.try_get("", "full_indexes").unwrap(),
            })
            .collect();
        let commits = scalar(
            &db,
            "SELECT xact_commit AS n FROM pg_stat_database WHERE datname = current_database()",
        )
        .await;
        Self { tables, commits }
    }

    /// "PostgreSQL rows per lead: leads 1.00 inserted, 1.93 updated (0%
    /// heap-only), …; N index entries, M commits".
    fn per_lead(&self, leads: u64) -> String {
        let per_lead = |count: i64| count as f64 / leads.max(1) as f64;
        let tables: Vec<String> = self
            .tables
            .iter()
            .map(|table| {
                let mut line = format!("{} {:.2} inserted", table.name, per_lead(table.inserted));
                if table.updated > 0 {
                    line += &format!(
                        ", {:.2} updated ({:.0}% heap-only)",
                        per_lead(table.updated),
                        100.0 * table.hot as f64 / table.updated as f64
                    );
                }
                line
            })
            .collect();
        let index_entries: i64 = self
            .tables
            .iter()
            .map(|table| (table.inserted + table.updated - table.hot) * table.full_indexes)
            .sum();
        format!(
            "PostgreSQL rows per lead: {}; {:.1} index entries (indexes without a predicate), {:.2} commits (the bench's polls included)",
            tables.join("; "),
            per_lead(index_entries),
            per_lead(self.commits)
        )
    }
}

/// The `n` column of a one-row query.
async fn scalar(db: &DatabaseConnection, sql: &str) -> i64 {
    db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .unwrap()
        .try_get("", "n")
        .unwrap()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
