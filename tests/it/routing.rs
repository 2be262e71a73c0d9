//! Selling: the routing table of SPEC section 7, row by row, with real
//! buyer servers on loopback ports.

use std::time::{Duration, Instant};

use entity::{alert, attempt, lead, sale};
use futures_util::future::join_all;
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};

use crate::buyers::{accept, refusing_url, Answer, BrokenBuyer, BuyerConfig, TestBuyer};
use crate::helpers::{
    database_url_of, hold_the_leads_table, one_value, open_store, spawn_app_adjusted,
    spawn_app_with, wait_until, write_config, Backend, TestApp, TestDatabase, BUYER_TOKEN,
};
use crate::on_both_databases;

on_both_databases!(
    a_lead_is_pinged_then_posted_and_sold_once,
    the_waterfall_moves_past_rejections_errors_and_ping_timeouts,
    a_post_slower_than_the_ping_limit_still_sells,
    a_hanging_post_leaves_the_lead_unknown_and_is_never_resent,
    a_connection_closed_mid_answer_leaves_the_lead_unknown,
    two_buyers_that_both_accept_make_one_sale,
    the_breaker_opens_skips_half_opens_closes_and_the_skipped_leads_are_sold,
    a_busy_buyer_is_skipped_after_its_queue_timeout,
    a_ping_that_finds_no_free_slot_becomes_a_busy_skip,
    a_buyers_status_counts_the_ping_it_is_answering,
    filters_caps_and_test_leads_are_skipped_with_a_reason,
    intake_answers_at_once_while_every_buyer_hangs,
    an_operator_opens_and_closes_a_circuit,
    templates_reach_buyers_escaped_for_their_content_type,
    a_lead_taken_over_after_a_lost_settle_is_finished_from_its_history,
    leads_beyond_the_routers_room_are_sold_as_walks_end,
    routing_walks_as_many_leads_as_its_buyers_slots_take,
    every_pings_answer_is_written_though_no_post_follows_it,
    a_lead_is_sold_while_readers_hold_every_connection_of_theirs,
    a_reoffer_dropped_by_a_router_restart_is_run_again,
);

fn attempts_of(view: &Value) -> Vec<(String, String, String)> {
    view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["buyer_id"].as_str().unwrap().to_string(),
                a["kind"].as_str().unwrap().to_string(),
                a["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn row(buyer: &str, kind: &str, outcome: &str) -> (String, String, String) {
    (buyer.into(), kind.into(), outcome.into())
}

async fn sales_of(app: &TestApp, lead_id: &str) -> u64 {
    sale::Entity::find()
        .filter(sale::Column::LeadId.eq(lead_id))
        .count(app.store.connection())
        .await
        .unwrap()
}

async fn a_lead_is_pinged_then_posted_and_sold_once(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let config = BuyerConfig {
        extra: "headers = { Authorization = \"Bearer ${TEST_BUYER_TOKEN}\" }",
        ..BuyerConfig::new("acme", 10)
    };
    let app = spawn_app_with(backend, &config.toml(&buyer.base)).await;
    let id = app
        .submit(
            json!({"email": "ann@example.com", "phone": "5550101234", "state": "CA",
                       "trustedform_cert_url": "https://cert.trustedform.com/x"}),
        )
        .await;

    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "acme");
    assert_eq!(view["price"], 15.0);
    assert_eq!(sales_of(&app, &id).await, 1);
    assert_eq!(
        attempts_of(&view),
        [
            row("acme", "ping", "accepted"),
            row("acme", "post", "accepted")
        ]
    );

    let (ping, post) = (&buyer.calls("ping")[0], &buyer.calls("post")[0]);
    assert_eq!(ping.idempotency_key, format!("{id}:acme:ping"));
    assert_eq!(post.idempotency_key, format!("{id}:acme:post"));
    assert_eq!(post.authorization, format!("Bearer {BUYER_TOKEN}"));
    let ping_body: Value = serde_json::from_str(&ping.body).unwrap();
    assert_eq!(
        ping_body["fields"],
        json!({"state": "CA"}),
        "no personal data in pings"
    );
    assert_eq!(
        ping_body["attribution"]["trustedform_cert_url"],
        "https://cert.trustedform.com/x"
    );
    let post_body: Value = serde_json::from_str(&post.body).unwrap();
    assert_eq!(post_body["fields"]["email"], "ann@example.com");
    assert_eq!(post_body["ping_id"], "4242");
    assert_eq!(post_body["bid"], 12.5);
    assert_eq!(post_body["lead_id"], id.as_str());

    let stored = &view["attempts"][1];
    assert_eq!(
        stored["request"]["headers"]["Authorization"],
        "Bearer ${TEST_BUYER_TOKEN}"
    );
    assert_eq!(
        stored["snapshot"]["headers"]["Authorization"],
        "Bearer ${TEST_BUYER_TOKEN}"
    );
    assert_eq!(stored["http_status"], 200);
    assert!(stored["response_body"]
        .as_str()
        .unwrap()
        .contains("success"));
    assert!(
        !view.to_string().contains(BUYER_TOKEN),
        "the secret never shows"
    );
}

async fn the_waterfall_moves_past_rejections_errors_and_ping_timeouts(backend: Backend) {
    let rejecting = TestBuyer::start(Answer::Reject, accept());
    let failing = TestBuyer::start(Answer::Status(503), accept());
    let throttling = TestBuyer::start(Answer::Status(429), accept());
    let garbled = TestBuyer::start(Answer::NotJson, accept());
    let slow = TestBuyer::start(Answer::Hang, accept());
    let post_rejecting = TestBuyer::start(accept(), Answer::Reject);
    let post_failing = TestBuyer::start(accept(), Answer::Status(500));
    let post_throttling = TestBuyer::start(accept(), Answer::Status(429));
    let taker = TestBuyer::start(accept(), accept());
    let refused = refusing_url();
    let mut config = String::new();
    for (id, priority, base) in [
        ("rejecting", 1, &rejecting.base),
        ("failing", 2, &failing.base),
        ("throttling", 3, &throttling.base),
        ("garbled", 4, &garbled.base),
        ("post_rejecting", 7, &post_rejecting.base),
        ("post_failing", 8, &post_failing.base),
        ("post_throttling", 9, &post_throttling.base),
        ("taker", 11, &taker.base),
    ] {
        config += &BuyerConfig::new(id, priority).toml(base);
    }
    config += &BuyerConfig {
        ping_timeout: Some("300ms"),
        ..BuyerConfig::new("slow", 5)
    }
    .toml(&slow.base);
    config += &BuyerConfig::new("refused_ping", 6).toml(&refused);
    config += &BuyerConfig {
        ping_timeout: None,
        ..BuyerConfig::new("refused_post", 10)
    }
    .toml(&refused);
    let app = spawn_app_with(backend, &config).await;

    let id = app.submit(json!({"email": "wf@example.com"})).await;
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "taker");
    assert_eq!(
        attempts_of(&view),
        [
            row("rejecting", "ping", "rejected"),
            row("failing", "ping", "error"),
            row("throttling", "ping", "error"),
            row("garbled", "ping", "error"),
            row("slow", "ping", "timeout"),
            row("refused_ping", "ping", "error"),
            row("post_rejecting", "ping", "accepted"),
            row("post_rejecting", "post", "rejected"),
            row("post_failing", "ping", "accepted"),
            row("post_failing", "post", "error"),
            row("post_throttling", "ping", "accepted"),
            row("post_throttling", "post", "error"),
            row("refused_post", "post", "error"),
            row("taker", "ping", "accepted"),
            row("taker", "post", "accepted"),
        ]
    );
    for buyer in [&rejecting, &failing, &throttling, &garbled, &slow] {
        assert!(
            buyer.calls("post").is_empty(),
            "no post without an accepted ping"
        );
    }
}

