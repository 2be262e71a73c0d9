//! Intake: store first, the acceptance contract, dedupe, validation, limits.

use entity::{intake_log, lead};
use futures_util::future::join_all;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};

use std::time::Duration;

use crate::helpers::{
    hold_the_leads_table, spawn_app, spawn_app_with, wait_for_pending, wait_until, Backend,
    TestApp, PARTNER_KEY,
};
use crate::on_both_databases;

on_both_databases!(
    nul_characters_are_stored_not_refused,
    a_valid_lead_is_stored_and_accepted_at_once,
    the_intake_log_row_exists_even_when_the_lead_insert_fails,
    a_lead_the_database_refuses_fails_alone_and_keeps_its_log_row,
    raw_bytes_come_back_byte_for_byte,
    twenty_concurrent_submissions_with_one_key_produce_one_lead,
    a_replay_by_each_key_kind_returns_the_first_contract,
    keys_of_any_length_are_stored_and_replayed,
    invalid_and_unparsable_bodies_are_stored_and_listed_in_review,
    a_same_person_duplicate_is_stored_and_marked,
    an_oversized_body_gets_413_and_a_wrong_key_401,
    attribution_and_test_marks_are_kept,
    a_browser_form_post_is_redirected_or_shown_a_page,
    a_source_over_its_rate_limit_gets_429_with_retry_after,
    a_batch_judges_each_lead_on_its_own,
    nested_partner_feeds_are_mapped_by_dotted_paths_or_pass_through_flattened,
    behind_a_trusted_proxy_each_client_has_its_own_ip_and_limit,
    over_max_pending_intake_answers_503_with_retry_after_and_keeps_nothing,
    intake_stays_accepted_while_routing_and_pollers_load_the_database,
    a_lead_is_stored_and_answered_while_the_routing_thread_is_blocked,
);

async fn a_valid_lead_is_stored_and_accepted_at_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let answer = app
        .post_form_lead(&json!({"email": "Ann@Example.com", "phone": "(555) 010-9999"}))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let contract = answer.json();
    assert_eq!(contract["acceptance"], "accepted");
    assert_eq!(contract["accepted"], true);
    assert_eq!(contract["server_recorded"], true);
    assert_eq!(contract["lead_state"], "received");
    assert_eq!(contract["replayed"], false);
    assert_eq!(contract["errors"], json!([]));
    let id = contract["submission_id"].as_str().unwrap();
    let row = stored_lead(&app, id).await;
    assert_eq!(row.fields["email"], "ann@example.com");
    assert_eq!(row.fields["phone"], "5550109999");
    // Routing starts at once; with no buyers configured the lead ends unsold.
    assert!(
        ["received", "routing", "unsold"].contains(&row.state.as_str()),
        "{}",
        row.state
    );
}

