//! No secret in any view (SPEC section 9): a buyer whose URL, body template
//! and a header reference `${VAR}`, and whose other header is a literal
//! key, gets the real values, while `GET /v1/leads/{id}` (the lead
//! timeline's data), `/v1/buyers`, `/v1/status`, `/metrics` and the
//! service's log show only the references or `[redacted]`; a retry still
//! replays the real values.

use serde_json::Value;

use crate::buyers::{accept, Answer, TestBuyer};
use crate::helpers::{Backend, TestDatabase, ADMIN_TOKEN, BUYER_TOKEN};
use crate::on_both_databases;
use crate::process::{Service, ServiceConfig};

on_both_databases!(secrets_reach_the_buyer_and_no_view_or_log);

const LITERAL_KEY: &str = "literal-buyer-key-4711";

async fn secrets_reach_the_buyer_and_no_view_or_log(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let buyer = TestBuyer::start(accept(), Answer::Reject);
    let base = &buyer.base;
    let buyer_toml = format!(
        r#"
[[buyers]]
id = "acme"
priority = 1
headers = {{ Authorization = "Bearer ${{TEST_BUYER_TOKEN}}", X-Api-Key = "{LITERAL_KEY}" }}
[buyers.ping]
url = "{base}/ping?key=${{TEST_BUYER_TOKEN}}"
accept = {{ path = "/response", equals = "success" }}
[buyers.post]
url = "{base}/post?key=${{TEST_BUYER_TOKEN}}"
accept = {{ path = "/response", equals = "success" }}
price_path = "/price"
body_template = '{{"email": "{{{{fields.email}}}}", "auth": "${{TEST_BUYER_TOKEN}}"}}'
"#
    );
    let config = ServiceConfig::write(&database.url, "2s", &buyer_toml);
    let service = Service::start(&config).await;
    let app = &service.app;
    let id = app
        .submit(serde_json::json!({"email": "ann@example.com"}))
        .await;
    app.wait_for_state(&id, "unsold").await;

    // The buyer got the real values.
    let post = &buyer.calls("post")[0];
    assert_eq!(post.query, format!("key={BUYER_TOKEN}"));
    assert_eq!(post.authorization, format!("Bearer {BUYER_TOKEN}"));
    assert_eq!(post.api_key, LITERAL_KEY);
    assert!(post.body.contains(BUYER_TOKEN), "{}", post.body);

    // A retry of the post replays them from the snapshot, and sells.
    buyer.set_post(accept());
    let view = app.lead(&id).await;
    let post_id = crate::helpers::post_of(&view);
    let retry = app
        .client
        .post(app.url(&format!("/v1/attempts/{post_id}/retry")))
        .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")));
    let retried = app.send(retry, "").await;
    assert!(retried.status < 300, "{}", retried.text());
    app.wait_for_state(&id, "sold").await;
    let again = &buyer.calls("post")[1];
    assert_eq!(again.query, format!("key={BUYER_TOKEN}"));
    assert_eq!(again.api_key, LITERAL_KEY);
    assert!(again.body.contains(BUYER_TOKEN));

    // Every view shows references and redactions only.
    let view = app.lead(&id).await;
    let shown = retried.text()
        + &view.to_string()
        + &app.admin_get("/v1/buyers").await.text()
        + &app.admin_get("/v1/status").await.text()
        + &app.admin_get("/metrics").await.text();
    assert!(!shown.contains(BUYER_TOKEN), "a resolved secret is shown");
    assert!(!shown.contains(LITERAL_KEY), "a literal key is shown");
    let post = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|attempt| attempt["kind"] == "post")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        post["request"]["url"],
        format!("{base}/post?key=${{TEST_BUYER_TOKEN}}")
    );
    assert_eq!(
        post["request"]["headers"]["Authorization"],
        "Bearer ${TEST_BUYER_TOKEN}"
    );
    assert_eq!(post["request"]["headers"]["X-Api-Key"], "[redacted]");
    assert!(post["request"]["body"]
        .as_str()
        .unwrap()
        .contains("${TEST_BUYER_TOKEN}"));
    assert_eq!(post["snapshot"]["headers"]["X-Api-Key"], "[redacted]");

    let log = service.log();
    assert!(
        !log.contains(BUYER_TOKEN) && !log.contains(LITERAL_KEY),
        "{log}"
    );
    assert!(
        !log.contains("ann@example.com"),
        "no personal data in the log"
    );
}
