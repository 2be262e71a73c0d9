//! The admin API's changes (SPEC section 5) on SQLite and PostgreSQL: fixing
//! an invalid lead, reroute, resolve, retry from a snapshot after a reload,
//! returns, an invalid reload, and rate-limited alerts to a webhook.

use serde_json::{json, Value};

use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{
    database_url_of, post_of, spawn_app_with, wait_until, write_config, Backend, TestApp,
    ADMIN_TOKEN,
};
use crate::on_both_databases;

on_both_databases!(
    fixing_an_invalid_lead_routes_it_and_leaves_the_raw_bytes,
    reroute_skips_buyers_posted_to_unless_include_tried_and_never_sells_twice,
    resolve_settles_an_unknown_lead_once,
    a_lead_resolved_not_sold_stays_unsold_when_a_buyer_it_failed_at_recovers,
    a_retry_after_a_reload_goes_to_the_url_of_the_snapshot,
    an_invalid_reload_keeps_the_running_configuration,
    a_reload_that_removes_a_buyer_stops_offering_it_leads,
    a_returned_lead_is_offered_to_the_other_buyers,
    alerts_are_rate_limited_kept_and_sent_to_the_webhook,
    renormalize_rederives_fields_from_raw_bytes_and_routes_the_fixed,
);

impl TestApp {
    /// An admin request with a JSON body.
    pub async fn admin_send(
        &self,
        method: &str,
        path: &str,
        body: Value,
    ) -> crate::helpers::Answer {
        let method = awc::http::Method::from_bytes(method.as_bytes()).unwrap();
        let request = self
            .client
            .request(method, self.url(path))
            .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
            .insert_header(("Content-Type", "application/json"));
        self.send(request, serde_json::to_vec(&body).unwrap()).await
    }
}

async fn fixing_an_invalid_lead_routes_it_and_leaves_the_raw_bytes(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    let raw = br#"{"first_name": "Ann", "email": "not-an-email"}"#;
    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/json"));
    let answer = app.send(request, raw.to_vec()).await;
    assert_eq!(answer.status, 422);
    let id = answer.json()["submission_id"].as_str().unwrap().to_string();

    let still_bad = app
        .admin_send(
            "PATCH",
            &format!("/v1/leads/{id}"),
            json!({"fields": {"email": "still bad"}}),
        )
        .await;
    assert_eq!(still_bad.status, 422, "{}", still_bad.text());
    assert_eq!(still_bad.json()["lead_state"], "invalid");

    let fixed = app
        .admin_send(
            "PATCH",
            &format!("/v1/leads/{id}"),
            json!({"fields": {"email": "Ann@Example.com"}}),
        )
        .await;
    assert_eq!(fixed.status, 200, "{}", fixed.text());
    assert_eq!(fixed.json()["fields"]["email"], "ann@example.com");
    let sold = app.wait_for_state(&id, "sold").await;
    assert_eq!(
        sold["raw"].as_str().unwrap().as_bytes(),
        raw,
        "raw untouched"
    );
    assert_eq!(sold["fields"]["first_name"], "Ann");

    let again = app
        .admin_send(
            "PATCH",
            &format!("/v1/leads/{id}"),
            json!({"fields": {"email": "b@example.com"}}),
        )
        .await;
    assert_eq!(again.status, 409, "only an invalid lead can be fixed");
}