/// A waterfall ping's answer is written with the walk's next row; here no
/// post follows either ping: the first is followed by a skip (its bid
/// under `min_bid`), the last by nothing (the walk ends unsold), and both
/// answers are still written, whole.
async fn every_pings_answer_is_written_though_no_post_follows_it(backend: Backend) {
    let cheap = TestBuyer::start(accept(), accept());
    let last = TestBuyer::start(Answer::Reject, accept());
    let config = BuyerConfig {
        extra: "min_bid = 15.0",
        ..BuyerConfig::new("cheap", 1)
    }
    .toml(&cheap.base)
        + &BuyerConfig::new("last", 2).toml(&last.base);
    let app = spawn_app_with(backend, &config).await;

    let id = app.submit(json!({"email": "no-post@example.com"})).await;
    let view = app.wait_for_state(&id, "unsold").await;
    assert_eq!(
        attempts_of(&view),
        [
            row("cheap", "ping", "accepted"),
            row("cheap", "skip", "below_min_bid"),
            row("last", "ping", "rejected"),
        ]
    );
    let rows = app.store.attempts_of(&id).await.unwrap();
    let pings: Vec<(Option<f64>, Option<i32>)> = rows
        .iter()
        .filter(|attempt| attempt.kind == "ping")
        .map(|ping| (ping.bid, ping.http_status))
        .collect();
    assert_eq!(
        pings,
        [(Some(12.5), Some(200)), (None, Some(200))],
        "each ping's whole answer is kept"
    );
    assert!(cheap.calls("post").is_empty() && last.calls("post").is_empty());
}

async fn a_post_slower_than_the_ping_limit_still_sells(backend: Backend) {
    let buyer = TestBuyer::start(
        accept(),
        Answer::Accept {
            delay: Duration::from_millis(2500),
        },
    );
    let config = BuyerConfig {
        ping_timeout: Some("1s"),
        post_timeout: "5s",
        ..BuyerConfig::new("patient", 1)
    };
    let app = spawn_app_with(backend, &config.toml(&buyer.base)).await;
    let id = app.submit(json!({"email": "slowpost@example.com"})).await;
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(
        attempts_of(&view),
        [
            row("patient", "ping", "accepted"),
            row("patient", "post", "accepted")
        ]
    );
    assert!(view["attempts"][1]["duration_ms"].as_i64().unwrap() >= 2500);
}

async fn a_hanging_post_leaves_the_lead_unknown_and_is_never_resent(backend: Backend) {
    let hanging = TestBuyer::start(accept(), Answer::Hang);
    let next = TestBuyer::start(accept(), accept());
    let config = BuyerConfig {
        post_timeout: "1s",
        ..BuyerConfig::new("hanging", 1)
    }
    .toml(&hanging.base)
        + &BuyerConfig::new("next", 2).toml(&next.base);
    let app = spawn_app_with(backend, &config).await;
    let id = app.submit(json!({"email": "hang@example.com"})).await;

    let view = app.wait_for_state(&id, "unknown").await;
    assert_eq!(
        attempts_of(&view),
        [
            row("hanging", "ping", "accepted"),
            row("hanging", "post", "timeout")
        ]
    );
    // Several sweep intervals (200 ms) pass: nothing is re-sent.
    actix_web::rt::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(hanging.calls("post").len(), 1);
    assert!(next.calls("ping").is_empty() && next.calls("post").is_empty());
    assert_eq!(app.lead(&id).await["lead_state"], "unknown");
    assert_eq!(sales_of(&app, &id).await, 0);
    let alerts = alert::Entity::find()
        .filter(alert::Column::Kind.eq("post_timeout"))
        .filter(alert::Column::LeadId.eq(id.as_str()))
        .count(app.store.connection())
        .await
        .unwrap();
    assert_eq!(alerts, 1);
    let review = app.admin_get("/v1/review").await.json();
    assert!(review["leads"]
        .as_array()
        .unwrap()
        .iter()
        .any(|lead| lead["id"] == id.as_str()));
}

