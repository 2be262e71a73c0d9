//! The operators' views: `/v1/status` and `/metrics` on both databases, and
//! the `/status` page in real headless Chromium (driven over WebDriver by
//! chromedriver): it shows each buyer's circuit and changes to `open`
//! without a reload when a buyer fails. The test keeps screenshots in
//! `target/artifacts/`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::browser::Browser;
use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{spawn_app_with, wait_until, Backend, ADMIN_TOKEN};
use crate::on_both_databases;

on_both_databases!(status_and_metrics_report_buyers_leads_and_the_spool);

async fn status_and_metrics_report_buyers_leads_and_the_spool(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    let id = app
        .submit(json!({"email": "ann@example.com", "phone": "555-010-9999"}))
        .await;
    app.wait_for_state(&id, "sold").await;
    let invalid = app.post_form_lead(&json!({"first_name": "Bob"})).await;
    assert_eq!(invalid.status, 422);

    let status = app.send(app.client.get(app.url("/v1/status")), "").await;
    assert_eq!(status.status, 200);
    let text = status.text();
    assert!(
        // The phone as stored (digits); "555" alone can be in a timestamp.
        !text.contains("ann@example.com") && !text.contains("5550109999"),
        "no personal data: {text}"
    );
    let status = status.json();
    assert_eq!(status["leads"]["sold"], 1);
    assert_eq!(status["leads"]["invalid"], 1);
    assert_eq!(status["review"]["pending"], 1);
    assert_eq!(status["spool"]["pending"], 0);
    assert_eq!(status["routing"]["widest"], 256);
    let width = status["routing"]["width"].as_u64().unwrap();
    assert!((32..=256).contains(&width), "{status}");
    let acme = &status["buyers"][0];
    assert_eq!(acme["circuit"], "closed");
    assert_eq!(acme["sold_today"], 1);
    assert!(acme["post_latency"]["p95_ms"].is_u64(), "{acme}");

    let metrics = app
        .send(app.client.get(app.url("/metrics")), "")
        .await
        .text();
    for line in [
        r#"leadrouter_attempts_total{buyer="acme",kind="post",outcome="accepted"} 1"#,
        r#"leadrouter_attempts_total{buyer="acme",kind="ping",outcome="accepted"} 1"#,
        r#"leadrouter_intake_leads_total{outcome="accepted"} 1"#,
        r#"leadrouter_intake_leads_total{outcome="invalid"} 1"#,
        r#"leadrouter_circuit_state{buyer="acme"} 0"#,
        r#"leadrouter_leads{state="sold"} 1"#,
        "leadrouter_spool_pending 0",
        "leadrouter_intake_seconds_count 2",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }

    // The page itself, as curl sees it: every buyer's row is in the HTML.
    let page = app
        .send(app.client.get(app.url("/status")), "")
        .await
        .text();
    assert!(page.contains("<tr data-buyer=\"acme\">"), "{page}");
    assert!(
        page.contains("<span class=\"circuit\" data-state=\"closed\">closed</span>"),
        "{page}"
    );
    assert!(page.contains("sold: <strong>1</strong>"), "{page}");
    assert!(!page.contains("ann@example.com"), "no personal data");

    let openapi = app.send(app.client.get(app.url("/openapi.json")), "").await;
    assert_eq!(openapi.status, 200, "served without auth");
    let text = openapi.text();
    assert!(
        !text.contains(crate::helpers::ADMIN_TOKEN) && !text.contains(crate::helpers::PARTNER_KEY),
        "no secrets"
    );
    let openapi = openapi.json();
    for path in [
        "/v1/leads",
        "/v1/leads/batch",
        "/v1/leads/{id}",
        "/v1/leads/{id}/status",
        "/v1/leads/{id}/reroute",
        "/v1/leads/{id}/resolve",
        "/v1/leads/{id}/return",
        "/v1/attempts/{id}/retry",
        "/v1/review",
        "/v1/alerts",
        "/v1/admin/reload",
        "/v1/buyers",
        "/v1/buyers/{id}/circuit",
        "/v1/status",
        "/metrics",
        "/healthz",
        "/readyz",
        "/status",
        "/openapi.json",
    ] {
        assert!(openapi["paths"][path].is_object(), "{path} is described");
    }
    assert!(openapi["components"]["schemas"]["Contract"].is_object());

    let page = app.send(app.client.get(app.url("/status")), "").await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("<table id=\"buyers\""));
    let script = app
        .send(app.client.get(app.url("/status/assets/status.js")), "")
        .await;
    assert_eq!(
        script.headers.get("content-type").unwrap(),
        "text/javascript; charset=utf-8"
    );
    let missing = app
        .send(app.client.get(app.url("/status/assets/nothing.js")), "")
        .await;
    assert_eq!(missing.status, 404);
}