async fn reroute_skips_buyers_posted_to_unless_include_tried_and_never_sells_twice(
    backend: Backend,
) {
    let (first, second, extra) = first_and_second(Answer::Reject, Answer::Reject);
    let app = spawn_app_with(backend, &extra).await;
    let id = app.submit(json!({"email": "ann@example.com"})).await;
    app.wait_for_state(&id, "unsold").await;
    second.set_post(accept());

    let rerouted = app
        .admin_send("POST", &format!("/v1/leads/{id}/reroute"), json!({}))
        .await;
    assert_eq!(rerouted.status, 200, "{}", rerouted.text());
    app.wait_for_state(&id, "unsold").await;
    assert_eq!(
        second.calls("post").len(),
        1,
        "a buyer posted to is skipped"
    );

    let rerouted = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/reroute"),
            json!({"include_tried": true}),
        )
        .await;
    assert_eq!(rerouted.status, 200);
    let sold = app.wait_for_state(&id, "sold").await;
    assert_eq!(sold["sold_to"], "second");
    assert_eq!(first.calls("post").len(), 2);
    assert_eq!(second.calls("post").len(), 2);

    let refused = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/reroute"),
            json!({"include_tried": true}),
        )
        .await;
    assert_eq!(refused.status, 409, "a sold lead is never rerouted");
    assert_eq!(refused.json()["error"], "conflict");
    let missing = app
        .admin_send("POST", "/v1/leads/no-such-lead/reroute", json!({}))
        .await;
    assert_eq!(missing.status, 404);
}

/// Buyers `first` (priority 1) and `second` (2), both accepting pings,
/// posts answered as given; and their `[[buyers]]` TOML.
fn first_and_second(first_post: Answer, second_post: Answer) -> (TestBuyer, TestBuyer, String) {
    let first = TestBuyer::start(accept(), first_post);
    let second = TestBuyer::start(accept(), second_post);
    let toml = format!(
        "{}{}",
        BuyerConfig::new("first", 1).toml(&first.base),
        BuyerConfig::new("second", 2).toml(&second.base)
    );
    (first, second, toml)
}

/// A buyer whose posts time out after 300 ms: its leads end `unknown`.
fn timing_out(buyer: &TestBuyer) -> String {
    BuyerConfig {
        ping_timeout: None,
        post_timeout: "300ms",
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base)
}

async fn resolve_settles_an_unknown_lead_once(backend: Backend) {
    let buyer = TestBuyer::start(accept(), Answer::Hang);
    let app = spawn_app_with(backend, &timing_out(&buyer)).await;
    let sold_id = app.submit(json!({"email": "ann@example.com"})).await;
    let unsold_id = app.submit(json!({"email": "bob@example.com"})).await;
    app.wait_for_state(&sold_id, "unknown").await;
    app.wait_for_state(&unsold_id, "unknown").await;

    let resolved = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{sold_id}/resolve"),
            json!({"buyer_id": "acme", "sold": true, "price": 9.5}),
        )
        .await;
    assert_eq!(resolved.status, 200, "{}", resolved.text());
    assert_eq!(resolved.json()["lead_state"], "sold");
    assert_eq!(resolved.json()["sold_to"], "acme");
    assert_eq!(resolved.json()["price"], 9.5);
    let twice = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{sold_id}/resolve"),
            json!({"buyer_id": "acme", "sold": true}),
        )
        .await;
    assert_eq!(twice.status, 422, "resolved once");
    assert_eq!(twice.json()["error"], "not_unknown");

    let not_sold = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{unsold_id}/resolve"),
            json!({"buyer_id": "acme", "sold": false}),
        )
        .await;
    assert_eq!(not_sold.json()["lead_state"], "unsold");
    assert_eq!(buyer.calls("post").len(), 2, "resolving sends nothing");
}