async fn a_connection_closed_mid_answer_leaves_the_lead_unknown(backend: Backend) {
    let broken = BrokenBuyer::start();
    let next = TestBuyer::start(accept(), accept());
    let config = BuyerConfig {
        ping_timeout: None,
        ..BuyerConfig::new("broken", 1)
    }
    .toml(&broken.base)
        + &BuyerConfig::new("next", 2).toml(&next.base);
    let app = spawn_app_with(backend, &config).await;
    let id = app.submit(json!({"email": "cut@example.com"})).await;
    let view = app.wait_for_state(&id, "unknown").await;
    assert_eq!(attempts_of(&view), [row("broken", "post", "timeout")]);
    actix_web::rt::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(broken.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(next.calls("post").is_empty());
}

async fn two_buyers_that_both_accept_make_one_sale(backend: Backend) {
    let first = TestBuyer::start(accept(), accept());
    let second = TestBuyer::start(accept(), accept());
    let config = BuyerConfig::new("first", 1).toml(&first.base)
        + &BuyerConfig::new("second", 2).toml(&second.base);
    let app = spawn_app_with(backend, &config).await;
    let ids =
        join_all((0..5).map(|n| app.submit(json!({"email": format!("both{n}@example.com")}))))
            .await;
    for id in &ids {
        let view = app.wait_for_state(id, "sold").await;
        assert_eq!(view["sold_to"], "first");
        assert_eq!(sales_of(&app, id).await, 1);
    }
    assert!(second.calls("ping").is_empty());
    // The unique index refuses a second sale whatever asks for it.
    let again = sale::Entity::insert(sale::ActiveModel {
        id: Set("second-sale".into()),
        lead_id: Set(ids[0].clone()),
        buyer_id: Set("second".into()),
        attempt_id: Set(None),
        price: Set(Some(1.0)),
        sold_at: Set(chrono::Utc::now()),
        returned_at: Set(None),
        return_reason: Set(None),
        payout: Set(None),
    })
    .exec_without_returning(app.store.connection())
    .await;
    assert!(
        matches!(
            again.map_err(|error| error.sql_err()),
            Err(Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
        ),
        "a second sale must be refused by the database"
    );
    assert_eq!(sales_of(&app, &ids[0]).await, 1);
}

async fn buyer_status(app: &TestApp, id: &str) -> Value {
    let buyers = app.admin_get("/v1/buyers").await.json();
    buyers
        .as_array()
        .unwrap()
        .iter()
        .find(|buyer| buyer["id"] == id)
        .cloned()
        .unwrap()
}

async fn the_breaker_opens_skips_half_opens_closes_and_the_skipped_leads_are_sold(
    backend: Backend,
) {
    let buyer = TestBuyer::start(accept(), Answer::Status(503));
    let config = BuyerConfig {
        ping_timeout: None,
        extra: "circuit = { failure_threshold = 2, open_for = \"1s\", max_open_for = \"4s\" }",
        ..BuyerConfig::new("fragile", 1)
    };
    let app = spawn_app_with(backend, &config.toml(&buyer.base)).await;

    let first = app.submit(json!({"email": "b1@example.com"})).await;
    app.wait_for_state(&first, "unsold").await;
    let second = app.submit(json!({"email": "b2@example.com"})).await;
    app.wait_for_state(&second, "unsold").await;
    let status = buyer_status(&app, "fragile").await;
    assert_eq!(status["circuit"], "open");
    assert_eq!(status["consecutive_failures"], 2);

    let third = app.submit(json!({"email": "b3@example.com"})).await;
    let view = app.wait_for_state(&third, "unsold").await;
    assert_eq!(view["attempts"][0]["kind"], "skip");
    assert_eq!(view["attempts"][0]["reason"], "circuit_open");
    assert_eq!(
        buyer.calls("post").len(),
        2,
        "an open circuit is not called"
    );

    buyer.set_post(accept());
    for id in [&first, &second, &third] {
        app.wait_for_state(id, "sold").await;
    }
    assert_eq!(buyer.calls("post").len(), 5);
    let status = buyer_status(&app, "fragile").await;
    assert_eq!(status["circuit"], "closed");
    assert_eq!(status["sold_today"], 3);
    let kinds: Vec<String> = alert::Entity::find()
        .all(app.store.connection())
        .await
        .unwrap()
        .into_iter()
        .map(|alert| alert.kind)
        .collect();
    assert!(
        kinds.contains(&"circuit_opened".to_string())
            && kinds.contains(&"circuit_closed".to_string()),
        "{kinds:?}"
    );
}

/// Two leads at once, to `narrow` (one slot, a 200 ms `queue_timeout`, its
/// pings or, without a ping, its posts answered after 1.5 s, and `extra`
/// keys) and then to `wide`: `narrow`, the app, and each lead's view once
/// sold.
async fn two_leads_at_a_one_slot_buyer(
    backend: Backend,
    with_ping: bool,
    extra: &str,
) -> (TestBuyer, TestApp, Vec<Value>) {
    let slow = Answer::Accept {
        delay: Duration::from_millis(1500),
    };
    let narrow = if with_ping {
        TestBuyer::start(slow, accept())
    } else {
        TestBuyer::start(accept(), slow)
    };
    let wide = TestBuyer::start(accept(), accept());
    let extra = format!("max_concurrency = 1\nqueue_timeout = \"200ms\"\n{extra}");
    let config = BuyerConfig {
        ping_timeout: with_ping.then_some("2s"),
        extra: &extra,
        ..BuyerConfig::new("narrow", 1)
    }
    .toml(&narrow.base)
        + &BuyerConfig::new("wide", 2).toml(&wide.base);
    let app = spawn_app_with(backend, &config).await;
    let ids =
        join_all((0..2).map(|n| app.submit(json!({"email": format!("busy{n}@example.com")}))))
            .await;
    let mut views = Vec::new();
    for id in &ids {
        views.push(app.wait_for_state(id, "sold").await);
    }
    views.sort_by_key(|view| view["sold_to"].as_str().unwrap().to_string());
    let sold_to: Vec<&Value> = views.iter().map(|view| &view["sold_to"]).collect();
    assert_eq!(sold_to, ["narrow", "wide"]);
    (narrow, app, views)
}

/// A post takes its slot once its row is written (with its cap slot): the
/// row of a post that found no slot in time becomes the `busy` skip, is
/// never sent, and gives its cap slot back.
async fn a_busy_buyer_is_skipped_after_its_queue_timeout(backend: Backend) {
    let (narrow, app, views) = two_leads_at_a_one_slot_buyer(backend, false, "daily_cap = 2").await;
    assert_eq!(
        attempts_of(&views[1]),
        [
            row("narrow", "skip", "busy"),
            row("wide", "ping", "accepted"),
            row("wide", "post", "accepted"),
        ],
        "the waiting post's row became the skip, nothing left in flight"
    );
    assert_eq!(views[1]["attempts"][0]["reason"], "busy");
    assert_eq!(
        narrow.calls("post").len(),
        1,
        "the skipped post was never sent"
    );
    let buyers = app.admin_get("/v1/buyers").await.json();
    let narrow_caps = buyers
        .as_array()
        .unwrap()
        .iter()
        .find(|buyer| buyer["id"] == "narrow")
        .map(|buyer| &buyer["caps"][0])
        .unwrap();
    assert_eq!(
        narrow_caps["used"], 1,
        "only the sale holds a cap slot: {narrow_caps}"
    );
}

/// A ping takes its slot once its row is written: the row of a ping that
/// found no slot in time becomes the `busy` skip, and is never sent.
async fn a_ping_that_finds_no_free_slot_becomes_a_busy_skip(backend: Backend) {
    let (narrow, _, views) = two_leads_at_a_one_slot_buyer(backend, true, "").await;
    assert_eq!(
        attempts_of(&views[0]),
        [
            row("narrow", "ping", "accepted"),
            row("narrow", "post", "accepted"),
        ]
    );
    assert_eq!(
        attempts_of(&views[1]),
        [
            row("narrow", "skip", "busy"),
            row("wide", "ping", "accepted"),
            row("wide", "post", "accepted"),
        ],
        "the waiting ping's row became the skip, nothing left in flight"
    );
    assert_eq!(views[1]["attempts"][0]["reason"], "busy");
    assert_eq!(
        narrow.calls("ping").len(),
        1,
        "the skipped ping was never sent"
    );
}

/// A ping takes its slot after its row is written, away from the buyer
/// actor's turn: the status shows it in flight all the same.
async fn a_buyers_status_counts_the_ping_it_is_answering(backend: Backend) {
    let slow = TestBuyer::start(
        Answer::Accept {
            delay: Duration::from_secs(3),
        },
        accept(),
    );
    let config = BuyerConfig {
        ping_timeout: Some("10s"),
        ..BuyerConfig::new("slow", 1)
    }
    .toml(&slow.base);
    let app = spawn_app_with(backend, &config).await;
    let id = app.submit(json!({"email": "counted@example.com"})).await;
    wait_until(
        "the ping counted in flight",
        Duration::from_secs(3),
        || async { buyer_status(&app, "slow").await["in_flight"] == 1 },
    )
    .await;
    assert!(slow.calls("post").is_empty(), "still answering the ping");
    app.wait_for_state(&id, "sold").await;
    wait_until("the slots given back", Duration::from_secs(5), || async {
        buyer_status(&app, "slow").await["in_flight"] == 0
    })
    .await;
}

async fn filters_caps_and_test_leads_are_skipped_with_a_reason(backend: Backend) {
    let picky = TestBuyer::start(accept(), accept());
    let anyone = TestBuyer::start(accept(), accept());
    let config = BuyerConfig {
        extra: "filters = { state = [\"CA\"] }\ndaily_cap = 1",
        ..BuyerConfig::new("picky", 1)
    }
    .toml(&picky.base)
        + &BuyerConfig::new("anyone", 2).toml(&anyone.base);
    let app = spawn_app_with(backend, &config).await;

    let texan = app
        .submit(json!({"email": "tx@example.com", "state": "TX"}))
        .await;
    let view = app.wait_for_state(&texan, "sold").await;
    assert_eq!(view["sold_to"], "anyone");
    assert_eq!(view["attempts"][0]["reason"], "filtered");

    let californian = app
        .submit(json!({"email": "ca1@example.com", "state": "ca"}))
        .await;
    assert_eq!(
        app.wait_for_state(&californian, "sold").await["sold_to"],
        "picky"
    );
    let over_cap = app
        .submit(json!({"email": "ca2@example.com", "state": "CA"}))
        .await;
    let view = app.wait_for_state(&over_cap, "sold").await;
    assert_eq!(view["sold_to"], "anyone");
    assert_eq!(view["attempts"][0]["reason"], "capped");

    let test_lead = app
        .submit(json!({"email": "t@example.com", "state": "CA", "test": true}))
        .await;
    let view = app.wait_for_state(&test_lead, "unsold").await;
    let reasons: Vec<&Value> = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["reason"])
        .collect();
    assert_eq!(reasons, [&json!("test_lead"), &json!("test_lead")]);
    assert_eq!(
        picky.calls("ping").len(),
        1,
        "only the californian reached picky"
    );
}

async fn intake_answers_at_once_while_every_buyer_hangs(backend: Backend) {
    let stuck = TestBuyer::start(Answer::Hang, Answer::Hang);
    let also_stuck = TestBuyer::start(accept(), Answer::Hang);
    let config = BuyerConfig {
        ping_timeout: Some("10s"),
        post_timeout: "25s",
        ..BuyerConfig::new("stuck", 1)
    }
    .toml(&stuck.base)
        + &BuyerConfig {
            ping_timeout: None,
            post_timeout: "25s",
            ..BuyerConfig::new("also_stuck", 2)
        }
        .toml(&also_stuck.base);
    let app = spawn_app_with(backend, &config).await;
    // Far below the buyer timeouts (10 s, 25 s): intake must not wait for them.
    let deadline = Duration::from_secs(2);
    for n in 0..30 {
        let started = Instant::now();
        let answer = app
            .post_form_lead(&json!({"email": format!("h{n}@example.com")}))
            .await;
        assert_eq!(answer.status, 200);
        assert!(
            started.elapsed() < deadline,
            "intake waited {:?}",
            started.elapsed()
        );
    }
    wait_until("buyers to be called", Duration::from_secs(10), || async {
        !stuck.calls("ping").is_empty()
    })
    .await;
}

async fn an_operator_opens_and_closes_a_circuit(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    let set = |state| set_circuit(&app, state);
    let opened = set("open").await;
    assert_eq!(opened.status, 200, "{}", opened.text());
    assert_eq!(opened.json()["circuit"], "open");

    let id = app.submit(json!({"email": "manual@example.com"})).await;
    let view = app.wait_for_state(&id, "unsold").await;
    assert_eq!(view["attempts"][0]["reason"], "circuit_open");
    assert!(buyer.calls("ping").is_empty());

    assert_eq!(set("closed").await.json()["circuit"], "closed");
    assert_eq!(app.wait_for_state(&id, "sold").await["sold_to"], "acme");

    let unknown = app
        .send(
            app.client
                .post(app.url("/v1/buyers/nobody/circuit"))
                .insert_header(("Authorization", "Bearer test-admin-token"))
                .insert_header(("Content-Type", "application/json")),
            r#"{"state": "open"}"#,
        )
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(set("sideways").await.status, 400);
    let anonymous = app
        .send(app.client.get(app.url("/v1/buyers")), Vec::new())
        .await;
    assert_eq!(anonymous.status, 401);
}

/// The request to offer a buyer's failed leads again, sent as its circuit
/// closes, is not lost when its requeue fails (here: the statement's
/// connection cut while it waits on the leads table): the router runs it
/// again, and the lead skipped while the circuit was open is sold.
#[actix_web::test]
async fn a_reoffer_whose_requeue_fails_is_run_again() {
    let (_buyer, app, skipped) = a_lead_skipped_by_an_open_circuit(Backend::Postgres, "").await;
    let table = hold_the_leads_table(&app, Backend::Postgres).await;
    assert_eq!(
        set_circuit(&app, "closed").await.json()["circuit"],
        "closed"
    );
    // The requeue (the only statement naming `history_from`) waits on the
    // table: its connection is cut, and the statement fails.
    let admin = sea_orm::Database::connect(database_url_of(&app).as_str())
        .await
        .unwrap();
    let requeue = "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
                   WHERE wait_event_type = 'Lock' AND query LIKE '%history_from%'";
    wait_until("the requeue to be cut", Duration::from_secs(20), || async {
        one_value::<i64>(&admin, requeue).await > 0
    })
    .await;
    table.rollback().await.unwrap();

    assert_eq!(
        app.wait_for_state(&skipped, "sold").await["sold_to"],
        "acme"
    );
    crate::helpers::close_stores().await;
}

/// The same request is not lost when the router restarts while its
/// requeue is under way (an injected panic as the requeue starts).
async fn a_reoffer_dropped_by_a_router_restart_is_run_again(backend: Backend) {
    let faults = "[faults]\nrouter_panics = 1\n";
    let (_buyer, app, skipped) = a_lead_skipped_by_an_open_circuit(backend, faults).await;
    assert_eq!(
        set_circuit(&app, "closed").await.json()["circuit"],
        "closed"
    );
    assert_eq!(
        app.wait_for_state(&skipped, "sold").await["sold_to"],
        "acme"
    );
}

/// A buyer `acme` whose circuit an operator opened, and a lead skipped for
/// it: the buyer, the app (with `extra` TOML) and the lead's id. Its
/// `open_for` is an hour, so within the test nothing but the request its
/// circuit's closing sends offers its failed leads again.
async fn a_lead_skipped_by_an_open_circuit(
    backend: Backend,
    extra: &str,
) -> (TestBuyer, TestApp, String) {
    let buyer = TestBuyer::start(accept(), accept());
    let acme = BuyerConfig {
        extra: "circuit = { open_for = \"1h\", max_open_for = \"1h\" }",
        ..BuyerConfig::new("acme", 1)
    };
    let app = spawn_app_with(backend, &format!("{extra}{}", acme.toml(&buyer.base))).await;
    assert_eq!(set_circuit(&app, "open").await.json()["circuit"], "open");
    let skipped = app.submit(json!({"email": "skipped@example.com"})).await;
    let view = app.wait_for_state(&skipped, "unsold").await;
    assert_eq!(view["attempts"][0]["reason"], "circuit_open");
    (buyer, app, skipped)
}

/// An operator sets `acme`'s circuit.
async fn set_circuit(app: &TestApp, state: &str) -> crate::helpers::Answer {
    let request = app
        .client
        .post(app.url("/v1/buyers/acme/circuit"))
        .insert_header(("Authorization", "Bearer test-admin-token"))
        .insert_header(("Content-Type", "application/json"));
    app.send(request, format!(r#"{{"state": "{state}"}}"#))
        .await
}

async fn templates_reach_buyers_escaped_for_their_content_type(backend: Backend) {
    let form_buyer = TestBuyer::start(accept(), Answer::Body("status=declined"));
    let xml_buyer = TestBuyer::start(
        accept(),
        Answer::Body("<response><status>Matched</status><price>9</price></response>"),
    );
    let config = format!(
        r#"
[[buyers]]
id = "formish"
priority = 1
[buyers.post]
url = "{form}/post"
content_type = "application/x-www-form-urlencoded"
body_template = "email={{{{fields.email}}}}&note={{{{fields.note}}}}&id={{{{lead_id}}}}"
accept = {{ body_contains = "status=ok" }}

[[buyers]]
id = "xmlish"
priority = 2
price = 9.0
[buyers.post]
url = "{xml}/post"
content_type = "application/xml"
body_template = "<lead><note>{{{{fields.note}}}}</note><consent>{{{{attribution.consent_text}}}}</consent></lead>"
accept = {{ body_regex = "<status>Matched</status>" }}
"#,
        form = form_buyer.base,
        xml = xml_buyer.base
    );
    let app = spawn_app_with(backend, &config).await;
    let id = app
        .submit(json!({"email": "x@example.com", "note": "a&b <c> \"d\"", "consent_text": "Yes & agreed"}))
        .await;
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "xmlish");
    assert_eq!(view["price"], 9.0);
    let form_call = &form_buyer.calls("post")[0];
    assert_eq!(form_call.content_type, "application/x-www-form-urlencoded");
    assert_eq!(
        form_call.body,
        format!("email=x%40example.com&note=a%26b+%3Cc%3E+%22d%22&id={id}")
    );
    let xml_call = &xml_buyer.calls("post")[0];
    assert_eq!(xml_call.content_type, "application/xml");
    assert_eq!(
        xml_call.body,
        "<lead><note>a&amp;b &lt;c&gt; &quot;d&quot;</note><consent>Yes &amp; agreed</consent></lead>"
    );
}

/// Puts the lead back in `routing` under a dead instance's expired lease,
/// as if that instance died before writing the final state.
async fn orphan(app: &TestApp, lead_id: &str) {
    lead::Entity::update_many()
        .col_expr(lead::Column::State, Expr::value("routing"))
        .col_expr(lead::Column::LeaseOwner, Expr::value("dead-instance"))
        .col_expr(
            lead::Column::LeaseUntil,
            Expr::value(chrono::Utc::now() - chrono::Duration::seconds(5)),
        )
        .filter(lead::Column::Id.eq(lead_id))
        .exec(app.store.connection())
        .await
        .unwrap();
}

async fn a_lead_taken_over_after_a_lost_settle_is_finished_from_its_history(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;

    let sold = app
        .submit(json!({"email": "lost-settle@example.com"}))
        .await;
    app.wait_for_state(&sold, "sold").await;
    orphan(&app, &sold).await;
    app.wait_for_state(&sold, "sold").await;

    let in_flight = app.submit(json!({"email": "lost-post@example.com"})).await;
    app.wait_for_state(&in_flight, "sold").await;
    sale::Entity::delete_many()
        .filter(sale::Column::LeadId.eq(in_flight.as_str()))
        .exec(app.store.connection())
        .await
        .unwrap();
    attempt::Entity::update_many()
        .col_expr(attempt::Column::Outcome, Expr::value("in_flight"))
        .filter(attempt::Column::LeadId.eq(in_flight.as_str()))
        .filter(attempt::Column::Kind.eq("post"))
        .exec(app.store.connection())
        .await
        .unwrap();
    orphan(&app, &in_flight).await;
    app.wait_for_state(&in_flight, "unknown").await;

    assert_eq!(buyer.calls("post").len(), 2, "no post was sent again");
    assert_eq!(sales_of(&app, &sold).await, 1);
}

#[actix_web::test]
async fn the_example_configuration_sells_to_mock_buyer() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let behaviour = leadrouter::mock_buyer::Behaviour {
        accept_rate: 1.0,
        latency: Duration::ZERO,
        fail_rate: 0.0,
        hang: false,
    };
    actix_web::rt::spawn(leadrouter::mock_buyer::start(listener, behaviour).unwrap());
    let buyer = crate::buyers::example_buyer(&base);
    let app = crate::helpers::spawn_app_adjusted(Backend::Sqlite, "", |settings| {
        settings.buyers = vec![buyer];
    })
    .await;
    let id = app
        .submit(json!({"email": "ann@example.com", "state": "CA", "consent_text": "I agree"}))
        .await;
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "acme");
    let ping = &view["attempts"][0];
    assert_eq!(ping["kind"], "ping");
    assert!(
        ping["response_body"]
            .as_str()
            .unwrap()
            .contains("\"ping_id\""),
        "{ping}"
    );
    let post = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|attempt| attempt["kind"] == "post")
        .unwrap()["request"]["body"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        post.contains("\"ping_id\": \"P-"),
        "the ping's id is posted: {post}"
    );
    assert!(view["price"].as_f64().unwrap() >= 5.0, "{view}");
}

