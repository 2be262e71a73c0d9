//! `leadrouter demo`: the service on an embedded configuration (SQLite in
//! `data/demo/`), three simulated buyers and a manager inbox (a required
//! notify channel, `demo_inbox`) on loopback ports, and a demo form page at
//! `/demo` using `form.js`, so a newcomer sees leads go in, get accepted
//! when the manager confirms and get sold, and the operators' status page
//! at `/status`.

use std::net::TcpListener;

use actix_web::{web, HttpResponse};

use crate::config::Settings;
use crate::startup::Application;
use crate::{config, demo_inbox, mock_buyer};

/// The demo's configuration, shipped inside the binary.
const DEMO_CONFIG: &str = include_str!("../config/demo.toml");
/// The demo form page (relative URLs: served by leadrouter itself).
pub const DEMO_FORM: &str = include_str!("demo_form.html");

/// The demo buyers: (id, has a ping, accept rate, latency, failure rate).
const DEMO_BUYERS: [(&str, bool, f64, u64, f64); 3] = [
    ("premium", true, 0.35, 150, 0.0),
    ("standard", true, 0.6, 400, 0.05),
    ("flaky", false, 0.8, 100, 0.5),
];

/// The demo with its servers' sockets bound and its settings made, before
/// anything runs: `main` starts the log in the format they name first.
pub struct Demo {
    pub settings: Settings,
    buyers: Vec<(TcpListener, mock_buyer::Behaviour)>,
    inbox: TcpListener,
}

/// Binds the demo buyers' and the inbox's loopback ports and reads the
/// embedded configuration with them (and the environment's overrides).
pub fn prepare() -> anyhow::Result<Demo> {
    let mut buyers = Vec::new();
    let mut buyers_toml = String::new();
    for (priority, (id, with_ping, accept_rate, latency_ms, fail_rate)) in
        DEMO_BUYERS.into_iter().enumerate()
    {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let base = base_of(&listener)?;
        let behaviour = mock_buyer::Behaviour {
            accept_rate,
            latency: std::time::Duration::from_millis(latency_ms),
            fail_rate,
            hang: false,
        };
        buyers.push((listener, behaviour));
        buyers_toml.push_str(&demo_buyer_toml(id, priority, &base, with_ping));
    }
    let inbox = TcpListener::bind("127.0.0.1:0")?;
    let notify_toml = format!(
        "[[notify]]\nid = \"manager\"\nrole = \"manager\"\nurl = \"{}/hook\"\ntimeout = \"3s\"\nrequired = true\nretry_backoff = \"5s\"\n",
        base_of(&inbox)?
    );
    let text = format!("{DEMO_CONFIG}\n{buyers_toml}\n{notify_toml}");
    let settings = config::parse(&text, |name| std::env::var(name).ok()).map_err(|problems| {
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("demo configuration: {}", listed.join("; "))
    })?;
    Ok(Demo {
        settings,
        buyers,
        inbox,
    })
}

impl Demo {
    /// Starts the buyers, the inbox and the service, prints the banner,
    /// and serves until stopped.
    pub async fn run(self) -> anyhow::Result<()> {
        let inbox = base_of(&self.inbox)?;
        for (listener, behaviour) in self.buyers {
            actix_web::rt::spawn(mock_buyer::start(listener, behaviour)?);
        }
        actix_web::rt::spawn(demo_inbox::start(self.inbox)?);
        let token = self
            .settings
            .server
            .admin_token
            .as_ref()
            .map(|token| token.expose().to_string())
            .unwrap_or_default();
        let application = Application::build_with(self.settings, demo_routes).await?;
        let base = format!("http://127.0.0.1:{}", application.port());
        // The banner comes last, after the servers' start-up lines.
        actix_web::rt::spawn(async move {
            wait_until_serving(&base).await;
            println!("\nleadrouter demo is running");
            println!("  demo form:     {base}/demo");
            println!("  manager inbox: {inbox}/   (stop it to watch a lead stay pending)");
            println!("  status page:   {base}/status  (admin token for the review queue: {token})");
            println!(
                "  buyers:        curl -s -H 'Authorization: Bearer {token}' {base}/v1/buyers"
            );
            println!("  a lead by API: curl -s -X POST '{base}/v1/leads?source=website' -H 'Content-Type: application/json' -d '{{\"email\":\"ann@example.com\",\"phone\":\"555-010-9999\",\"state\":\"CA\"}}'");
            println!("  leads (admin): curl -s -H 'Authorization: Bearer {token}' {base}/v1/leads");
            println!(
                "  review queue:  curl -s -H 'Authorization: Bearer {token}' {base}/v1/review"
            );
            println!("  release check: LEADROUTER_ADMIN_TOKEN={token} leadrouter verify-release --url {base} --source website");
        });
        application.run_until_stopped().await?;
        Ok(())
    }
}

/// The URL of a loopback server on `listener`.
fn base_of(listener: &TcpListener) -> std::io::Result<String> {
    Ok(format!("http://{}", listener.local_addr()?))
}

/// Waits until the service answers `/healthz` (a moment after it starts).
async fn wait_until_serving(base: &str) {
    let client = awc::Client::default();
    for _ in 0..100 {
        if let Ok(response) = client.get(format!("{base}/healthz")).send().await {
            if response.status().is_success() {
                // The workers' start-up lines are printed by now.
                actix_web::rt::time::sleep(std::time::Duration::from_millis(200)).await;
                return;
            }
        }
        actix_web::rt::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A demo buyer shaped like BUYER-CONVENTIONS' Medicare-style ping/post API.
fn demo_buyer_toml(id: &str, priority: usize, base: &str, with_ping: bool) -> String {
    let ping = if with_ping {
        format!(
            "[buyers.ping]\nurl = \"{base}/ping\"\ntimeout = \"2s\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nbid_path = \"/bid\"\nping_id_path = \"/leadAuctionId\"\n"
        )
    } else {
        String::new()
    };
    format!(
        "[[buyers]]\nid = \"{id}\"\npriority = {priority}\nprice = 8.0\ncircuit = {{ failure_threshold = 3, open_for = \"20s\" }}\n{ping}[buyers.post]\nurl = \"{base}/post\"\ntimeout = \"5s\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nprice_path = \"/price\"\n"
    )
}

fn demo_routes(config: &mut web::ServiceConfig) {
    config.route(
        "/demo",
        web::get().to(|| async {
            HttpResponse::Ok()
                .content_type("text/html; charset=utf-8")
                .body(DEMO_FORM)
        }),
    );
}