async fn the_intake_log_row_exists_even_when_the_lead_insert_fails(backend: Backend) {
    let app = spawn_app(backend).await;
    // A real database failure: the leads table is gone.
    app.store
        .connection()
        .execute_unprepared("ALTER TABLE leads RENAME TO leads_moved_away")
        .await
        .unwrap();
    let body = br#"{"email": "log@example.com"}"#;
    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/json"));
    let answer = app.send(request, body.to_vec()).await;

    assert_eq!(answer.status, 503, "{}", answer.text());
    let contract = answer.json();
    assert_eq!(contract["acceptance"], "failed");
    assert_eq!(contract["server_recorded"], false);
    assert_eq!(contract["error"], "store_unavailable");
    let logged = intake_log::Entity::find()
        .filter(intake_log::Column::LeadId.eq(contract["submission_id"].as_str().unwrap()))
        .one(app.store.connection())
        .await
        .unwrap()
        .expect("the arrival was logged before the failed insert");
    assert_eq!(logged.body, body.to_vec());
    assert_eq!(logged.source_id.as_deref(), Some("website"));
    wait_until(
        "the intake_failed alert",
        Duration::from_secs(10),
        || async {
            entity::alert::Entity::find()
                .filter(entity::alert::Column::Kind.eq("intake_failed"))
                .one(app.store.connection())
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
}

async fn a_lead_the_database_refuses_fails_alone_and_keeps_its_log_row(backend: Backend) {
    let app = spawn_app(backend).await;
    let db = app.store.connection();
    // The database refuses one lead (as a constraint added by hand would).
    let refuse: &[&str] = match backend {
        Backend::Sqlite => &["CREATE TRIGGER refuse_poison BEFORE INSERT ON leads \
             WHEN NEW.idempotency_key = 'poison' \
             BEGIN SELECT RAISE(ABORT, 'refused for the test'); END"],
        Backend::Postgres => &[
            "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN \
             IF NEW.idempotency_key = 'poison' THEN RAISE EXCEPTION 'refused for the test'; \
             END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON leads \
             FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
        ],
    };
    for statement in refuse {
        db.execute_unprepared(statement).await.unwrap();
    }
    // Another connection holds the leads table, so the leads pile up and
    // are written together once it lets go.
    let hold = hold_the_leads_table(&app, backend).await;
    let keys: Vec<String> = (0..12)
        .map(|n| {
            if n == 5 {
                "poison".into()
            } else {
                format!("batch-{n}")
            }
        })
        .collect();
    let sent = join_all(keys.iter().map(|key| post_keyed(&app, key)));
    let release = async {
        wait_for_pending(&app, 12).await;
        hold.rollback().await.unwrap();
    };
    let (answers, ()) = futures_util::join!(sent, release);

    for (key, answer) in keys.iter().zip(&answers) {
        if key == "poison" {
            assert_eq!(answer.status, 503, "{}", answer.text());
            assert_eq!(answer.json()["acceptance"], "failed");
        } else {
            assert_eq!(answer.status, 200, "{key}: {}", answer.text());
            assert_eq!(answer.json()["acceptance"], "accepted");
        }
    }
    let stored = lead::Entity::find()
        .filter(lead::Column::IdempotencyKey.is_in(keys.iter().map(String::as_str)))
        .count(db)
        .await
        .unwrap();
    assert_eq!(stored, 11, "every neighbour of the refused lead is stored");
    // Every arrival left one log row, the refused one's included.
    for key in &keys {
        let logged = intake_log::Entity::find()
            .filter(intake_log::Column::IdempotencyKey.eq(key.as_str()))
            .count(db)
            .await
            .unwrap();
        assert_eq!(logged, 1, "{key}'s intake log rows");
    }
}

/// A form lead `{key}@example.com` sent under `Idempotency-Key: key`.
async fn post_keyed(app: &TestApp, key: &str) -> crate::helpers::Answer {
    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key));
    let body = serde_json::to_vec(&json!({"email": format!("{key}@example.com")})).unwrap();
    app.send(request, body).await
}

async fn raw_bytes_come_back_byte_for_byte(backend: Backend) {
    let app = spawn_app(backend).await;
    let json_body = "{ \"zeta\" :\"last first\",\n\t\"email\":  \"Zoë@Example.com\" , \"alpha\":\"ü 😀 \\u00e9\" }  ";
    let form_body = "email=ann%40example.com&z=1&a=%C3%BC+2&z=3";
    let not_utf8: &[u8] = b"{\"email\": \"a@b.co\", \"x\": \"\xff\xfe\"}";
    let cases: [(&str, &[u8]); 3] = [
        ("application/json", json_body.as_bytes()),
        ("application/x-www-form-urlencoded", form_body.as_bytes()),
        ("application/json", not_utf8),
    ];
    for (content_type, body) in cases {
        let request = app
            .client
            .post(app.url("/v1/leads?source=website"))
            .insert_header(("Content-Type", content_type));
        let answer = app.send(request, body.to_vec()).await;
        let id = answer.json()["submission_id"].as_str().unwrap().to_string();

        let view = app.admin_get(&format!("/v1/leads/{id}")).await.json();
        assert_eq!(view["raw_content_type"], content_type);
        match std::str::from_utf8(body) {
            Ok(text) => {
                assert_eq!(view["raw"], text);
                assert_eq!(view["raw_base64"], Value::Null);
            }
            Err(_) => {
                use base64::Engine;
                let exact = base64::engine::general_purpose::STANDARD.encode(body);
                assert_eq!(view["raw_base64"], exact);
                assert_eq!(view["lead_state"], "invalid");
            }
        }
        let row = app.store.find_lead(&id).await.unwrap().unwrap();
        assert_eq!(
            row.raw,
            body.to_vec(),
            "stored bytes differ for {content_type}"
        );
    }
}