/// The walk failed at `flaky`, then `acme`'s post timed out: `unknown`.
/// The operator resolves it not sold. When `flaky` answers again, its
/// re-offer must not put the lead back to be routed: the old unanswered
/// post would make it `unknown` again, and a second resolve would give
/// back the post's cap slot twice.
async fn a_lead_resolved_not_sold_stays_unsold_when_a_buyer_it_failed_at_recovers(
    backend: Backend,
) {
    let flaky = TestBuyer::start(Answer::Status(500), Answer::Status(500));
    let hanging = TestBuyer::start(accept(), Answer::Hang);
    let buyers = format!(
        "{}{}",
        BuyerConfig::new("flaky", 0).toml(&flaky.base),
        timing_out(&hanging)
    );
    let app = spawn_app_with(backend, &buyers).await;
    let id = app.submit(json!({"email": "ann@example.com"})).await;
    app.wait_for_state(&id, "unknown").await;
    assert_eq!(flaky.calls("ping").len(), 1);

    let resolved = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/resolve"),
            json!({"buyer_id": "acme", "sold": false}),
        )
        .await;
    assert_eq!(
        resolved.json()["lead_state"],
        "unsold",
        "{}",
        resolved.text()
    );

    // What the router runs when `flaky` is seen answering again.
    let now = chrono::Utc::now();
    let requeued = app
        .store
        .requeue_for_buyer("flaky", now - chrono::Duration::hours(1), now, None, None)
        .await
        .unwrap();
    assert_eq!(requeued, 0, "an operator's settlement is not re-offered");
    let view = app.lead(&id).await;
    assert_eq!(view["lead_state"], "unsold");
    assert!(
        view["why"]
            .as_str()
            .is_some_and(|text| text.contains("operator")),
        "{view}"
    );
    let twice = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/resolve"),
            json!({"buyer_id": "acme", "sold": false}),
        )
        .await;
    assert_eq!(twice.status, 422, "resolved once: {}", twice.text());
}

async fn a_retry_after_a_reload_goes_to_the_url_of_the_snapshot(backend: Backend) {
    let old = TestBuyer::start(accept(), Answer::Reject);
    let new = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&old.base)).await;
    let id = app.submit(json!({"email": "ann@example.com"})).await;
    let unsold = app.wait_for_state(&id, "unsold").await;
    let post_id = post_of(&unsold);

    let config = app.config_path.as_ref().unwrap();
    let database_url = database_url_of(&app);
    write_config(
        config,
        &database_url,
        &BuyerConfig::new("acme", 1).toml(&new.base),
    );
    let reloaded = app.admin_send("POST", "/v1/admin/reload", json!({})).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    assert_eq!(reloaded.json()["buyers_changed"], json!(["acme"]));

    old.set_post(accept());
    let retried = app
        .admin_send("POST", &format!("/v1/attempts/{post_id}/retry"), json!({}))
        .await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    let attempt = retried.json();
    assert_eq!(attempt["retry_of"], post_id.as_str());
    assert_eq!(attempt["outcome"], "accepted");
    assert!(attempt["request"]["url"]
        .as_str()
        .unwrap()
        .starts_with(&old.base));
    assert_eq!(
        old.calls("post").len(),
        2,
        "the retry went to the snapshot's URL"
    );
    assert!(new.calls("post").is_empty());
    let sold = app.lead(&id).await;
    assert_eq!(
        sold["lead_state"], "sold",
        "an accepted retry makes the sale"
    );

    let again = app
        .admin_send("POST", &format!("/v1/attempts/{post_id}/retry"), json!({}))
        .await;
    assert_eq!(again.status, 409, "no second sale: {}", again.text());
    assert_eq!(old.calls("post").len(), 2);

    // New leads go to the reloaded buyer.
    let next = app.submit(json!({"email": "bob@example.com"})).await;
    app.wait_for_state(&next, "sold").await;
    assert_eq!(new.calls("post").len(), 1);
}

async fn an_invalid_reload_keeps_the_running_configuration(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    let database_url = database_url_of(&app);
    write_config(
        app.config_path.as_ref().unwrap(),
        &database_url,
        "[[buyers]]\nid = \"broken\"\n[buyers.post]\nurl = \"\"\n",
    );
    let refused = app.admin_send("POST", "/v1/admin/reload", json!({})).await;
    assert_eq!(refused.status, 422, "{}", refused.text());
    let problems = refused.json()["problems"].to_string();
    assert!(problems.contains("buyers[0].post.url"), "{problems}");

    let id = app.submit(json!({"email": "ann@example.com"})).await;
    app.wait_for_state(&id, "sold").await;
    assert_eq!(
        buyer.calls("post").len(),
        1,
        "the running buyer still sells"
    );
    let buyers = app.admin_get("/v1/buyers").await.json();
    assert_eq!(buyers[0]["id"], "acme");
}

