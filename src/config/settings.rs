//! Settings: one struct per section of `leadrouter.toml` (SPEC section 4).
//!
//! Every struct denies unknown keys, durations use `humantime-serde`, and
//! secrets are [`Secret`]s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;

use super::rate::Rate;

/// A string that must never be printed: `Debug` shows `[redacted]`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that needs it (a header, a compare).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub server: ServerSettings,
    #[serde(default)]
    pub database: DatabaseSettings,
    #[serde(default)]
    pub intake: IntakeSettings,
    #[serde(default)]
    pub routing: RoutingSettings,
    #[serde(default)]
    pub alerts: AlertSettings,
    #[serde(default)]
    pub sources: Vec<SourceSettings>,
    #[serde(default)]
    pub buyers: Vec<BuyerSettings>,
    #[serde(default)]
    pub notify: Vec<NotifySettings>,
    #[serde(default)]
    pub events: Vec<EventSettings>,
    #[serde(default)]
    pub supervision: SupervisionSettings,
    #[serde(default)]
    pub faults: FaultSettings,
    #[serde(default)]
    pub log: LogSettings,
    /// The file these settings came from (for reloads); not a key.
    #[serde(skip)]
    pub source_path: Option<PathBuf>,
    /// The clock buyer schedules are read with; not a key (tests fix it).
    #[serde(skip)]
    pub clock: crate::clock::Clock,
}

/// The running settings, replaced whole by a reload; readers take a
/// snapshot ([`SharedSettings::current`]) and keep it for one request.
#[derive(Clone, Debug)]
pub struct SharedSettings(Arc<RwLock<Arc<Settings>>>);

impl SharedSettings {
    pub fn new(settings: Settings) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(settings))))
    }

    pub fn current(&self) -> Arc<Settings> {
        self.0
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    pub fn replace(&self, settings: Settings) {
        *self.0.write().unwrap_or_else(|poison| poison.into_inner()) = Arc::new(settings);
    }
}

/// Restart intensity, as in OTP: more than `max_restarts` actor restarts
/// within `period` stop the service (loudly) instead of restarting forever.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisionSettings {
    pub max_restarts: u32,
    #[serde(with = "humantime_serde")]
    pub period: Duration,
}

impl Default for SupervisionSettings {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            period: Duration::from_secs(60),
        }
    }
}

/// Fault injection for tests of supervision; empty (off) by default and
/// never needed in production.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSettings {
    /// Buyer id -> how many of that buyer's calls panic (after the attempt
    /// row is written, before the request is sent).
    pub buyer_panics: BTreeMap<String, u32>,
    /// Buyer id -> how many of that buyer's half-open probes panic the
    /// same way (a probe lost to a crash must not keep the circuit half-open).
    pub probe_panics: BTreeMap<String, u32>,
    /// How many of the router's full re-offers (for a buyer answering
    /// again; not a probe's) panic as their requeue starts, restarting the
    /// router with the request under way.
    pub router_panics: u32,
}

/// How the log on stderr is written (SPEC section 8); read once at start.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
}

/// `[log] format`: lines for people, or one JSON object per line for log
/// shippers.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Coloured only when stderr is a terminal.
    #[default]
    Text,
    /// Timestamp, level, target, message, fields and the spans' fields.
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    pub listen: String,
    /// Bearer token of the admin API; without it the admin API answers 401.
    pub admin_token: Option<Secret>,
    pub max_body_bytes: usize,
    pub status_public: bool,
    /// Peers whose `Forwarded` / `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<crate::client_ip::ProxyRange>,
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_token: None,
            max_body_bytes: 65536,
            status_public: true,
            trusted_proxies: Vec::new(),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// May hold a password, hence a secret; see [`DatabaseSettings::display_url`].
    pub url: Secret,
    pub max_connections: u32,
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
}