#[actix_web::test]
async fn mock_buyer_counts_its_answers_and_the_time_it_held_them() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let behaviour = leadrouter::mock_buyer::Behaviour {
        accept_rate: 1.0,
        latency: Duration::from_millis(30),
        fail_rate: 0.0,
        hang: false,
    };
    actix_web::rt::spawn(leadrouter::mock_buyer::start(listener, behaviour).unwrap());
    let client = awc::Client::default();
    for path in ["ping", "post", "ping"] {
        let answer = client
            .post(format!("{base}/{path}"))
            .send_json(&json!({"bid": 12.0}))
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    let stats: serde_json::Value = client
        .get(format!("{base}/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["calls"], 3, "{stats}");
    let held_ms = stats["held_ms"].as_f64().unwrap();
    assert!(
        held_ms >= 90.0,
        "each call is held its 30 ms at least: {stats}"
    );
}

/// `count` feed leads sent at once, each accepted.
async fn feed_leads_at_once(app: &TestApp, prefix: &str, count: usize) {
    let answers = join_all((0..count).map(|n| {
        app.post_feed_lead_owned(
            json!({"email": format!("{prefix}{n}@example.com"), "lead_id": format!("{prefix}-{n}")}),
        )
    }))
    .await;
    assert!(answers.iter().all(|answer| answer.status == 200));
}

/// More leads at once than the router walks (256, twice the buyer's 128
/// slots): those without room wait as rows, and each is sold once as walks
/// end, with no sweep to find them.
async fn leads_beyond_the_routers_room_are_sold_as_walks_end(backend: Backend) {
    let slow = Answer::Accept {
        delay: Duration::from_millis(500),
    };
    let buyer = TestBuyer::start(slow, accept());
    let config = BuyerConfig {
        ping_timeout: Some("10s"),
        extra: "max_concurrency = 128\nqueue_timeout = \"60s\"",
        ..BuyerConfig::new("slow", 1)
    }
    .toml(&buyer.base);
    let app = spawn_app_adjusted(backend, &config, |settings| {
        settings.routing.sweep_interval = Duration::from_secs(3600)
    })
    .await;
    let leads = 320;
    feed_leads_at_once(&app, "room", leads as usize).await;

    let db = app.store.connection();
    wait_until("every lead to be sold", Duration::from_secs(60), || async {
        let sold = lead::Entity::find()
            .filter(lead::Column::State.eq("sold"))
            .count(db)
            .await
            .unwrap();
        sold == leads
    })
    .await;
    assert_eq!(sale::Entity::find().count(db).await.unwrap(), leads);
    let pings = buyer.calls_per_lead("ping");
    assert_eq!(pings.len() as u64, leads);
    assert!(pings.values().all(|&calls| calls == 1), "{pings:?}");
}

/// Routing runs as many walks as its buyers' slots can take (twice their
/// sum with no lead arriving, their sum while leads arrive): more than the
/// 256 it runs at least, when the buyers are wide. Every one of 300 leads
/// is pinged at once by a buyer with 300 slots that never answers; then a
/// reload to a narrow buyer narrows routing again.
async fn routing_walks_as_many_leads_as_its_buyers_slots_take(backend: Backend) {
    let buyer = TestBuyer::start(Answer::Hang, accept());
    let wide = BuyerConfig {
        ping_timeout: Some("60s"),
        extra: "max_concurrency = 300",
        ..BuyerConfig::new("wide", 1)
    };
    let app = spawn_app_with(backend, &wide.toml(&buyer.base)).await;
    let status = app.send(app.client.get(app.url("/v1/status")), "").await;
    assert_eq!(status.json()["routing"]["widest"], 600);

    let leads = 300;
    feed_leads_at_once(&app, "wide", leads).await;
    wait_until(
        "every lead's ping at the buyer at once",
        Duration::from_secs(30),
        || async { buyer.calls("ping").len() == leads },
    )
    .await;
    assert_eq!(buyer_status(&app, "wide").await["in_flight"], leads);

    let narrow = BuyerConfig::new("narrow", 1).toml(&buyer.base);
    write_config(
        app.config_path.as_ref().unwrap(),
        &database_url_of(&app),
        &narrow,
    );
    let reloaded = app.admin_send("POST", "/v1/admin/reload", json!({})).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    let status = app.send(app.client.get(app.url("/v1/status")), "").await;
    assert_eq!(status.json()["routing"]["widest"], 256);
}

/// The widest routing runs: twice the enabled buyers' slots, no fewer than
/// 256 walks and no more than 4096.
#[test]
fn routing_is_as_wide_as_twice_the_enabled_buyers_slots() {
    use leadrouter::actors::router::widest;
    let buyer = |max_concurrency, enabled| leadrouter::config::BuyerSettings {
        max_concurrency,
        enabled,
        ..crate::buyers::example_buyer("http://127.0.0.1:9")
    };
    assert_eq!(widest(&[buyer(4, true)]), 256, "the fewest");
    assert_eq!(widest(&[buyer(100, true), buyer(100, true)]), 400);
    assert_eq!(
        widest(&[buyer(100, true), buyer(900, false)]),
        256,
        "a disabled buyer's slots take no walks"
    );
    assert_eq!(widest(&[buyer(3000, true)]), 4096, "the most");
}

/// On PostgreSQL the routing pool plans each statement for its values: a
/// generic plan guesses a claim's `LIMIT $n` at a tenth of the table and
/// scans the whole backlog at every claim.
#[actix_web::test]
async fn postgres_plans_routings_statements_for_their_values() {
    use sea_orm::{ConnectionTrait, Statement};

    let database = TestDatabase::create(Backend::Postgres).await;
    let store = open_store(&database.url).await;
    let db = store.connection();
    let mode = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SHOW plan_cache_mode",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        mode.try_get::<String>("", "plan_cache_mode").unwrap(),
        "force_custom_plan"
    );
    crate::helpers::close_stores().await;
}

/// A sweep that finds more leads waiting than it can take has the store
/// refresh PostgreSQL's statistics of the routing tables at once (with
/// none, the planner sorts the whole backlog at every claim).
#[actix_web::test]
async fn a_backlog_found_by_a_sweep_refreshes_the_planner_statistics() {
    use sea_orm::{ConnectionTrait, Statement};

    let database = TestDatabase::create(Backend::Postgres).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    crate::helpers::stored_leads(&store, 20).await;
    let db = store.connection().clone();
    let analyzed = || {
        let db = db.clone();
        async move {
            db.query_one_raw(Statement::from_string(
                db.get_database_backend(),
                "SELECT COUNT(*) AS n FROM pg_stat_user_tables \
                 WHERE relname IN ('leads', 'attempts') AND last_analyze IS NOT NULL",
            ))
            .await
            .unwrap()
            .unwrap()
            .try_get::<i64>("", "n")
            .unwrap()
        }
    };
    assert_eq!(analyzed().await, 0, "a new database was never analyzed");

    let room = store
        .claim_waiting(5, "test", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(room.leads.len(), 5, "more leads wait than the sweep took");
    wait_until(
        "leads and attempts analyzed",
        Duration::from_secs(10),
        || async { analyzed().await == 2 },
    )
    .await;
    crate::helpers::close_stores().await;
}

/// PostgreSQL keeps no planner statistics of the payload columns (raw
/// bodies, fields, attribution, errors, requests and answers): `ANALYZE`
/// skips them, so the backlog's refresh and autovacuum's do not sort
/// sampled documents, and no common value of a personal field is copied
/// into `pg_statistic`; the columns routing filters on keep theirs.
#[actix_web::test]
async fn analyze_keeps_no_statistics_of_the_payload_columns() {
    use sea_orm::{ConnectionTrait, Statement};

    let database = TestDatabase::create(Backend::Postgres).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    crate::helpers::stored_leads(&store, 20).await;
    let db = store.connection().clone();
    let columns = |sql: &str| {
        let db = db.clone();
        let statement = Statement::from_string(db.get_database_backend(), sql);
        async move {
            let rows = db.query_all_raw(statement).await.unwrap();
            let names = rows
                .iter()
                .map(|row| row.try_get::<String>("", "name").unwrap());
            names.collect::<Vec<_>>()
        }
    };
    db.execute_unprepared("ANALYZE leads").await.unwrap();

    let kept = columns(
        "SELECT tablename || '.' || attname AS name FROM pg_stats \
         WHERE tablename = 'leads' ORDER BY 1",
    )
    .await;
    for routing_column in ["leads.state", "leads.received_at", "leads.set_aside_reason"] {
        assert!(kept.contains(&routing_column.to_string()), "{kept:?}");
    }
    for payload in [
        "leads.raw",
        "leads.fields",
        "leads.attribution",
        "leads.errors",
    ] {
        assert!(
            !kept.contains(&payload.to_string()),
            "{payload} in {kept:?}"
        );
    }
    let skipped = columns(
        "SELECT attrelid::regclass || '.' || attname AS name FROM pg_attribute \
         WHERE attstattarget = 0 AND attnum > 0 AND NOT attisdropped \
         AND attrelid IN ('leads'::regclass, 'attempts'::regclass, 'intake_log'::regclass) \
         ORDER BY 1",
    )
    .await;
    assert_eq!(
        skipped,
        [
            "attempts.request",
            "attempts.response_body",
            "intake_log.body",
            "leads.attribution",
            "leads.errors",
            "leads.fields",
            "leads.raw"
        ]
    );
    crate::helpers::close_stores().await;
}

/// The router's floor (`yielding::FLOOR`) and full width.
const FLOOR: usize = 32;
/// Twice the buyer's 400 slots (`yielding_app`).
const WIDEST: usize = 800;

/// An app on PostgreSQL selling to `buyer` only, swept every 100 ms.
async fn yielding_app(buyer: &TestBuyer, ping_timeout: &str) -> TestApp {
    let config = BuyerConfig {
        ping_timeout: Some(ping_timeout),
        extra: "max_concurrency = 400",
        ..BuyerConfig::new("only", 1)
    }
    .toml(&buyer.base);
    spawn_app_adjusted(Backend::Postgres, &config, |settings| {
        settings.routing.sweep_interval = Duration::from_millis(100);
        settings.database.acquire_timeout = Duration::from_secs(30);
    })
    .await
}

/// The router's width, from `/metrics`.
async fn routing_width(app: &TestApp) -> Option<usize> {
    let metrics = app
        .send(app.client.get(app.url("/metrics")), "")
        .await
        .text();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("leadrouter_routing_width "))
        .map(|value| value.trim().parse::<usize>().unwrap())
}

/// Runs `attack` once routing is at its floor because intake's one lead
/// waits for its commit (another connection holds the intake log until
/// `attack` ends); that lead is then stored and accepted.
async fn while_intake_waits(app: &TestApp, attack: impl std::future::Future<Output = ()>) {
    use sea_orm::{ConnectionTrait, TransactionTrait};

    let blocker = sea_orm::Database::connect(crate::helpers::database_url_of(app).as_str())
        .await
        .unwrap();
    let hold = blocker.begin().await.unwrap();
    hold.execute_unprepared("LOCK TABLE intake_log IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let stuck = app.post_feed_lead_owned(json!({"email": "stuck@example.com", "lead_id": "stuck"}));
    let attack = async {
        wait_until("routing at its floor", Duration::from_secs(20), || async {
            routing_width(app).await == Some(FLOOR)
        })
        .await;
        attack.await;
        hold.rollback().await.unwrap();
    };
    let (answer, ()) = futures_util::join!(stuck, attack);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["acceptance"], "accepted");
}

/// Routing yields to intake: while a lead waits for its commit far longer
/// than intake's usual delay (another connection holds the intake log),
/// the router narrows to its floor of 32 waterfalls, and a backlog the
/// sweep finds meanwhile starts 32 walks, not 80; once intake commits
/// again, routing widens and the rest start. (PostgreSQL: its table lock
/// stops intake alone; SQLite's write lock would stop routing's claims too.)
#[actix_web::test]
async fn routing_narrows_while_intakes_leads_wait_and_widens_after() {
    let buyer = TestBuyer::start(Answer::Hang, accept());
    let app = yielding_app(&buyer, "60s").await;
    assert_eq!(
        routing_width(&app).await,
        Some(WIDEST),
        "full width with no intake"
    );

    while_intake_waits(&app, async {
        crate::helpers::stored_leads(&app.store, 80).await;
        wait_until(
            "the floor's walks at the buyer",
            Duration::from_secs(20),
            || async { buyer.calls("ping").len() >= FLOOR },
        )
        .await;
        // Ten sweeps more: none may start a walk beyond the floor.
        actix_web::rt::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(buyer.calls("ping").len(), FLOOR, "walks while intake waits");
        assert_eq!(routing_width(&app).await, Some(FLOOR));
        let status = app
            .send(app.client.get(app.url("/v1/status")), "")
            .await
            .json();
        assert_eq!(status["routing"]["width"], FLOOR, "{status}");
    })
    .await;

    wait_until(
        "every lead at the buyer",
        Duration::from_secs(20),
        || async { buyer.calls("ping").len() == 81 },
    )
    .await;
    wait_until("routing at full width", Duration::from_secs(20), || async {
        routing_width(&app).await == Some(WIDEST)
    })
    .await;
}

/// Walks that end at once (the buyer rejects every ping) would start again
/// as fast as they end, whatever the width: while intake's lead waits, a
/// narrower router starts at most its width of walks per 100 ms window.
/// Counted over a second by the buyer: every walk pings it once.
#[actix_web::test]
async fn a_narrower_router_starts_at_most_its_width_of_walks_per_window() {
    let buyer = TestBuyer::start(Answer::Reject, accept());
    let app = yielding_app(&buyer, "5s").await;
    while_intake_waits(&app, async {
        crate::helpers::stored_leads(&app.store, 3000).await;
        wait_until("walks at the buyer", Duration::from_secs(20), || async {
            !buyer.calls("ping").is_empty()
        })
        .await;
        let (from, pinged_before) = (Instant::now(), buyer.calls("ping").len());
        actix_web::rt::time::sleep(Duration::from_secs(1)).await;
        let pinged = buyer.calls("ping").len() - pinged_before;
        // Every window the second overlaps, and a window's walks that
        // started before it and ping during it.
        let windows = from.elapsed().as_millis().div_ceil(100) as usize + 2;
        assert!(
            pinged <= FLOOR * windows,
            "{pinged} walks in {windows} windows of at most {FLOOR}"
        );
        assert!(pinged > 0, "routing never stops");
    })
    .await;
    wait_until("every lead walked", Duration::from_secs(60), || async {
        buyer.calls("ping").len() == 3001
    })
    .await;
}

/// Routing's threads (the router with its buyers and walks, the attempt
/// writer) run 10 nice steps below intake's thread and the HTTP workers,
/// so that on a busy machine the kernel answers senders first. Read from
/// the kernel's own view of this process's threads.
#[cfg(target_os = "linux")]
#[actix_web::test]
async fn routing_threads_run_below_intakes_cpu_priority() {
    let app = spawn_app_with(Backend::Sqlite, "").await;
    let id = app.submit(json!({"email": "nice@example.com"})).await;
    app.wait_for_state(&id, "unsold").await;
    let threads = threads_by_name();
    let nice_of = |name: &str| {
        let nices: Vec<i32> = threads
            .iter()
            .filter(|(comm, _)| comm == name)
            .map(|(_, nice)| *nice)
            .collect();
        assert!(!nices.is_empty(), "no thread named {name}: {threads:?}");
        nices
    };
    let intake = nice_of("lr-intake")[0];
    assert!(nice_of("lr-intake").iter().all(|nice| *nice == intake));
    for routing in ["lr-routing", "lr-attempts"] {
        assert!(
            nice_of(routing).iter().all(|nice| *nice == intake + 10),
            "{routing} at intake's {intake}: {threads:?}"
        );
    }
    let workers: Vec<i32> = threads
        .iter()
        .filter(|(comm, _)| comm == "actix-rt|system")
        .map(|(_, nice)| *nice)
        .collect();
    // The HTTP workers are actix arbiters (named by actix-rt, cut short).
    assert!(!workers.is_empty(), "no HTTP worker: {threads:?}");
    assert!(workers.iter().all(|nice| *nice == intake), "{threads:?}");
    crate::helpers::close_stores().await;
}

/// Every thread of this process: its name and nice value, from
/// `/proc/self/task/*/stat` (the name in parentheses may hold spaces; the
/// nice value is the 17th field after it).
#[cfg(target_os = "linux")]
fn threads_by_name() -> Vec<(String, i32)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
        .map(|stat| {
            let (head, tail) = stat.rsplit_once(')').unwrap();
            let name = head.split_once('(').unwrap().1.to_string();
            let nice = tail.split_whitespace().nth(16).unwrap().parse().unwrap();
            (name, nice)
        })
        .collect()
}

/// Routing has connections of its own: with every connection of the
/// readers' pool held (an operator's slow report, a flood of status polls,
/// here the test's own transactions), a lead is still claimed, pinged and
/// posted, and sold once the readers let go.
async fn a_lead_is_sold_while_readers_hold_every_connection_of_theirs(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let config = BuyerConfig::new("acme", 10).toml(&buyer.base);
    let app = spawn_app_adjusted(backend, &config, |settings| {
        settings.database.acquire_timeout = Duration::from_millis(500);
    })
    .await;
    let held = crate::helpers::hold_every_reader_connection(&app).await;
    let id = app
        .submit(json!({"email": "ann@example.com", "phone": "5550101234", "state": "CA"}))
        .await;
    wait_until(
        "the buyer to be posted the lead",
        Duration::from_secs(20),
        || async { !buyer.calls("post").is_empty() },
    )
    .await;
    drop(held);
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "acme");
    assert_eq!(sales_of(&app, &id).await, 1);
}
