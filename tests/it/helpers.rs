//! Test helpers: `spawn_app` (port 0, a database of its own on SQLite or
//! PostgreSQL, dropped afterwards), an HTTP client, `wait_until`, and
//! `lines_of` a child process's output.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use leadrouter::config::{self, Settings};
use leadrouter::rate_limit::RateLimiter;
use leadrouter::startup::Application;
use leadrouter::store::Store;

pub use crate::scratch_db::{Backend, TestDatabase};
use serde_json::Value;

pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const PARTNER_KEY: &str = "partner-key-0123456789";

/// The test sources, shared by in-process and child-process configurations.
macro_rules! sources_toml {
    () => {
        r#"
[[sources]]
id = "website"
kind = "form"
required = ["email"]
thank_you_url = "https://example.com/thanks"

[[sources]]
id = "partner"
kind = "feed"
api_key = "partner-key-0123456789"
external_id = "lead_id"
required = ["email"]
"#
    };
}

/// The `[[sources]]` of every test configuration.
pub const SOURCES: &str = sources_toml!();

/// The configuration every test starts from; tests adjust it with `spawn_app_with`.
pub const BASE_CONFIG: &str = concat!(
    r#"
[routing]
sweep_interval = "200ms"
failure_limit = 5
failure_backoff = "100ms"

[server]
admin_token = "test-admin-token"
max_body_bytes = 4096
"#,
    sources_toml!()
);

/// Runs each named `async fn(Backend)` as two tests: `NAME::sqlite` and `NAME::postgres`.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[actix_web::test]
                async fn sqlite() {
                    super::$name($crate::helpers::Backend::Sqlite).await;
                    $crate::helpers::close_stores().await;
                }
                #[actix_web::test]
                async fn postgres() {
                    super::$name($crate::helpers::Backend::Postgres).await;
                    $crate::helpers::close_stores().await;
                }
            }
        )*
    };
}

thread_local! {
    /// Stores of the apps this test started (a test runs on one thread).
    static OPEN_STORES: std::cell::RefCell<Vec<Store>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Closes the pools of this test's apps while the runtime still runs:
/// actors may be mid-query, and sqlx cannot drop a connection outside it.
pub async fn close_stores() {
    let stores = OPEN_STORES.with(|stores| std::mem::take(&mut *stores.borrow_mut()));
    for store in stores {
        store.close().await;
    }
}

/// A running leadrouter on a loopback port with its own database: in this
/// process, or (see `process`) a child process.
pub struct TestApp {
    pub address: String,
    pub store: Store,
    pub client: awc::Client,
    /// The configuration file (in-process apps), for reload tests.
    pub config_path: Option<std::path::PathBuf>,
    /// The rate limiter of an in-process app, for floods too large to send
    /// as requests.
    pub limiter: Option<Arc<RateLimiter>>,
    _database: Option<TestDatabase>,
    _files: Option<tempfile::TempDir>,
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, "").await
}

/// Starts the app on `BASE_CONFIG` plus `extra` TOML (appended).
pub async fn spawn_app_with(backend: Backend, extra: &str) -> TestApp {
    spawn_app_adjusted(backend, extra, |_| {}).await
}

/// As [`spawn_app_with`], with settings the TOML cannot give (a fixed
/// clock) or that `BASE_CONFIG`'s tables already hold (`[routing]` keys).
pub async fn spawn_app_adjusted(
    backend: Backend,
    extra: &str,
    adjust: impl FnOnce(&mut Settings),
) -> TestApp {
    let database = TestDatabase::create(backend).await;
    let url = database.url.clone();
    TestApp {
        _database: Some(database),
        ..spawn_app_on(&url, extra, adjust).await
    }
}

/// A second instance on the database of an app this test started.
pub async fn spawn_instance_of(
    app: &TestApp,
    extra: &str,
    adjust: impl FnOnce(&mut Settings),
) -> TestApp {
    let url = app
        ._database
        .as_ref()
        .expect("an app with its own database")
        .url
        .clone();
    spawn_app_on(&url, extra, adjust).await
}

/// Starts an instance on `database_url` (which outlives it).
async fn spawn_app_on(
    database_url: &str,
    extra: &str,
    adjust: impl FnOnce(&mut Settings),
) -> TestApp {
    leadrouter::telemetry::init(leadrouter::config::LogFormat::Text);
    let mut settings = test_settings(extra);
    let files = tempfile::tempdir().expect("temp dir");
    // Before `adjust`: a test may leave journals there for the app to find.
    settings.intake.spool_dir = files.path().join("spool");
    adjust(&mut settings);
    settings.database.url = config::Secret::new(database_url.to_string());
    settings.server.listen = "127.0.0.1:0".into();
    // The file a reload reads: the same text, with this test's database.
    let config_path = files.path().join("leadrouter.toml");
    write_config(&config_path, database_url, extra);
    settings.source_path = Some(config_path.clone());
    let application = Application::build(settings).await.expect("app builds");
    let address = format!("http://127.0.0.1:{}", application.port());
    let store = application.store().clone();
    let limiter = application.limiter().clone();
    OPEN_STORES.with(|stores| stores.borrow_mut().push(store.clone()));
    actix_web::rt::spawn(application.run_until_stopped());
    TestApp {
        _files: Some(files),
        config_path: Some(config_path),
        limiter: Some(limiter),
        ..TestApp::at(address, store)
    }
}