async fn twenty_concurrent_submissions_with_one_key_produce_one_lead(backend: Backend) {
    let app = spawn_app(backend).await;
    let submissions = (0..20).map(|n| {
        let request = app
            .client
            .post(app.url("/v1/leads?source=website"))
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("Idempotency-Key", "same-key-for-all"));
        app.send(request, format!(r#"{{"email": "race{n}@example.com"}}"#))
    });
    let answers = join_all(submissions).await;

    let ids: std::collections::HashSet<String> = answers
        .iter()
        .map(|answer| {
            assert_eq!(answer.status, 200, "{}", answer.text());
            answer.json()["submission_id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids.len(), 1, "every answer names the same lead");
    let fresh = answers
        .iter()
        .filter(|a| a.json()["replayed"] == false)
        .count();
    assert_eq!(fresh, 1, "exactly one submission stored the lead");
    let rows = lead::Entity::find()
        .filter(lead::Column::IdempotencyKey.eq("same-key-for-all"))
        .count(app.store.connection())
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// The unique index holds a digest of (source, key), not the key: a
/// 5,000-character header key and a 3,500-character body `submission_id`
/// (the test source takes 4 KiB bodies) are stored whole and replayed on
/// both databases (PostgreSQL's btree
/// refused such an index row: 503 on every try). The id is derived from
/// the source and the key.
async fn keys_of_any_length_are_stored_and_replayed(backend: Backend) {
    let app = spawn_app(backend).await;
    let header_key = "h".repeat(5_000);
    let by_header = || {
        let request = app
            .client
            .post(app.url("/v1/leads?source=website"))
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("Idempotency-Key", header_key.as_str()));
        app.send(request, r#"{"email": "long-header@example.com"}"#)
    };
    let first = by_header().await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_replay(&first.json(), &by_header().await);

    let body_key = "b".repeat(3_500);
    let lead = json!({"email": "long@example.com", "submission_id": body_key});
    let first = app.post_form_lead(&lead).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_replay(&first.json(), &app.post_form_lead(&lead).await);

    for key in [&header_key, &body_key] {
        let id = leadrouter::domain::keyed_lead_id("website", key);
        let row = app
            .store
            .find_lead(&id)
            .await
            .unwrap()
            .expect("stored under the derived id");
        assert_eq!(
            row.idempotency_key.as_deref(),
            Some(key.as_str()),
            "the whole key is kept"
        );
    }
}

async fn a_replay_by_each_key_kind_returns_the_first_contract(backend: Backend) {
    let app = spawn_app(backend).await;
    let by_header = |email: &str| {
        let request = app
            .client
            .post(app.url("/v1/leads?source=website"))
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("Idempotency-Key", "header-key-1"));
        app.send(request, format!(r#"{{"email": "{email}"}}"#))
    };
    let first = by_header("one@example.com").await.json();
    let again = by_header("changed@example.com").await;
    assert_replay(&first, &again);

    let first = app
        .post_form_lead(&json!({"email": "two@example.com", "submission_id": "form-123"}))
        .await
        .json();
    let again = app
        .post_form_lead(&json!({"email": "two@example.com", "submission_id": "form-123"}))
        .await;
    assert_replay(&first, &again);

    let first = app
        .post_feed_lead(&json!({"email": "three@example.com", "lead_id": 9001}))
        .await
        .json();
    let again = app
        .post_feed_lead(&json!({"email": "three@example.com", "lead_id": 9001}))
        .await;
    assert_replay(&first, &again);
    let row = app
        .store
        .find_lead(first["submission_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.external_id.as_deref(), Some("9001"));

    // The same key from another source is another lead.
    let other_source = app
        .post_form_lead(&json!({"email": "three@example.com", "submission_id": "9001"}))
        .await
        .json();
    assert_eq!(other_source["replayed"], false);
}

fn assert_replay(first: &Value, again: &crate::helpers::Answer) {
    assert_eq!(first["replayed"], false);
    assert_eq!(again.status, 200, "{}", again.text());
    let again = again.json();
    assert_eq!(again["replayed"], true);
    assert_eq!(again["submission_id"], first["submission_id"]);
    assert_eq!(again["server_recorded"], true);
}

async fn invalid_and_unparsable_bodies_are_stored_and_listed_in_review(backend: Backend) {
    let app = spawn_app(backend).await;
    let invalid = app
        .post_form_lead(&json!({"email": "not-an-email", "phone": "12"}))
        .await;
    assert_eq!(invalid.status, 422);
    let invalid = invalid.json();
    assert_eq!(invalid["lead_state"], "invalid");
    assert_eq!(invalid["acceptance"], "pending");
    assert_eq!(invalid["server_recorded"], true);
    assert_eq!(invalid["error"], "invalid_lead");
    let fields: Vec<&str> = invalid["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["email", "phone"]);

    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/json"));
    let broken = app.send(request, r#"{"email": "a@b.co", "#).await;
    assert_eq!(broken.status, 422);
    let broken = broken.json();
    assert_eq!(broken["errors"][0]["field"], "body");

    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "multipart/form-data; boundary=xyz"));
    let multipart = app
        .send(request, "--xyz\r\n\r\nemail=a@b.co\r\n--xyz--")
        .await;
    assert_eq!(multipart.status, 415);
    let multipart = multipart.json();
    assert_eq!(multipart["error"], "unsupported_media_type");
    assert_eq!(multipart["server_recorded"], true);

    let nested = app
        .post_form_lead(&json!({"email": "ok@example.com", "junk": {"deep": [1, {"x": 2}]}}))
        .await;
    assert_eq!(nested.status, 422);

    let review = app.admin_get("/v1/review").await;
    assert_eq!(review.status, 200);
    let listed: Vec<Value> = review.json()["leads"].as_array().unwrap().clone();
    let listed_ids: Vec<&Value> = listed.iter().map(|lead| &lead["id"]).collect();
    assert_eq!(
        listed_ids,
        [
            &invalid["submission_id"],
            &broken["submission_id"],
            &multipart["submission_id"],
            &nested.json()["submission_id"]
        ],
        "oldest first"
    );
    assert_eq!(listed[1]["raw"], r#"{"email": "a@b.co", "#);
    assert!(listed.iter().all(|lead| lead["lead_state"] == "invalid"));
}

async fn a_same_person_duplicate_is_stored_and_marked(backend: Backend) {
    let app = spawn_app(backend).await;
    let original = app
        .post_form_lead(&json!({"email": "twin@example.com", "phone": "555 010 1111"}))
        .await
        .json();
    let by_phone = app
        .post_feed_lead(&json!({"email": "other@example.com", "phone": "(555) 010-1111"}))
        .await;
    assert_eq!(by_phone.status, 200);
    let by_phone = by_phone.json();
    assert_eq!(by_phone["lead_state"], "duplicate");
    assert_eq!(by_phone["duplicate_of"], original["submission_id"]);
    assert_eq!(by_phone["replayed"], false);

    let by_email = app
        .post_form_lead(&json!({"email": "TWIN@example.com"}))
        .await
        .json();
    assert_eq!(by_email["duplicate_of"], original["submission_id"]);

    let stranger = app
        .post_form_lead(&json!({"email": "stranger@example.com"}))
        .await
        .json();
    assert_eq!(stranger["lead_state"], "received");
    assert_eq!(stranger["duplicate_of"], Value::Null);
}

async fn an_oversized_body_gets_413_and_a_wrong_key_401(backend: Backend) {
    let app = spawn_app(backend).await;
    let huge = json!({"email": "big@example.com", "notes": "x".repeat(5000)});
    let answer = app.post_form_lead(&huge).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.json()["error"], "payload_too_large");

    let request = app
        .client
        .post(app.url("/v1/leads"))
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-Api-Key", format!("{PARTNER_KEY}x")));
    let answer = app.send(request, r#"{"email": "a@b.co"}"#).await;
    assert_eq!(answer.status, 401);
    assert_eq!(answer.json()["error"], "unauthorized");

    for path in [
        "/v1/leads?source=nowhere",
        "/v1/leads?source=partner",
        "/v1/leads",
    ] {
        let request = app
            .client
            .post(app.url(path))
            .insert_header(("Content-Type", "application/json"));
        let answer = app.send(request, r#"{"email": "a@b.co"}"#).await;
        assert_eq!(answer.status, 401, "{path}: {}", answer.text());
        assert!(answer.json()["message"].as_str().unwrap().len() > 10);
    }
    let stored = lead::Entity::find()
        .count(app.store.connection())
        .await
        .unwrap();
    assert_eq!(stored, 0, "refused requests store nothing");
}

async fn attribution_and_test_marks_are_kept(backend: Backend) {
    let app = spawn_app(backend).await;
    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/x-www-form-urlencoded"))
        .insert_header(("Referer", "https://ads.example/landing?x=1"))
        .insert_header(("User-Agent", "FormBrowser/1.0"))
        .insert_header(("X-Test-Lead", "1"));
    let body = "email=t%40example.com&utm_source=google&utm_campaign=spring&trustedform_cert_url=https%3A%2F%2Fcert.trustedform.com%2Fabc&consent_text=I+agree";
    let answer = app.send(request, body).await;
    let id = answer.json()["submission_id"].as_str().unwrap().to_string();
    let view = app.admin_get(&format!("/v1/leads/{id}")).await.json();
    assert_eq!(view["test"], true);
    let attribution = &view["attribution"];
    assert_eq!(attribution["utm_source"], "google");
    assert_eq!(attribution["utm_campaign"], "spring");
    assert_eq!(
        attribution["trustedform_cert_url"],
        "https://cert.trustedform.com/abc"
    );
    assert_eq!(attribution["consent_text"], "I agree");
    assert_eq!(attribution["referrer"], "https://ads.example/landing?x=1");
    assert_eq!(attribution["user_agent"], "FormBrowser/1.0");
    assert_eq!(attribution["client_ip"], "127.0.0.1");
    assert!(attribution["received_at"].is_string());
    assert_eq!(view["fields"], json!({"email": "t@example.com"}));

    let by_body = app
        .post_form_lead(&json!({"email": "t2@example.com", "test": true}))
        .await;
    let id = by_body.json()["submission_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        app.admin_get(&format!("/v1/leads/{id}")).await.json()["test"],
        true
    );
}

async fn a_browser_form_post_is_redirected_or_shown_a_page(backend: Backend) {
    let app = spawn_app(backend).await;
    let browser_post = |body: &'static str| {
        let request = app
            .client
            .post(app.url("/v1/leads?source=website"))
            .insert_header(("Content-Type", "application/x-www-form-urlencoded"))
            .insert_header(("Accept", "text/html,application/xhtml+xml"));
        app.send(request, body)
    };
    let accepted = browser_post("email=ann%40example.com&first_name=Ann").await;
    assert_eq!(accepted.status, 303);
    assert_eq!(
        accepted.headers.get("location").unwrap(),
        "https://example.com/thanks"
    );

    let invalid = browser_post("email=nope&first_name=%3Cb%3EAnn").await;
    assert_eq!(invalid.status, 422);
    let page = invalid.text();
    assert!(page.contains("Please check your details"), "{page}");
    assert!(
        page.contains("value=\"nope\""),
        "the entered data is kept: {page}"
    );
    assert!(
        page.contains("&lt;b&gt;Ann"),
        "entered data is escaped: {page}"
    );
    assert!(!page.contains("<b>Ann"));
}

async fn a_source_over_its_rate_limit_gets_429_with_retry_after(backend: Backend) {
    let app = spawn_app_with(
        backend,
        r#"
        [[sources]]
        id = "limited"
        kind = "form"
        rate_limit = { per_ip = "2/min" }
        "#,
    )
    .await;
    let post = || {
        let request = app
            .client
            .post(app.url("/v1/leads?source=limited"))
            .insert_header(("Content-Type", "application/json"));
        app.send(request, r#"{"email": "r@example.com"}"#)
    };
    assert_eq!(post().await.status, 200);
    assert_eq!(post().await.status, 200);
    let limited = post().await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.json()["error"], "rate_limited");
    let retry_after: u64 = limited
        .headers
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
}

async fn a_batch_judges_each_lead_on_its_own(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = r#"{"leads": [ {"email": "b1@example.com", "lead_id": "b-1"},
                              {"email": "bad"},
                              {"email":"b1@example.com","lead_id":"b-1"} ]}"#;
    let request = app
        .client
        .post(app.url("/v1/leads/batch"))
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-Api-Key", PARTNER_KEY));
    let answer = app.send(request, body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let results = answer.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["lead_state"], "received");
    assert_eq!(results[1]["lead_state"], "invalid");
    assert_eq!(results[2]["replayed"], true);
    assert_eq!(results[2]["submission_id"], results[0]["submission_id"]);
    let first = app
        .store
        .find_lead(results[0]["submission_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8(first.raw).unwrap(),
        r#"{"email": "b1@example.com", "lead_id": "b-1"}"#,
        "each lead keeps its own raw bytes"
    );

    let request = app
        .client
        .post(app.url("/v1/leads/batch"))
        .insert_header(("Content-Type", "application/json"));
    assert_eq!(
        app.send(request, body).await.status,
        401,
        "batch needs a feed key"
    );
}

async fn nul_characters_are_stored_not_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = br#"{"email": "nul@example.com", "note": "a\u0000b", "submission_id": "k\u0000ey", "utm_source": "x\u0000"}"#;
    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/json"));
    let answer = app.send(request, body.to_vec()).await;
    assert!(answer.status < 300, "{} {}", answer.status, answer.text());
    let lead = app
        .lead(answer.json()["submission_id"].as_str().unwrap())
        .await;
    assert_eq!(
        lead["raw"].as_str().unwrap().as_bytes(),
        body,
        "raw kept as sent"
    );
}

async fn nested_partner_feeds_are_mapped_by_dotted_paths_or_pass_through_flattened(
    backend: Backend,
) {
    use crate::buyers::{accept, BuyerConfig, TestBuyer};

    let buyer = TestBuyer::start(accept(), accept());
    let texas_only = BuyerConfig {
        extra: "filters = { state = [\"TX\"] }",
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base);
    let app = crate::helpers::spawn_app_adjusted(backend, &texas_only, |settings| {
        let partner = &mut settings.sources[1];
        partner.required = vec!["email".into(), "state".into()];
        partner.fields = Some(
            [
                ("email", "contact.email"),
                ("phone", "contact.phone"),
                ("state", "address.geo.state"),
                ("city", "address.city"),
                ("comment", "comment"),
            ]
            .map(|(name, path)| (name.to_string(), path.to_string()))
            .into(),
        );
    })
    .await;

    // A provider's nested shape, mapped by dotted paths: valid and sold by
    // a buyer whose filter reads the mapped field.
    let answer = app
        .post_feed_lead(&json!({
            "lead_id": "nested-1",
            "contact": {"email": "Ann@Example.com", "phone": "555-010-9999"},
            "address": {"city": "Austin", "geo": {"state": "TX"}},
            "comment": "c".repeat(2500),
        }))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let id = answer.json()["submission_id"].as_str().unwrap().to_string();
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["fields"]["email"], "ann@example.com");
    assert_eq!(view["fields"]["state"], "TX");
    assert_eq!(view["fields"]["city"], "Austin");
    assert_eq!(view["fields"]["comment"].as_str().unwrap().len(), 2500);
    let posted: Value = serde_json::from_str(&buyer.calls("post")[0].body).unwrap();
    assert_eq!(posted["fields"]["city"], "Austin");

    // A form that maps nothing: nested values pass through flattened.
    let answer = app
        .post_form_lead(
            &json!({"email": "bob@example.com", "address": {"city": "Reno", "zip": 89501}}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let id = answer.json()["submission_id"].as_str().unwrap().to_string();
    let view = app.lead(&id).await;
    assert_eq!(view["fields"]["address.city"], "Reno");
    assert_eq!(view["fields"]["address.zip"], "89501");

    // Nesting deeper than 8 levels: stored, invalid, in review.
    let mut deep = json!({"leaf": "x"});
    for _ in 0..8 {
        deep = json!({"level": deep});
    }
    deep["email"] = json!("cy@example.com");
    let answer = app.post_form_lead(&deep).await;
    assert_eq!(answer.status, 422, "{}", answer.text());
    let contract = answer.json();
    assert!(
        contract["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("deeper than 8 levels"),
        "{contract}"
    );
    let review = app.admin_get("/v1/review").await.json();
    assert!(review["leads"]
        .as_array()
        .unwrap()
        .iter()
        .any(|lead| lead["id"] == contract["submission_id"]));
}

/// A form lead for `c{n}@example.com`, as forwarded for `client`.
pub(crate) async fn send_forwarded(
    app: &crate::helpers::TestApp,
    client: &str,
    n: usize,
) -> crate::helpers::Answer {
    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-Forwarded-For", client));
    let body = serde_json::to_vec(&json!({"email": format!("c{n}@example.com")})).unwrap();
    app.send(request, body).await
}

async fn behind_a_trusted_proxy_each_client_has_its_own_ip_and_limit(backend: Backend) {
    use leadrouter::config::RateLimitSettings;

    let two_per_minute = |settings: &mut leadrouter::config::Settings| {
        settings.sources[0].rate_limit = Some(RateLimitSettings {
            per_ip: Some("2/min".parse().unwrap()),
            total: None,
        });
    };
    let proxied = crate::helpers::spawn_app_adjusted(backend, "", |settings| {
        two_per_minute(settings);
        settings.server.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    // Two clients behind the proxy: each has its own limit and its own IP.
    for n in 0..2 {
        let answer = send_forwarded(&proxied, "203.0.113.5", n).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let id = answer.json()["submission_id"].as_str().unwrap().to_string();
        assert_eq!(
            proxied.lead(&id).await["attribution"]["client_ip"],
            "203.0.113.5"
        );
    }
    assert_eq!(send_forwarded(&proxied, "203.0.113.5", 2).await.status, 429);
    let other = send_forwarded(&proxied, "198.51.100.8", 3).await;
    assert_eq!(other.status, 200, "{}", other.text());
    let id = other.json()["submission_id"].as_str().unwrap().to_string();
    assert_eq!(
        proxied.lead(&id).await["attribution"]["client_ip"],
        "198.51.100.8"
    );

    // A peer that is not a trusted proxy: its header changes nothing.
    let direct = crate::helpers::spawn_app_adjusted(backend, "", |settings| {
        two_per_minute(settings);
        settings.server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    })
    .await;
    let first = send_forwarded(&direct, "203.0.113.5", 10).await;
    let id = first.json()["submission_id"].as_str().unwrap().to_string();
    assert_eq!(
        direct.lead(&id).await["attribution"]["client_ip"],
        "127.0.0.1"
    );
    assert_eq!(
        send_forwarded(&direct, "198.51.100.1", 11).await.status,
        200
    );
    assert_eq!(
        send_forwarded(&direct, "198.51.100.2", 12).await.status,
        429,
        "spoofed headers share the peer's limit"
    );
}

async fn over_max_pending_intake_answers_503_with_retry_after_and_keeps_nothing(backend: Backend) {
    let app = crate::helpers::spawn_app_adjusted(backend, "", |settings| {
        settings.intake.max_pending = 3;
    })
    .await;
    // Another connection holds the leads table: intake's writes wait.
    let hold = hold_the_leads_table(&app, backend).await;

    let keyed = |key: &'static str| post_keyed(&app, key);
    let waiting = join_all(["full-1", "full-2", "full-3"].map(keyed));
    let overflow = async {
        wait_for_pending(&app, 3).await;
        let refused = keyed("full-4").await;
        hold.rollback().await.unwrap();
        refused
    };
    let (answers, refused) = futures_util::join!(waiting, overflow);
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.headers.get("retry-after").unwrap(), "1");
    let contract = refused.json();
    assert_eq!(contract["acceptance"], "failed");
    assert_eq!(contract["server_recorded"], false);
    for answer in answers {
        assert!(answer.status < 300, "{}", answer.text());
    }
    // Those that waited are stored (or spooled and then drained).
    wait_until(
        "the waiting leads to be stored",
        Duration::from_secs(30),
        || async {
            lead::Entity::find()
                .filter(lead::Column::IdempotencyKey.is_in(["full-1", "full-2", "full-3"]))
                .count(app.store.connection())
                .await
                .unwrap()
                == 3
        },
    )
    .await;
    // Nothing of the refused lead was kept: not its log row, not the lead.
    let logged = intake_log::Entity::find()
        .filter(intake_log::Column::IdempotencyKey.eq("full-4"))
        .count(app.store.connection())
        .await
        .unwrap();
    assert_eq!(logged, 0);
    let stored = lead::Entity::find()
        .filter(lead::Column::IdempotencyKey.eq("full-4"))
        .count(app.store.connection())
        .await
        .unwrap();
    assert_eq!(stored, 0);
    // Sent again, it is taken.
    assert_eq!(keyed("full-4").await.status, 200);
}

async fn intake_stays_accepted_while_routing_and_pollers_load_the_database(backend: Backend) {
    use crate::buyers::{Answer, BuyerConfig, TestBuyer};

    let slow = TestBuyer::start(
        Answer::Accept {
            delay: Duration::from_millis(200),
        },
        Answer::Reject,
    );
    let config = BuyerConfig {
        extra: "max_concurrency = 100",
        ..BuyerConfig::new("slow", 1)
    }
    .toml(&slow.base);
    let app = crate::helpers::spawn_app_adjusted(backend, &config, |settings| {
        settings.database.max_connections = 4;
        settings.database.acquire_timeout = Duration::from_millis(500);
    })
    .await;
    // Readers take every connection of their pool while the slow buyer
    // keeps routing's busy.
    let held = crate::helpers::hold_every_reader_connection(&app).await;
    let polling = std::cell::Cell::new(true);
    let pollers = join_all((0..10).map(|_| async {
        let mut polls = 0;
        while polling.get() {
            let status = app.send(app.client.get(app.url("/v1/status")), "").await;
            assert_eq!(status.status, 200, "the status answers even so");
            polls += 1;
        }
        polls
    }));
    let intake = async {
        let answers = join_all((0..40).map(|n| {
            let app = &app;
            async move {
                app.post_feed_lead_owned(
                    json!({"lead_id": format!("fg-{n}"), "email": format!("fg{n}@example.com")}),
                )
                .await
            }
        }))
        .await;
        polling.set(false);
        answers
    };
    let (polls, answers) = futures_util::join!(pollers, intake);
    assert!(polls.iter().sum::<usize>() >= 10, "the pollers ran");
    for answer in answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.json()["acceptance"],
            "accepted",
            "stored, not spooled"
        );
    }
    drop(held);
    let status = app
        .send(app.client.get(app.url("/v1/status")), "")
        .await
        .json();
    assert_eq!(status["spool"]["pending"], 0, "{status}");
}

/// Intake runs on a thread of its own: with the thread that runs the
/// router, the waterfalls and the buyers blocked (here: the test's own
/// thread, as a busy routing load would hold it), a lead is still stored
/// and its sender answered `accepted`.
async fn a_lead_is_stored_and_answered_while_the_routing_thread_is_blocked(backend: Backend) {
    let app = spawn_app(backend).await;
    let first = app
        .post_form_lead(&json!({"email": "first@example.com"}))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let url = app.url("/v1/leads?source=website");
    let (answered, answer) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let mut response = awc::Client::default()
                .post(url)
                .insert_header(("Content-Type", "application/json"))
                .send_body(r#"{"email": "while-blocked@example.com"}"#)
                .await
                .expect("request sent");
            let body = response.body().await.expect("body read");
            answered
                .send((response.status().as_u16(), body.to_vec()))
                .unwrap();
        })
    });
    // Blocks this thread (and every actor on it) until the answer comes.
    let (status, body) = answer
        .recv_timeout(Duration::from_secs(30))
        .expect("intake answered while the routing thread was blocked");
    sender.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let contract: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(contract["acceptance"], "accepted");
    let id = contract["submission_id"].as_str().unwrap();
    let row = stored_lead(&app, id).await;
    assert_eq!(row.fields["email"], "while-blocked@example.com");
}

/// The row of a lead its sender was answered for.
async fn stored_lead(app: &TestApp, id: &str) -> lead::Model {
    lead::Entity::find_by_id(id.to_string())
        .one(app.store.connection())
        .await
        .unwrap()
        .expect("the lead row exists once the sender is answered")
}