async fn a_returned_lead_is_offered_to_the_other_buyers(backend: Backend) {
    let (first, _second, extra) = first_and_second(accept(), accept());
    let app = spawn_app_with(backend, &extra).await;
    let id = app.submit(json!({"email": "ann@example.com"})).await;
    assert_eq!(app.wait_for_state(&id, "sold").await["sold_to"], "first");

    let returned = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/return"),
            json!({"reason": "disconnected phone", "reroute": true}),
        )
        .await;
    assert_eq!(returned.status, 200, "{}", returned.text());
    wait_until(
        "the lead to be sold again",
        std::time::Duration::from_secs(20),
        || async { app.lead(&id).await["sold_to"] == "second" },
    )
    .await;
    assert_eq!(
        first.calls("post").len(),
        1,
        "the returning buyer is not offered it again"
    );
    let refused = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/resolve"),
            json!({"buyer_id": "first", "sold": true}),
        )
        .await;
    assert_eq!(refused.status, 422, "only an unknown lead is resolved");

    let unsold_return = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/return"),
            json!({"reason": "duplicate"}),
        )
        .await;
    assert_eq!(unsold_return.json()["lead_state"], "unsold");
    let returns = app.lead(&id).await["returns"].clone();
    let kept: Vec<(Value, Value)> = returns
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (entry["buyer_id"].clone(), entry["reason"].clone()))
        .collect();
    assert_eq!(
        kept,
        [
            (json!("first"), json!("disconnected phone")),
            (json!("second"), json!("duplicate"))
        ],
        "every return is kept with its reason: {returns}"
    );
    assert!(returns[0]["at"].is_string());
}