/// Writes the configuration file of an in-process app: `BASE_CONFIG` plus
/// `extra`, on `database_url` (what `POST /v1/admin/reload` reads).
pub fn write_config(path: &std::path::Path, database_url: &str, extra: &str) {
    let spool = path.with_file_name("spool");
    let text = format!(
        "{BASE_CONFIG}\n{extra}\n[database]\nurl = \"{database_url}\"\n[intake]\nspool_dir = \"{}\"\n",
        spool.display()
    );
    std::fs::write(path, text).expect("config file written");
}

impl TestApp {
    /// A client for a leadrouter at `address` whose database the test
    /// reads through `store`.
    pub fn at(address: String, store: Store) -> Self {
        TestApp {
            address,
            store,
            client: awc::Client::builder()
                .timeout(Duration::from_secs(30))
                .disable_redirects()
                .finish(),
            config_path: None,
            limiter: None,
            _database: None,
            _files: None,
        }
    }
}

/// Runs `sql` on the app's database (to break or mend it under a test).
pub async fn execute(app: &TestApp, sql: &str) {
    use sea_orm::ConnectionTrait;
    app.store
        .connection()
        .execute_unprepared(sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// The one value `query` answers (first column of its first row).
pub async fn one_value<T: sea_orm::TryGetable>(db: &sea_orm::DatabaseConnection, query: &str) -> T {
    use sea_orm::ConnectionTrait;
    let statement = sea_orm::Statement::from_string(db.get_database_backend(), query);
    let row = db.query_one_raw(statement).await.unwrap().unwrap();
    row.try_get_by_index::<T>(0).unwrap()
}

/// Connects the test to a database a child process uses; closed after the test.
pub async fn open_store(url: &str) -> Store {
    let settings = config::DatabaseSettings {
        url: config::Secret::new(url.to_string()),
        ..Default::default()
    };
    let store = Store::connect(&settings)
        .await
        .expect("test connects to the database");
    OPEN_STORES.with(|stores| stores.borrow_mut().push(store.clone()));
    store
}

/// Secrets test configurations may reference as `${NAME}`.
pub const BUYER_TOKEN: &str = "s3cret-buyer-token";

pub fn test_settings(extra: &str) -> Settings {
    let env = |name: &str| (name == "TEST_BUYER_TOKEN").then(|| BUYER_TOKEN.to_string());
    config::parse(&format!("{BASE_CONFIG}\n{extra}"), env).expect("test config is valid")
}

/// The database URL the app's configuration file names.
pub fn database_url_of(app: &TestApp) -> String {
    let text = std::fs::read_to_string(app.config_path.as_ref().unwrap()).unwrap();
    let settings: toml::Table = toml::from_str(&text).unwrap();
    settings["database"]["url"].as_str().unwrap().to_string()
}

/// The id of the lead's post attempt.
pub fn post_of(view: &Value) -> String {
    view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|attempt| attempt["kind"] == "post")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// An HTTP answer read whole: status, headers and body.
pub struct Answer {
    pub status: u16,
    pub headers: awc::http::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "not JSON ({error}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// Sends a request built by `build` with `body`, and reads the answer.
    pub async fn send(&self, request: awc::ClientRequest, body: impl Into<Vec<u8>>) -> Answer {
        let mut response = request.send_body(body.into()).await.expect("request sent");
        let body = response
            .body()
            .limit(16 * 1024 * 1024)
            .await
            .expect("body read");
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: body.to_vec(),
        }
    }

    /// A JSON lead posted to the `website` form source.
    pub async fn post_form_lead(&self, body: &Value) -> Answer {
        let request = self
            .client
            .post(self.url("/v1/leads?source=website"))
            .insert_header(("Content-Type", "application/json"));
        self.send(request, serde_json::to_vec(body).unwrap()).await
    }

    /// A JSON lead posted by the `partner` feed with its key.
    pub async fn post_feed_lead(&self, body: &Value) -> Answer {
        let request = self
            .client
            .post(self.url("/v1/leads"))
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("X-Api-Key", PARTNER_KEY));
        self.send(request, serde_json::to_vec(body).unwrap()).await
    }

    /// As [`TestApp::post_feed_lead`], owning the body (for `join_all`).
    pub async fn post_feed_lead_owned(&self, body: Value) -> Answer {
        self.post_feed_lead(&body).await
    }

    pub async fn admin_get(&self, path: &str) -> Answer {
        let request = self
            .client
            .get(self.url(path))
            .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")));
        self.send(request, Vec::new()).await
    }
}