impl DatabaseSettings {
    /// The URL with any password replaced, for logs and summaries.
    pub fn display_url(&self) -> String {
        let url = self.url.expose();
        match (url.find("://"), url.rfind('@')) {
            (Some(scheme_end), Some(at)) if at > scheme_end => {
                let credentials = &url[scheme_end + 3..at];
                let user = credentials.split(':').next().unwrap_or_default();
                format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..])
            }
            _ => url.to_string(),
        }
    }

    pub fn is_sqlite(&self) -> bool {
        self.url.expose().starts_with("sqlite:")
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: Secret::new("sqlite://data/leadrouter.db?mode=rwc"),
            max_connections: 8,
            acquire_timeout: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntakeSettings {
    #[serde(with = "humantime_serde")]
    pub accept_wait: Duration,
    pub spool_dir: PathBuf,
    #[serde(with = "humantime_serde")]
    pub duplicate_window: Duration,
    pub duplicate_keys: Vec<String>,
    /// A longer normalised value makes the lead invalid.
    pub max_field_chars: usize,
    /// Leads waiting for their commit at most; beyond it, 503 `failed`.
    pub max_pending: usize,
}

impl Settings {
    /// True when `origin` is in some form source's `allowed_origins`.
    pub fn allows_origin(&self, origin: &str) -> bool {
        self.sources
            .iter()
            .filter(|source| source.kind == SourceKind::Form)
            .any(|source| {
                source
                    .allowed_origins
                    .iter()
                    .any(|allowed| allowed == origin)
            })
    }

    /// True when some notify channel must confirm before a lead is `accepted`.
    pub fn has_required_channel(&self) -> bool {
        self.notify.iter().any(|channel| channel.required)
    }

    /// How same-person duplicates are found (`intake.duplicate_*`).
    pub fn duplicate_rule(&self) -> DuplicateRule {
        DuplicateRule {
            window: self.intake.duplicate_window,
            keys: self.intake.duplicate_keys.clone(),
        }
    }
}

/// How same-person duplicates are found (`intake.duplicate_*`), as the
/// store applies it.
#[derive(Debug, Clone)]
pub struct DuplicateRule {
    pub window: Duration,
    pub keys: Vec<String>,
}

impl Default for IntakeSettings {
    fn default() -> Self {
        Self {
            accept_wait: Duration::ZERO,
            spool_dir: PathBuf::from("data/spool"),
            duplicate_window: Duration::from_secs(30 * 24 * 3600),
            duplicate_keys: vec!["email".into(), "phone".into()],
            max_field_chars: 10_000,
            max_pending: 10_000,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RoutingMode {
    Waterfall,
    Auction,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingSettings {
    pub mode: RoutingMode,
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    pub pii_fields: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub auction_window: Duration,
    pub reserve_price: Option<f64>,
    /// Routing failures on our side (a database error, a crashed actor,
    /// an answer that could not be recorded) before a lead is set aside in
    /// the review queue with an alert.
    pub failure_limit: u32,
    /// The wait after a lead's first routing failure; it doubles with each
    /// further one (at most an hour).
    #[serde(with = "humantime_serde")]
    pub failure_backoff: Duration,
}

impl Default for RoutingSettings {
    fn default() -> Self {
        Self {
            mode: RoutingMode::Waterfall,
            lease: Duration::from_secs(120),
            sweep_interval: Duration::from_secs(10),
            pii_fields: ["email", "phone", "first_name", "last_name", "address"]
                .map(String::from)
                .to_vec(),
            auction_window: Duration::from_secs(2),
            reserve_price: None,
            failure_limit: 5,
            failure_backoff: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertSettings {
    /// Empty: alerts go to the error log and the database only.
    pub webhook_url: String,
    #[serde(with = "humantime_serde")]
    pub min_interval: Duration,
}

impl Default for AlertSettings {
    fn default() -> Self {
        Self {
            webhook_url: String::new(),
            min_interval: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// Public web form: named by `source`, no key.
    Form,
    /// Partner feed: selected by its `X-Api-Key`.
    Feed,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSettings {
    pub id: String,
    pub kind: SourceKind,
    pub api_key: Option<Secret>,
    /// Payload key holding the provider's own lead id (a dedupe key).
    pub external_id: Option<String>,
    #[serde(default)]
    pub required: Vec<String>,
    #[serde(default)]
    pub thank_you_url: String,
    /// Forms: site origins whose pages may call intake and the status
    /// endpoint from a browser (CORS), e.g. `https://www.example.com`.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    pub rate_limit: Option<RateLimitSettings>,
    /// Normalised name = payload key; `None`: every top-level key passes through.
    pub fields: Option<BTreeMap<String, String>>,
    /// What the source is paid per sold lead (money: TOML float).
    pub payout: Option<f64>,
    /// Or: this fraction of the sale price.
    pub payout_share: Option<f64>,
}

/// What a source is paid per sold lead: a fixed amount, or a share of the
/// sale price (none: nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PayoutRule {
    fixed: Option<f64>,
    share: Option<f64>,
}

impl PayoutRule {
    /// The payout of a sale at `price`.
    pub fn amount(self, price: Option<f64>) -> Option<f64> {
        match (self.fixed, self.share) {
            (Some(fixed), _) => Some(fixed),
            (None, Some(share)) => price.map(|price| price * share),
            (None, None) => None,
        }
    }
}

impl Settings {
    /// The payout rule of the source `source_id` (none for an unknown one).
    pub fn payout_rule(&self, source_id: &str) -> PayoutRule {
        self.sources
            .iter()
            .find(|source| source.id == source_id)
            .map(|source| PayoutRule {
                fixed: source.payout,
                share: source.payout_share,
            })
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    pub per_ip: Option<Rate>,
    pub total: Option<Rate>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuyerSettings {
    pub id: String,
    pub name: Option<String>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: u32,
    #[serde(default = "one_second", with = "humantime_serde")]
    pub queue_timeout: Duration,
    #[serde(default)]
    pub filters: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub hourly_cap: u32,
    #[serde(default)]
    pub daily_cap: u32,
    #[serde(default)]
    pub monthly_cap: u32,
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    pub ping: Option<PingSettings>,
    pub post: PostSettings,
    #[serde(default)]
    pub circuit: CircuitSettings,
    /// Fixed price of a buyer without a ping.
    pub price: Option<f64>,
    pub min_bid: Option<f64>,
    pub schedule: Option<ScheduleSettings>,
    #[serde(default)]
    pub accept_test_leads: bool,
    /// This buyer's table as written, `${VAR}` unresolved: the attempt snapshot.
    #[serde(skip)]
    pub snapshot: crate::domain::ConfigSnapshot,
}

impl BuyerSettings {
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PingSettings {
    pub url: String,
    #[serde(default = "default_ping_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    pub accept: Option<AcceptRule>,
    pub bid_path: Option<String>,
    pub ping_id_path: Option<String>,
    pub body_template: Option<String>,
    pub content_type: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostSettings {
    pub url: String,
    #[serde(default = "default_post_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    pub accept: Option<AcceptRule>,
    pub price_path: Option<String>,
    pub body_template: Option<String>,
    pub content_type: Option<String>,
}

/// How a buyer's answer is judged (SPEC section 7); exactly one form is set.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AcceptRule {
    /// JSON pointer into the response body, with `equals` or `one_of`.
    pub path: Option<String>,
    pub equals: Option<toml::Value>,
    pub one_of: Option<Vec<toml::Value>>,
    pub body_contains: Option<String>,
    pub body_regex: Option<String>,
    pub status: Option<Vec<u16>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CircuitSettings {
    pub failure_threshold: u32,
    #[serde(with = "humantime_serde")]
    pub open_for: Duration,
    #[serde(with = "humantime_serde")]
    pub max_open_for: Duration,
    pub half_open_probes: u32,
}

impl Default for CircuitSettings {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(30),
            max_open_for: Duration::from_secs(600),
            half_open_probes: 1,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSettings {
    pub timezone: String,
    pub days: Vec<String>,
    pub hours: String,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NotifyRole {
    Manager,
    Crm,
}

impl NotifyRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Manager => "manager",
            Self::Crm => "crm",
        }
    }
}

/// How a notify channel delivers (`[[notify]] kind`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NotifyKind {
    /// A JSON POST (or `body_template`) to `url`; any 2xx confirms.
    #[default]
    Webhook,
    /// A Slack incoming webhook at `url`: a readable text message.
    Slack,
    /// The Telegram Bot API at `url` (`https://api.telegram.org`):
    /// `sendMessage` to `chat_id` with `bot_token`.
    Telegram,
    /// E-mail over SMTP: `url` is `smtp://[user:pass@]host[:port]`
    /// (STARTTLS with `?tls=required`) or `smtps://…`; `from`, `to`.
    Email,
}

impl NotifyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Slack => "slack",
            Self::Telegram => "telegram",
            Self::Email => "email",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySettings {
    pub id: String,
    pub role: NotifyRole,
    #[serde(default)]
    pub kind: NotifyKind,
    pub url: Secret,
    #[serde(default = "default_notify_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(default)]
    pub required: bool,
    pub body_template: Option<String>,
    pub content_type: Option<String>,
    /// Extra headers of a webhook channel (values may be `${VAR}`).
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Telegram: the bot's token and the chat to write to.
    pub bot_token: Option<Secret>,
    pub chat_id: Option<String>,
    /// E-mail: sender and recipients.
    pub from: Option<String>,
    #[serde(default)]
    pub to: Vec<String>,
    /// Deliveries in flight at once, per instance.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: u32,
    /// Wait before the second try; doubles on each failure, at most an hour.
    #[serde(default = "default_retry_backoff", with = "humantime_serde")]
    pub retry_backoff: Duration,
}

/// Events a sink may subscribe to (`[[events]] on`), in the order they can happen.
pub const EVENTS: [&str; 5] = [
    "lead.accepted",
    "lead.invalid",
    "lead.sold",
    "lead.unsold",
    "lead.unknown",
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// Names the sink in attempt rows; default `events-N` (its position).
    #[serde(default)]
    pub id: String,
    pub url: Secret,
    pub on: Vec<String>,
    #[serde(default = "default_notify_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(default = "default_retry_backoff", with = "humantime_serde")]
    pub retry_backoff: Duration,
}

fn yes() -> bool {
    true
}
fn default_max_concurrency() -> u32 {
    4
}
fn one_second() -> Duration {
    Duration::from_secs(1)
}
fn default_ping_timeout() -> Duration {
    Duration::from_secs(8)
}
fn default_post_timeout() -> Duration {
    Duration::from_secs(25)
}
fn default_notify_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_retry_backoff() -> Duration {
    Duration::from_secs(30)
}

/// What `check-config` prints for a valid file; secrets are never shown.
pub fn summary(path: &std::path::Path, settings: &Settings) -> String {
    let sources: Vec<String> = settings
        .sources
        .iter()
        .map(|source| format!("{} ({:?})", source.id, source.kind).to_lowercase())
        .collect();
    let buyers: Vec<String> = settings
        .buyers
        .iter()
        .map(|buyer| {
            let shape = if buyer.ping.is_some() {
                "ping/post"
            } else {
                "post"
            };
            let enabled = if buyer.enabled { "" } else { ", disabled" };
            format!(
                "{} (priority {}, {shape}{enabled})",
                buyer.id, buyer.priority
            )
        })
        .collect();
    format!(
        "{}: configuration OK\n  listen:   {}\n  database: {}\n  admin API: {}\n  sources:  {}\n  buyers:   {}\n  notify:   {} channel(s), events: {} postback(s)",
        path.display(),
        settings.server.listen,
        settings.database.display_url(),
        if settings.server.admin_token.is_some() { "enabled" } else { "disabled (no server.admin_token)" },
        if sources.is_empty() { "none".to_string() } else { sources.join(", ") },
        if buyers.is_empty() { "none".to_string() } else { buyers.join(", ") },
        settings.notify.len(),
        settings.events.len(),
    )
}