async fn alerts_are_rate_limited_kept_and_sent_to_the_webhook(backend: Backend) {
    let buyer = TestBuyer::start(accept(), Answer::Hang);
    let webhook = TestBuyer::start(accept(), accept());
    let extra = format!(
        "[alerts]\nwebhook_url = \"{}/hook\"\nmin_interval = \"1h\"\n{}",
        webhook.base,
        timing_out(&buyer)
    );
    let app = spawn_app_with(backend, &extra).await;
    for email in ["ann@example.com", "bob@example.com"] {
        let id = app.submit(json!({"email": email})).await;
        app.wait_for_state(&id, "unknown").await;
    }
    wait_until(
        "the webhook to get the alert",
        std::time::Duration::from_secs(10),
        || async { !webhook.calls("hook").is_empty() },
    )
    .await;
    let listed = app.admin_get("/v1/alerts").await.json();
    let timeouts: Vec<&Value> = listed["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|alert| alert["kind"] == "post_timeout")
        .collect();
    assert_eq!(timeouts.len(), 2, "both alerts are kept: {listed}");
    let notified = timeouts
        .iter()
        .filter(|alert| alert["notified"] == true)
        .count();
    assert_eq!(notified, 1, "the second was held back by min_interval");
    let delivered = webhook.calls("hook");
    assert_eq!(
        delivered.len(),
        1,
        "one delivery per (kind, buyer) per interval"
    );
    let body: Value = serde_json::from_str(&delivered[0].body).unwrap();
    assert!(
        body["text"].as_str().unwrap().contains("post_timeout"),
        "Slack text: {body}"
    );
    assert_eq!(body["buyer_id"], "acme");
    let unauthorized = app.send(app.client.get(app.url("/v1/alerts")), "").await;
    assert_eq!(unauthorized.status, 401);
}

/// A feed whose mapping reads `email` from the wrong payload key.
fn vendor_source(email_key: &str) -> String {
    format!(
        "[[sources]]\nid = \"vendor\"\nkind = \"feed\"\napi_key = \"vendor-key-0123456789\"\nrequired = [\"email\"]\n[sources.fields]\nemail = \"{email_key}\"\nzip = \"zip\"\n"
    )
}

async fn renormalize_rederives_fields_from_raw_bytes_and_routes_the_fixed(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let buyer_toml = BuyerConfig::new("acme", 1).toml(&buyer.base);
    let app = spawn_app_with(backend, &format!("{}{buyer_toml}", vendor_source("Email"))).await;
    let mut ids = Vec::new();
    for (n, body) in [
        &br#"{"email_address": "ann@example.com", "zip": "94105"}"#[..],
        br#"{"email_address": "bob@example.com", "zip": "10001", "extra": "\u00e9"}"#,
    ]
    .into_iter()
    .enumerate()
    {
        let request = app
            .client
            .post(app.url("/v1/leads"))
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("X-Api-Key", "vendor-key-0123456789"))
            .insert_header(("Idempotency-Key", format!("vendor-{n}")));
        let answer = app.send(request, body.to_vec()).await;
        assert_eq!(answer.status, 422, "the wrong mapping makes it invalid");
        ids.push(answer.json()["submission_id"].as_str().unwrap().to_string());
    }
    let raw_before: Vec<Value> = futures_util::future::join_all(ids.iter().map(|id| app.lead(id)))
        .await
        .into_iter()
        .map(|lead| json!([lead["raw"], lead["raw_base64"]]))
        .collect();

    let database_url = database_url_of(&app);
    let config = app.config_path.clone().unwrap();
    write_config(
        &config,
        &database_url,
        &format!("{}{buyer_toml}", vendor_source("email_address")),
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leadrouter"))
        .args([
            "renormalize",
            "--source",
            "vendor",
            "--since",
            "1h",
            "--config",
        ])
        .arg(&config)
        .output()
        .expect("renormalize runs");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("changed 2 (2 now valid"), "{printed}");

    for (id, raw) in ids.iter().zip(raw_before) {
        let lead = app.wait_for_state(id, "sold").await;
        assert_eq!(
            json!([lead["raw"], lead["raw_base64"]]),
            raw,
            "raw bytes untouched"
        );
        assert!(lead["fields"]["email"]
            .as_str()
            .unwrap()
            .ends_with("@example.com"));
    }
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_leadrouter"))
        .args([
            "renormalize",
            "--source",
            "vendor",
            "--since",
            "1h",
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("changed 0"),
        "a second run changes nothing"
    );
}

async fn a_reload_that_removes_a_buyer_stops_offering_it_leads(backend: Backend) {
    let (first, second, both) = first_and_second(accept(), accept());
    let app = spawn_app_with(backend, &both).await;
    let id = app.submit(json!({"email": "ann@example.com"})).await;
    assert_eq!(app.wait_for_state(&id, "sold").await["sold_to"], "first");

    let database_url = database_url_of(&app);
    write_config(
        app.config_path.as_ref().unwrap(),
        &database_url,
        &BuyerConfig::new("second", 2).toml(&second.base),
    );
    let reloaded = app.admin_send("POST", "/v1/admin/reload", json!({})).await;
    assert_eq!(
        reloaded.json()["buyers_removed"],
        json!(["first"]),
        "{}",
        reloaded.text()
    );
    let buyers = app.admin_get("/v1/buyers").await.json();
    assert_eq!(buyers.as_array().unwrap().len(), 1);
    assert_eq!(buyers[0]["id"], "second");

    let next = app.submit(json!({"email": "bob@example.com"})).await;
    assert_eq!(app.wait_for_state(&next, "sold").await["sold_to"], "second");
    assert_eq!(
        first.calls("ping").len(),
        1,
        "the removed buyer gets no new attempts"
    );
}