impl TestApp {
    /// Rewrites the app's configuration file with `extra` (on the same
    /// database) and reloads it through the admin API; answers the report.
    pub async fn reload_with(&self, extra: &str) -> Value {
        let path = self.config_path.as_ref().expect("an app with a file");
        write_config(path, &database_url_of(self), extra);
        let answer = self
            .client
            .post(self.url("/v1/admin/reload"))
            .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")));
        let reloaded = self.send(answer, Vec::new()).await;
        assert_eq!(reloaded.status, 200, "{}", reloaded.text());
        reloaded.json()
    }
}

impl TestApp {
    /// The lead as the admin API shows it.
    pub async fn lead(&self, id: &str) -> Value {
        let answer = self.admin_get(&format!("/v1/leads/{id}")).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()
    }

    /// Waits until the lead reaches `state`, and returns its view.
    pub async fn wait_for_state(&self, id: &str, state: &str) -> Value {
        let deadline = Duration::from_secs(20);
        wait_until(&format!("lead {id} to be {state}"), deadline, || async {
            self.lead(id).await["lead_state"] == state
        })
        .await;
        self.lead(id).await
    }

    /// Posts a JSON lead to the `website` form; returns its id.
    pub async fn submit(&self, body: Value) -> String {
        let answer = self.post_form_lead(&body).await;
        assert!(answer.status < 300, "{}", answer.text());
        answer.json()["submission_id"].as_str().unwrap().to_string()
    }
}

/// Polls `condition` until it holds, or panics with `what` after `deadline`.
pub async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !condition().await {
        assert!(started.elapsed() < deadline, "timed out waiting for {what}");
        actix_web::rt::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A transaction of another connection that keeps intake from writing
/// leads until it is rolled back.
pub async fn hold_the_leads_table(app: &TestApp, backend: Backend) -> sea_orm::DatabaseTransaction {
    use sea_orm::{ConnectionTrait, TransactionTrait};

    let url = database_url_of(app);
    let blocker = sea_orm::Database::connect(url.as_str()).await.unwrap();
    let hold = blocker.begin().await.unwrap();
    let lock = match backend {
        Backend::Sqlite => "CREATE TABLE test_write_lock (x INTEGER)",
        Backend::Postgres => "LOCK TABLE leads IN EXCLUSIVE MODE",
    };
    hold.execute_unprepared(lock).await.unwrap();
    hold
}

/// Waits until intake has `count` leads waiting for their commit.
pub async fn wait_for_pending(app: &TestApp, count: usize) {
    let line = format!("leadrouter_intake_pending {count}\n");
    wait_until(&line, Duration::from_secs(20), || async {
        app.send(app.client.get(app.url("/metrics")), "")
            .await
            .text()
            .contains(&line)
    })
    .await;
}

/// Every connection of the readers' pool, each held by an open transaction
/// (as a saturating load of reads would hold them): taken until one is not
/// given within the app's `acquire_timeout`, which must be under 2 s.
pub async fn hold_every_reader_connection(app: &TestApp) -> Vec<sea_orm::DatabaseTransaction> {
    use sea_orm::TransactionTrait;

    let mut held = Vec::new();
    while let Ok(Ok(txn)) =
        actix_web::rt::time::timeout(Duration::from_secs(2), app.store.connection().begin()).await
    {
        held.push(txn);
    }
    assert!(!held.is_empty());
    held
}

/// `count` valid leads of the `website` source, stored (in `received`)
/// without the router being told: a sweep finds them.
pub async fn stored_leads(store: &Store, count: usize) -> Vec<leadrouter::domain::LeadId> {
    let leads = new_leads(count, chrono::Utc::now());
    let rule = leadrouter::config::DuplicateRule {
        window: Duration::ZERO,
        keys: Vec::new(),
    };
    store.persist_leads(&leads, &rule).await.unwrap();
    leads
        .into_iter()
        .map(|lead| leadrouter::domain::LeadId::from(lead.id))
        .collect()
}

/// `count` valid leads of the `website` source (keys `key-N`, distinct
/// persons) as intake builds them, accepted once stored.
pub fn new_leads(
    count: usize,
    received_at: chrono::DateTime<chrono::Utc>,
) -> Vec<leadrouter::store::NewLead> {
    (0..count)
        .map(|n| leadrouter::store::NewLead {
            id: leadrouter::domain::new_id(),
            source_id: "website".into(),
            idempotency_key: Some(format!("key-{n}")),
            external_id: None,
            raw: Vec::new(),
            raw_content_type: "application/json".into(),
            remote_ip: None,
            fields: serde_json::Map::from_iter([(
                "email".into(),
                serde_json::json!(format!("p{n}@example.com")),
            )]),
            attribution: serde_json::Map::new(),
            is_test: false,
            errors: Vec::new(),
            received_at,
            accept_on_store: true,
        })
        .collect()
}

/// The lines a child process prints, read on a thread of their own (as
/// long as it prints: its pipe never fills), so that a test can wait for
/// one with a deadline. Children bound to port 0 print the port they got:
/// a port picked here and freed before the child binds it could be handed
/// to another test's server first.
pub fn lines_of(output: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(output)
            .lines()
            .map_while(Result::ok)
        {
            let _ = sender.send(line);
        }
    });
    lines
}