/// `[[buyer id, data-state, words], ...]` as the status page shows them.
async fn circuits(browser: &Browser) -> Value {
    browser.run("return Array.from(document.querySelectorAll('#buyers tr[data-buyer]')).map(row => [row.dataset.buyer, row.querySelector('.circuit').dataset.state, row.querySelector('.circuit').textContent])").await
}

#[actix_web::test]
async fn the_status_page_shows_a_circuit_opening_without_a_reload() {
    let steady = TestBuyer::start(accept(), Answer::Reject);
    let flaky = TestBuyer::start(accept(), accept());
    let extra = format!(
        "{}{}",
        BuyerConfig {
            extra: "name = \"Flaky Inc\"\ncircuit = { failure_threshold = 2, open_for = \"10m\" }",
            ..BuyerConfig::new("flaky", 1)
        }
        .toml(&flaky.base),
        BuyerConfig {
            extra: "name = \"Steady Co\"",
            ..BuyerConfig::new("steady", 2)
        }
        .toml(&steady.base),
    );
    let app = spawn_app_with(Backend::Sqlite, &extra).await;
    let browser = Browser::start().await;
    browser.open(&app.url("/status")).await;
    wait_until(
        "the page to show both buyers closed",
        Duration::from_secs(20),
        || async {
            circuits(&browser).await
                == json!([
                    ["flaky", "closed", "closed"],
                    ["steady", "closed", "closed"]
                ])
        },
    )
    .await;

    flaky.set_ping(Answer::Status(503));
    let mut last = String::new();
    for n in 0..2 {
        last = app
            .submit(json!({"email": format!("fail{n}@example.com")}))
            .await;
        app.wait_for_state(&last, "unsold").await;
    }
    wait_until(
        "the page to show flaky open",
        Duration::from_secs(20),
        || async { circuits(&browser).await[0] == json!(["flaky", "open", "open"]) },
    )
    .await;
    let shown = browser.run("return document.body.innerText").await;
    let shown = shown.as_str().unwrap();
    assert!(
        shown.contains("Flaky Inc") && shown.contains("Steady Co"),
        "{shown}"
    );
    assert!(
        !shown.contains("@example.com"),
        "no personal data on the status page"
    );
    let reloads = browser
        .run("return performance.getEntriesByType('navigation').length")
        .await;
    assert_eq!(reloads, 1, "the page was loaded once and changed by itself");
    browser.screenshot("status-page.png").await;

    browser.resize(390, 844).await;
    browser.screenshot("status-page-phone.png").await;
    let overflow = browser
        .run("return document.documentElement.scrollWidth <= window.innerWidth + 1")
        .await;
    assert_eq!(
        overflow, true,
        "readable on a phone without sideways scrolling"
    );

    // The review queue leads to a lead's timeline.
    browser.resize(1280, 900).await;
    // Opened from a link without the token: the page asks for it itself.
    browser.run("sessionStorage.clear(); return true").await;
    browser
        .open(&app.url(&format!("/status/leads/{last}")))
        .await;
    wait_until(
        "the lead page to ask for the token",
        Duration::from_secs(20),
        || async {
            browser
                .run("return !document.getElementById('token-form').hidden")
                .await
                == true
        },
    )
    .await;
    browser
        .run(&format!(
            "document.getElementById('token').value = '{ADMIN_TOKEN}'; document.querySelector('#token-form button').click(); return true"
        ))
        .await;
    wait_until(
        "the timeline to explain the lead",
        Duration::from_secs(20),
        || async {
            let why = browser
                .run("return document.getElementById('why').textContent")
                .await;
            why.as_str()
                .is_some_and(|text| text.starts_with("unsold: no buyer bought it"))
        },
    )
    .await;
    let rows = browser
        .run("return document.querySelectorAll('#attempts tr[data-attempt]').length")
        .await;
    assert!(
        rows.as_u64().unwrap() >= 2,
        "every attempt in order: {rows}"
    );
    browser.screenshot("lead-timeline.png").await;
    browser.session_call("DELETE", "", Value::Null).await;
}
