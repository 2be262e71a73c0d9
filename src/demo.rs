//! `leadrouter demo`: the service on an embedded configuration (SQLite in
//! `data/demo/`), with a demo form page at `/demo`, so a newcomer sees a lead
//! go in and can look it up.

use actix_web::{web, HttpResponse};

use crate::config;
use crate::startup::Application;

/// The demo's configuration, shipped inside the binary.
const DEMO_CONFIG: &str = include_str!("../config/demo.toml");
const DEMO_FORM: &str = include_str!("demo_form.html");

pub async fn run() -> anyhow::Result<()> {
    let settings = config::parse(DEMO_CONFIG, |name| std::env::var(name).ok())
        .map_err(|problems| anyhow::anyhow!("demo configuration: {problems:?}"))?;
    let token = settings
        .server
        .admin_token
        .as_ref()
        .map(|token| token.expose().to_string())
        .unwrap_or_default();
    let application = Application::build_with(settings, demo_routes).await?;
    let base = format!("http://127.0.0.1:{}", application.port());
    println!("leadrouter demo is running");
    println!("  demo form:    {base}/demo");
    println!("  a lead by API: curl -s -X POST '{base}/v1/leads?source=website' -H 'Content-Type: application/json' -d '{{\"email\":\"ann@example.com\",\"phone\":\"555-010-9999\",\"state\":\"CA\"}}'");
    println!("  leads (admin): curl -s -H 'Authorization: Bearer {token}' {base}/v1/leads");
    println!("  review queue:  curl -s -H 'Authorization: Bearer {token}' {base}/v1/review");
    application.run_until_stopped().await?;
    Ok(())
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
