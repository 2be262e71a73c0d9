//! Nothing lost (SPEC sections 2 and 9), shown with the real binary as a
//! child process: `kill -9` after a burst and during a post, a buyer actor
//! that panics, restart intensity, SIGTERM, a database outage through a
//! proxy the test cuts (the spool), and two instances on one PostgreSQL.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use entity::{alert, attempt, lead, sale};
use futures_util::future::join_all;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{json, Value};

use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{wait_until, Backend, TestApp, TestDatabase};
use crate::on_both_databases;
use crate::process::{journals_in, server_of, through, Service, ServiceConfig, TcpProxy};

on_both_databases!(
    kill_9_after_a_burst_loses_no_acknowledged_lead,
    kill_9_during_a_post_leaves_the_lead_unknown_and_never_resends,
    kill_9_while_a_ping_waits_for_a_slot_sends_it_never,
    kill_9_while_posts_wait_for_slots_leaves_unknown_only_the_posts_sent,
    a_panicking_buyer_actor_is_restarted_and_its_lead_finished,
    sigterm_refuses_leads_releases_leases_and_exits_zero,
    leads_unsold_in_an_outage_are_sold_after_kill_9_once_the_buyer_is_back,
    a_crash_mid_auction_re_sends_nothing,
    an_auction_walked_again_after_a_crash_reuses_its_pings,
    replays_of_a_key_stored_before_the_upgrade_answer_its_lead,
);

const FINAL_STATES: [&str; 3] = ["sold", "unsold", "unknown"];

/// A feed lead with its own key and email (so no two are the same person).
fn feed_lead(key: &str) -> Value {
    json!({"lead_id": key, "email": format!("{key}@example.com"), "state": "CA", "zip": "94105"})
}

async fn leads_in(app: &TestApp) -> Vec<lead::Model> {
    lead::Entity::find()
        .all(app.store.connection())
        .await
        .expect("leads read")
}

async fn attempts_of(app: &TestApp, lead_id: &str) -> Vec<attempt::Model> {
    app.store.attempts_of(lead_id).await.expect("attempts read")
}

/// Waits until every lead in the database is in a final state.
async fn wait_all_final(app: &TestApp, expected: usize) {
    wait_until(
        "every lead to be final",
        Duration::from_secs(60),
        || async {
            let leads = leads_in(app).await;
            leads.len() == expected
                && leads
                    .iter()
                    .all(|lead| FINAL_STATES.contains(&lead.state.as_str()))
        },
    )
    .await;
}

async fn kill_9_after_a_burst_loses_no_acknowledged_lead(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let buyer = TestBuyer::start(
        Answer::Accept {
            delay: Duration::from_millis(150),
        },
        accept(),
    );
    let buyer_toml = BuyerConfig {
        extra: "max_concurrency = 100",
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base);
    let config = ServiceConfig::write(&database.url, "2s", &buyer_toml);
    let mut service = Service::start(&config).await;

    let answers = join_all((0..80).map(|n| {
        let lead = feed_lead(&format!("burst-{n}"));
        let app = &service.app;
        async move { app.post_feed_lead(&lead).await }
    }))
    .await;
    service.kill_9();
    let acknowledged: HashSet<String> = answers
        .iter()
        .filter(|answer| answer.json()["server_recorded"] == true)
        .map(|answer| answer.json()["submission_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        acknowledged.len(),
        80,
        "every lead of the burst was acknowledged"
    );

    let service = Service::start(&config).await;
    wait_all_final(&service.app, 80).await;
    let leads = leads_in(&service.app).await;
    let stored: HashSet<String> = leads.iter().map(|lead| lead.id.clone()).collect();
    assert_eq!(
        stored, acknowledged,
        "each acknowledged lead stored exactly once"
    );

    let posts = buyer.calls_per_lead("post");
    assert!(
        posts.values().all(|&count| count == 1),
        "no lead posted twice: {posts:?}"
    );
    let sales = sale::Entity::find()
        .all(service.app.store.connection())
        .await
        .unwrap();
    let sold: HashSet<String> = leads
        .iter()
        .filter(|lead| lead.state == "sold")
        .map(|lead| lead.id.clone())
        .collect();
    assert_eq!(sales.len(), sold.len(), "one sale per sold lead");
    for lead in leads.iter().filter(|lead| lead.state == "unknown") {
        let attempts = attempts_of(&service.app, &lead.id).await;
        assert!(
            attempts.iter().any(|attempt| attempt.kind == "post"
                && attempt.outcome == "timeout"
                && attempt.reason.as_deref() == Some("interrupted")),
            "a lead is unknown only because its post was in flight at the kill"
        );
    }
    assert!(!sold.is_empty(), "leads were sold after the restart");
}

async fn kill_9_during_a_post_leaves_the_lead_unknown_and_never_resends(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let buyer = TestBuyer::start(accept(), Answer::Hang);
    let buyer_toml = BuyerConfig {
        post_timeout: "60s",
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base);
    let config = ServiceConfig::write(&database.url, "2s", &buyer_toml);
    let mut service = Service::start(&config).await;
    let answer = service.app.post_feed_lead(&feed_lead("hanging-post")).await;
    let lead_id = answer.json()["submission_id"].as_str().unwrap().to_string();
    wait_until(
        "the post to reach the buyer",
        Duration::from_secs(20),
        || async { buyer.calls("post").len() == 1 },
    )
    .await;
    service.kill_9();

    let service = Service::start(&config).await;
    let view = service.app.wait_for_state(&lead_id, "unknown").await;
    assert_eq!(view["lead_state"], "unknown");
    assert_eq!(buyer.calls("post").len(), 1, "the post is never re-sent");
    let attempts = attempts_of(&service.app, &lead_id).await;
    let post = attempts
        .iter()
        .find(|attempt| attempt.kind == "post")
        .unwrap();
    assert_eq!(
        (post.outcome.as_str(), post.reason.as_deref()),
        ("timeout", Some("interrupted"))
    );
    // The ping's answer was committed with the post's row, before the post.
    let ping = attempts
        .iter()
        .find(|attempt| attempt.kind == "ping")
        .unwrap();
    assert_eq!((ping.outcome.as_str(), ping.bid), ("accepted", Some(12.5)));
    let alerts = alert::Entity::find()
        .filter(alert::Column::LeadId.eq(lead_id.as_str()))
        .all(service.app.store.connection())
        .await
        .unwrap();
    assert!(
        alerts.iter().any(|alert| alert.kind == "post_timeout"),
        "an alert was raised"
    );
}

/// A service killed with `kill -9` while a ping waits for its buyer's
/// slot: `narrow` (one slot, answering its pings after 60 s) and `wide`,
/// the service's configuration, the two leads' ids.
struct KilledWhileWaiting {
    _database: TestDatabase,
    config: ServiceConfig,
    narrow: TestBuyer,
    _wide: TestBuyer,
    ids: Vec<String>,
}

/// Two leads to `narrow`, killed once one ping went out and the other's
/// row is written and waits for the slot.
async fn killed_while_a_ping_waits_for_a_slot(backend: Backend) -> KilledWhileWaiting {
    let database = TestDatabase::create(backend).await;
    let slow = Answer::Accept {
        delay: Duration::from_secs(60),
    };
    let narrow = TestBuyer::start(slow, accept());
    let wide = TestBuyer::start(accept(), accept());
    let buyers = BuyerConfig {
        ping_timeout: Some("90s"),
        post_timeout: "90s",
        extra: "max_concurrency = 1\nqueue_timeout = \"60s\"",
        ..BuyerConfig::new("narrow", 1)
    }
    .toml(&narrow.base)
        + &BuyerConfig::new("wide", 2).toml(&wide.base);
    let config = ServiceConfig::write(&database.url, "2s", &buyers);
    let mut service = Service::start(&config).await;
    let mut ids = Vec::new();
    for key in ["first", "second"] {
        let answer = service.app.post_feed_lead(&feed_lead(key)).await;
        ids.push(answer.json()["submission_id"].as_str().unwrap().to_string());
    }
    let narrow_calls_in_flight = || async {
        attempt::Entity::find()
            .filter(attempt::Column::BuyerId.eq("narrow"))
            .filter(attempt::Column::Outcome.eq("in_flight"))
            .all(service.app.store.connection())
            .await
            .unwrap()
            .len()
    };
    wait_until(
        "one ping sent, the other's row written and waiting for the slot",
        Duration::from_secs(20),
        || async { narrow.calls("ping").len() == 1 && narrow_calls_in_flight().await == 2 },
    )
    .await;
    service.kill_9();
    KilledWhileWaiting {
        _database: database,
        config,
        narrow,
        _wide: wide,
        ids,
    }
}

/// A ping takes its slot after its row is written: killed while one
/// waits for a slot, its row is settled as an interrupted `error` and it
/// was never sent; the walk goes on after the restart.
async fn kill_9_while_a_ping_waits_for_a_slot_sends_it_never(backend: Backend) {
    let killed = killed_while_a_ping_waits_for_a_slot(backend).await;
    let (config, narrow, ids) = (&killed.config, &killed.narrow, &killed.ids);
    let sent_before_the_kill = narrow.calls_per_lead("ping");
    let waiting: Vec<&String> = ids
        .iter()
        .filter(|id| !sent_before_the_kill.contains_key(*id))
        .collect();
    assert_eq!(
        (sent_before_the_kill.len(), waiting.len()),
        (1, 1),
        "only the slot holder's ping went out, not the waiting one"
    );

    narrow.set_ping(Answer::Reject);
    let service = Service::start(config).await;
    for id in ids {
        let view = service.app.wait_for_state(id, "sold").await;
        assert_eq!(view["sold_to"], "wide");
        let narrow_rows: Vec<(String, String, Option<String>)> = attempts_of(&service.app, id)
            .await
            .into_iter()
            .filter(|attempt| attempt.buyer_id == "narrow")
            .map(|attempt| (attempt.kind, attempt.outcome, attempt.reason))
            .collect();
        assert_eq!(
            narrow_rows[0],
            ("ping".into(), "error".into(), Some("interrupted".into())),
            "the row in flight at the kill is settled as interrupted"
        );
        assert!(narrow_rows[1..]
            .iter()
            .all(|(_, outcome, _)| outcome == "rejected"));
        let sent = narrow.calls_per_lead("ping").get(id).copied().unwrap_or(0);
        let sent_before = sent_before_the_kill.get(id).copied().unwrap_or(0);
        assert_eq!(
            sent - sent_before,
            narrow_rows.len() - 1,
            "after the restart, one ping per new row"
        );
    }
}

/// A post takes its slot before its row is written (SPEC section 9: a
/// post is in flight from the moment its request may have left, not while
/// it waits for a slot). Fifty leads to one buyer with two slots and a
/// slow post, killed with `kill -9` while two posts are out and the other
/// leads wait for a slot: after the restart only the leads whose posts
/// reached the buyer (its own request log is the witness) are `unknown`,
/// never re-sent; every other lead is sold.
async fn kill_9_while_posts_wait_for_slots_leaves_unknown_only_the_posts_sent(backend: Backend) {
    const LEADS: usize = 50;
    let database = TestDatabase::create(backend).await;
    let slow = Answer::Accept {
        delay: Duration::from_secs(60),
    };
    let narrow = TestBuyer::start(accept(), slow);
    let buyers = BuyerConfig {
        post_timeout: "90s",
        extra: "max_concurrency = 2\nqueue_timeout = \"60s\"",
        ..BuyerConfig::new("narrow", 1)
    }
    .toml(&narrow.base);
    let config = ServiceConfig::write(&database.url, "2s", &buyers);
    let mut service = Service::start(&config).await;
    let leads = (0..LEADS).map(|n| feed_lead(&format!("waiting-{n}")));
    join_all(leads.map(|lead| service.app.post_feed_lead_owned(lead))).await;
    let leads_routing = || async {
        leads_in(&service.app)
            .await
            .iter()
            .filter(|lead| lead.state == "routing")
            .count()
    };
    wait_until(
        "two posts out, every other lead claimed and waiting for a slot",
        Duration::from_secs(30),
        || async { narrow.calls("post").len() == 2 && leads_routing().await == LEADS },
    )
    .await;
    service.kill_9();
    let sent_before_the_kill: HashSet<String> = narrow.calls_per_lead("post").into_keys().collect();
    assert_eq!(sent_before_the_kill.len(), 2, "two slots, two posts out");

    narrow.set_post(accept());
    let service = Service::start(&config).await;
    wait_all_final(&service.app, LEADS).await;
    let leads = leads_in(&service.app).await;
    let unknown: HashSet<String> = leads
        .iter()
        .filter(|lead| lead.state == "unknown")
        .map(|lead| lead.id.clone())
        .collect();
    assert_eq!(
        unknown, sent_before_the_kill,
        "only the leads whose posts were sent are unknown"
    );
    assert!(
        leads
            .iter()
            .all(|lead| unknown.contains(&lead.id) || lead.state == "sold"),
        "every lead whose post only waited for a slot is sold after the restart"
    );
    let posts = narrow.calls_per_lead("post");
    assert_eq!(posts.len(), LEADS);
    assert!(
        posts.values().all(|&count| count == 1),
        "no lead was posted twice: {posts:?}"
    );
}

async fn a_panicking_buyer_actor_is_restarted_and_its_lead_finished(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let buyer = TestBuyer::start(accept(), accept());
    let extra = format!(
        "{}\n[faults]\nbuyer_panics = {{ acme = 1 }}\n",
        BuyerConfig::new("acme", 1).toml(&buyer.base)
    );
    let config = ServiceConfig::write(&database.url, "2s", &extra);
    let mut service = Service::start(&config).await;
    let answer = service.app.post_feed_lead(&feed_lead("panics-once")).await;
    let lead_id = answer.json()["submission_id"].as_str().unwrap().to_string();

    service.app.wait_for_state(&lead_id, "sold").await;
    let log = service.log();
    assert!(
        log.contains("injected fault"),
        "the buyer actor panicked:\n{log}"
    );
    assert!(
        log.contains("actor restarted"),
        "the restart was logged:\n{log}"
    );
    let attempts = attempts_of(&service.app, &lead_id).await;
    let outcomes: Vec<(&str, &str)> = attempts
        .iter()
        .map(|attempt| (attempt.kind.as_str(), attempt.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("ping", "error"),
            ("ping", "accepted"),
            ("post", "accepted")
        ],
        "the interrupted ping was settled, then the restarted actor sold the lead"
    );
    assert_eq!(attempts[0].reason.as_deref(), Some("interrupted"));
    assert_eq!(buyer.calls("post").len(), 1);

    // The restarted actor goes on working.
    let answer = service
        .app
        .post_feed_lead(&feed_lead("after-restart"))
        .await;
    let next = answer.json()["submission_id"].as_str().unwrap().to_string();
    service.app.wait_for_state(&next, "sold").await;
    assert!(service.child_is_running(), "the service kept running");
}

#[actix_web::test]
async fn exceeding_the_restart_intensity_stops_the_service_loudly() {
    let database = TestDatabase::create(Backend::Sqlite).await;
    let buyer = TestBuyer::start(accept(), accept());
    let extra = format!(
        "{}\n[faults]\nbuyer_panics = {{ acme = 1000 }}\n[supervision]\nmax_restarts = 2\nperiod = \"1m\"\n",
        BuyerConfig::new("acme", 1).toml(&buyer.base)
    );
    let config = ServiceConfig::write(&database.url, "1s", &extra);
    let mut service = Service::start(&config).await;
    let answer = service
        .app
        .post_feed_lead(&feed_lead("always-panics"))
        .await;
    let lead_id = answer.json()["submission_id"].as_str().unwrap().to_string();

    let status = service.exit_status(Duration::from_secs(30)).await;
    assert!(!status.success(), "an escalation exits non-zero: {status}");
    assert!(
        service.log().contains("restart intensity exceeded"),
        "{}",
        service.log()
    );
    let stored = service.app.store.find_lead(&lead_id).await.unwrap();
    assert!(stored.is_some(), "the lead is still stored");
    crate::helpers::close_stores().await;
}

async fn sigterm_refuses_leads_releases_leases_and_exits_zero(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let slow = TestBuyer::start(Answer::Hang, accept());
    let good = TestBuyer::start(accept(), accept());
    let extra = format!(
        "{}{}",
        BuyerConfig {
            ping_timeout: Some("60s"),
            ..BuyerConfig::new("slow", 1)
        }
        .toml(&slow.base),
        BuyerConfig::new("good", 2).toml(&good.base)
    );
    let config = ServiceConfig::write(&database.url, "3s", &extra);
    let mut service = Service::start(&config).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let answer = service
            .app
            .post_feed_lead(&feed_lead(&format!("term-{n}")))
            .await;
        ids.push(answer.json()["submission_id"].as_str().unwrap().to_string());
    }
    wait_until(
        "the slow buyer to hold three pings",
        Duration::from_secs(20),
        || async { slow.calls("ping").len() == 3 },
    )
    .await;

    let terminated_at = std::time::Instant::now();
    service.terminate();
    wait_until(
        "readiness to say shutting down",
        Duration::from_secs(3),
        || async {
            let ready = service
                .app
                .send(service.app.client.get(service.app.url("/readyz")), "")
                .await;
            ready.status == 503 && ready.json()["shutting_down"] == true
        },
    )
    .await;
    let refused = service.app.post_feed_lead(&feed_lead("too-late")).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["acceptance"], "failed");
    assert_eq!(refused.json()["server_recorded"], false);

    // The grace is 3 s; after it the service takes at most about a second
    // for the rest (HTTP stop, pool close).
    let status = service.exit_status(Duration::from_secs(6)).await;
    assert!(
        terminated_at.elapsed() < Duration::from_secs(6),
        "the process exits within the grace period (plus the last second)"
    );
    assert!(
        status.success(),
        "SIGTERM exits 0: {status}\n{}",
        service.log()
    );
    for id in &ids {
        let row = service.app.store.find_lead(id).await.unwrap().unwrap();
        assert_eq!(row.state, "received", "the lease of {id} was released");
        assert!(row.lease_owner.is_none());
    }

    slow.set_ping(Answer::Reject);
    let service = Service::start(&config).await;
    for id in &ids {
        service.app.wait_for_state(id, "sold").await;
        let attempts = attempts_of(&service.app, id).await;
        assert!(attempts.iter().any(|attempt| attempt.buyer_id == "slow"
            && attempt.reason.as_deref() == Some("interrupted")));
    }
    assert_eq!(good.calls("post").len(), 3);
}

/// A service's configuration on PostgreSQL reached through a proxy the test
/// can cut, with one accepting buyer (`acme`) that has room for a whole
/// drained spool at once (no lead is skipped as busy).
struct SpoolingSetUp {
    /// Held for the test's length: the scratch database lives as long.
    _database: TestDatabase,
    proxy: TcpProxy,
    buyer: TestBuyer,
    config: ServiceConfig,
}

async fn spooling_set_up() -> SpoolingSetUp {
    let database = TestDatabase::create(Backend::Postgres).await;
    let proxy = TcpProxy::start(server_of(&database.url));
    let buyer = TestBuyer::start(accept(), accept());
    let buyer_toml = BuyerConfig {
        extra: "max_concurrency = 32",
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base);
    let mut config =
        ServiceConfig::write(&through(&database.url, proxy.address), "2s", &buyer_toml);
    config.test_database_url = database.url.clone();
    SpoolingSetUp {
        _database: database,
        proxy,
        buyer,
        config,
    }
}

/// After a drain: `leads` leads were posted to `buyer`, each once, and no
/// journal is left in the spool.
fn each_lead_posted_once_and_the_spool_emptied(
    buyer: &TestBuyer,
    config: &ServiceConfig,
    leads: usize,
) {
    let posts = buyer.calls_per_lead("post");
    assert_eq!(posts.len(), leads);
    assert!(posts.values().all(|&count| count == 1), "{posts:?}");
    assert_eq!(
        journals_in(&config.spool_dir()),
        0,
        "drained journals are deleted"
    );
}

/// Waits until `/v1/status` counts no lead left in the spool.
async fn wait_for_the_spool_to_drain(app: &TestApp) {
    wait_until("the spool to drain", Duration::from_secs(30), || async {
        app.send(app.client.get(app.url("/v1/status")), "")
            .await
            .json()["spool"]["pending"]
            == 0
    })
    .await;
}

#[actix_web::test]
async fn a_database_outage_spools_leads_and_drains_them_exactly_once() {
    let spooling = spooling_set_up().await;
    let service = Service::start(&spooling.config).await;
    let app = &service.app;
    let before = app.post_feed_lead(&feed_lead("before-outage")).await;
    app.wait_for_state(before.json()["submission_id"].as_str().unwrap(), "sold")
        .await;

    spooling.proxy.cut();
    let answers =
        join_all((0..20).map(|n| app.post_feed_lead_owned(feed_lead(&format!("outage-{n}")))))
            .await;
    let mut spooled = Vec::new();
    for answer in &answers {
        assert_eq!(answer.status, 202, "{}", answer.text());
        let contract = answer.json();
        assert_eq!(contract["acceptance"], "pending");
        assert_eq!(contract["server_recorded"], true);
        spooled.push(contract["submission_id"].as_str().unwrap().to_string());
    }
    let replay = app.post_feed_lead(&feed_lead("outage-3")).await;
    assert_eq!(replay.status, 200, "{}", replay.text());
    assert_eq!(replay.json()["replayed"], true);
    assert_eq!(replay.json()["submission_id"], spooled[3].as_str());
    let status = app
        .send(
            app.client
                .get(app.url(&format!("/v1/leads/{}/status", spooled[0]))),
            "",
        )
        .await;
    assert_eq!(status.json()["acceptance"], "pending", "{}", status.text());
    let overview = app
        .send(app.client.get(app.url("/v1/status")), "")
        .await
        .json();
    assert_eq!(overview["spool"]["pending"], 20, "{overview}");
    assert_eq!(overview["database"], "unreachable");
    assert!(
        journals_in(&spooling.config.spool_dir()) > 0,
        "the spool is on disk"
    );

    spooling.proxy.restore();
    wait_for_the_spool_to_drain(app).await;
    wait_all_final(app, 21).await;
    let leads = leads_in(app).await;
    let keys: HashSet<Option<String>> = leads
        .iter()
        .map(|lead| lead.idempotency_key.clone())
        .collect();
    assert_eq!(keys.len(), 21, "one lead per key");
    for id in &spooled {
        let row = leads
            .iter()
            .find(|lead| &lead.id == id)
            .expect("spooled lead stored under its id");
        let attempts: Vec<(String, String, Option<String>)> = attempts_of(app, id)
            .await
            .into_iter()
            .map(|attempt| (attempt.kind, attempt.outcome, attempt.reason))
            .collect();
        assert_eq!(row.state, "sold", "{attempts:?}");
    }
    each_lead_posted_once_and_the_spool_emptied(&spooling.buyer, &spooling.config, 21);
    assert!(
        service.log().contains("spool_in_use"),
        "the spool alert was raised"
    );
    crate::helpers::close_stores().await;
}

/// `kill -9` at the worst point for the spool: leads answered `pending`
/// from it while the database is cut, the process killed before it could
/// drain them. The next process drains them from the journals it finds and
/// sells each once, under the id its sender was given.
#[actix_web::test]
async fn leads_spooled_before_a_kill_9_are_drained_by_the_next_process() {
    let spooling = spooling_set_up().await;
    let mut service = Service::start(&spooling.config).await;

    spooling.proxy.cut();
    let answers = join_all((0..12).map(|n| {
        service
            .app
            .post_feed_lead_owned(feed_lead(&format!("killed-{n}")))
    }))
    .await;
    let mut spooled = HashSet::new();
    for answer in &answers {
        assert_eq!(answer.status, 202, "{}", answer.text());
        assert_eq!(answer.json()["server_recorded"], true);
        spooled.insert(answer.json()["submission_id"].as_str().unwrap().to_string());
    }
    service.kill_9();
    assert!(
        journals_in(&spooling.config.spool_dir()) > 0,
        "the spool outlived the process"
    );

    spooling.proxy.restore();
    let service = Service::start(&spooling.config).await;
    let app = &service.app;
    wait_for_the_spool_to_drain(app).await;
    wait_all_final(app, 12).await;
    let stored: HashSet<String> = leads_in(app)
        .await
        .into_iter()
        .map(|lead| lead.id)
        .collect();
    assert_eq!(
        stored, spooled,
        "each spooled lead stored once, under its id"
    );
    each_lead_posted_once_and_the_spool_emptied(&spooling.buyer, &spooling.config, 12);
    crate::helpers::close_stores().await;
}

#[actix_web::test]
async fn two_instances_on_one_postgres_route_each_lead_once() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let coin = Answer::Coin {
        accept_rate: 0.5,
        max_delay: Duration::from_millis(80),
    };
    let first = TestBuyer::start(coin.clone(), coin.clone());
    let second = TestBuyer::start(coin.clone(), coin);
    let extra = format!(
        "{}{}",
        BuyerConfig {
            extra: "max_concurrency = 50",
            ..BuyerConfig::new("first", 1)
        }
        .toml(&first.base),
        BuyerConfig {
            extra: "max_concurrency = 50",
            ..BuyerConfig::new("second", 2)
        }
        .toml(&second.base),
    );
    let config = ServiceConfig::write(&database.url, "2s", &extra);
    let one = Service::start(&config).await;
    let two = Service::start(&config).await;

    let singles = join_all((0..200).map(|n| {
        let app = if n % 2 == 0 { &one.app } else { &two.app };
        app.post_feed_lead_owned(feed_lead(&format!("single-{n}")))
    }));
    let pairs = join_all((0..50).map(|n| {
        let lead = feed_lead(&format!("both-{n}"));
        futures_util::future::join(
            one.app.post_feed_lead_owned(lead.clone()),
            two.app.post_feed_lead_owned(lead),
        )
    }));
    let (singles, pairs) = futures_util::future::join(singles, pairs).await;
    assert!(singles
        .iter()
        .all(|answer| answer.json()["server_recorded"] == true));
    for (a, b) in &pairs {
        let (a, b) = (a.json(), b.json());
        assert_eq!(a["submission_id"], b["submission_id"], "one lead per key");
        assert_ne!(
            a["replayed"], b["replayed"],
            "one stored it, the other replayed it"
        );
    }

    wait_all_final(&one.app, 250).await;
    let leads = leads_in(&one.app).await;
    let keys: HashSet<Option<String>> = leads
        .iter()
        .map(|lead| lead.idempotency_key.clone())
        .collect();
    assert_eq!(keys.len(), 250);
    let sales = sale::Entity::find()
        .all(one.app.store.connection())
        .await
        .unwrap();
    let mut sales_per_lead: HashMap<&str, usize> = HashMap::new();
    for sale in &sales {
        *sales_per_lead.entry(sale.lead_id.as_str()).or_default() += 1;
    }
    assert!(
        sales_per_lead.values().all(|&count| count == 1),
        "never sold twice"
    );
    let sold = leads.iter().filter(|lead| lead.state == "sold").count();
    assert_eq!(sold, sales.len());
    for buyer in [&first, &second] {
        let posts = buyer.calls_per_lead("post");
        assert!(
            posts.values().all(|&count| count == 1),
            "no duplicate post: {posts:?}"
        );
    }
    let attempts = attempt::Entity::find()
        .all(one.app.store.connection())
        .await
        .unwrap();
    let routed_by: HashSet<Option<String>> = attempts
        .iter()
        .map(|attempt| attempt.instance_id.clone())
        .collect();
    assert_eq!(routed_by.len(), 2, "both instances routed leads");
    crate::helpers::close_stores().await;
}

#[actix_web::test]
async fn with_neither_database_nor_spool_intake_answers_503_failed() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let proxy = TcpProxy::start(server_of(&database.url));
    let mut config = ServiceConfig::write(&through(&database.url, proxy.address), "1s", "");
    config.test_database_url = database.url.clone();
    // A file where the spool directory should be: it cannot be created.
    std::fs::write(config.spool_dir(), "not a directory").unwrap();
    let service = Service::start(&config).await;
    let app = &service.app;
    let ready = app.send(app.client.get(app.url("/readyz")), "").await;
    assert_eq!(ready.status, 503, "the unusable spool is reported");
    assert!(ready.json()["spool"].as_str().unwrap().contains("unusable"));
    let stored = app.post_feed_lead(&feed_lead("while-up")).await;
    assert_eq!(stored.status, 200, "the service runs without a spool");

    proxy.cut();
    let refused = app.post_feed_lead(&feed_lead("while-down")).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["acceptance"], "failed");
    assert_eq!(refused.json()["server_recorded"], false);
    wait_until(
        "the failure to be alerted",
        Duration::from_secs(10),
        || async { service.log().contains("intake_failed") },
    )
    .await;

    proxy.restore();
    wait_until("intake to store again", Duration::from_secs(20), || async {
        app.post_feed_lead(&feed_lead("after-the-outage"))
            .await
            .status
            == 200
    })
    .await;
    crate::helpers::close_stores().await;
}

#[actix_web::test]
async fn a_post_longer_than_the_lease_is_not_taken_over_by_another_instance() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let buyer = TestBuyer::start(
        accept(),
        Answer::Accept {
            delay: Duration::from_secs(5),
        },
    );
    let buyer_toml = BuyerConfig {
        post_timeout: "20s",
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base);
    // The lease is 2 s: only the heartbeat keeps it through a 5 s post.
    let config = ServiceConfig::write(&database.url, "2s", &buyer_toml);
    let one = Service::start(&config).await;
    let two = Service::start(&config).await;
    let answer = one.app.post_feed_lead(&feed_lead("slow-post")).await;
    let lead_id = answer.json()["submission_id"].as_str().unwrap().to_string();
    one.app.wait_for_state(&lead_id, "sold").await;
    assert_eq!(buyer.calls("ping").len(), 1, "pinged once");
    assert_eq!(buyer.calls("post").len(), 1, "posted once");
    let attempts = attempts_of(&two.app, &lead_id).await;
    let routed_by: HashSet<Option<String>> = attempts
        .iter()
        .map(|attempt| attempt.instance_id.clone())
        .collect();
    assert_eq!(routed_by.len(), 1, "one instance routed the lead");
    crate::helpers::close_stores().await;
}

#[actix_web::test]
async fn sighup_reloads_the_configuration_file() {
    let database = TestDatabase::create(Backend::Sqlite).await;
    let first = TestBuyer::start(accept(), accept());
    let second = TestBuyer::start(accept(), accept());
    let config = ServiceConfig::write(
        &database.url,
        "1s",
        &BuyerConfig::new("first", 1).toml(&first.base),
    );
    let service = Service::start(&config).await;
    let extra = format!(
        "{}{}",
        BuyerConfig::new("first", 2).toml(&first.base),
        BuyerConfig::new("second", 1).toml(&second.base)
    );
    config.rewrite(&extra);
    service.signal("HUP");
    wait_until(
        "the second buyer to appear",
        Duration::from_secs(10),
        || async {
            let buyers = service.app.admin_get("/v1/buyers").await.json();
            buyers.as_array().is_some_and(|buyers| buyers.len() == 2)
        },
    )
    .await;
    let answer = service.app.post_feed_lead(&feed_lead("after-hup")).await;
    let id = answer.json()["submission_id"].as_str().unwrap().to_string();
    let sold = service.app.wait_for_state(&id, "sold").await;
    assert_eq!(sold["sold_to"], "second", "the new priorities hold");
    assert!(service.log().contains("configuration reloaded"));
    crate::helpers::close_stores().await;
}

async fn leads_unsold_in_an_outage_are_sold_after_kill_9_once_the_buyer_is_back(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let buyer = TestBuyer::start(accept(), Answer::Status(503));
    let config = ServiceConfig::write(
        &database.url,
        "2s",
        &BuyerConfig::new("acme", 1).toml(&buyer.base),
    );
    let mut service = Service::start(&config).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let answer = service
            .app
            .post_feed_lead(&feed_lead(&format!("outage-{n}")))
            .await;
        ids.push(answer.json()["submission_id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        service.app.wait_for_state(id, "unsold").await;
    }
    // Too few failures to open the circuit: no transition will ever come.
    service.kill_9();
    buyer.set_post(accept());

    let service = Service::start(&config).await;
    for id in &ids {
        service.app.wait_for_state(id, "sold").await;
    }
    let posts = buyer.calls_per_lead("post");
    assert!(
        ids.iter().all(|id| posts.get(id) == Some(&2)),
        "one failed post and one sale each: {posts:?}"
    );
    crate::helpers::close_stores().await;
}

#[actix_web::test]
async fn a_walk_whose_lease_ran_out_in_a_database_cut_stops_before_its_next_call() {
    let database = TestDatabase::create(Backend::Postgres).await;
    // The first buyer answers 6 s after the post; meanwhile instance one
    // loses its database for longer than the 2 s lease.
    let first = TestBuyer::start(
        accept(),
        Answer::Accept {
            delay: Duration::from_secs(6),
        },
    );
    let second = TestBuyer::start(accept(), accept());
    let buyers = BuyerConfig::new("first", 1).toml(&first.base)
        + &BuyerConfig::new("second", 2).toml(&second.base);
    let proxy = TcpProxy::start(server_of(&database.url));
    let mut cut_config =
        ServiceConfig::write(&through(&database.url, proxy.address), "2s", &buyers);
    cut_config.test_database_url = database.url.clone();
    let direct_config = ServiceConfig::write(&database.url, "2s", &buyers);
    let one = Service::start(&cut_config).await;

    let answer = one.app.post_feed_lead(&feed_lead("cut-walk")).await;
    let lead_id = answer.json()["submission_id"].as_str().unwrap().to_string();
    wait_until("the post to be out", Duration::from_secs(20), || async {
        first.calls("post").len() == 1
    })
    .await;
    proxy.cut();
    // Started once instance one walks the lead, so that it is instance
    // one's walk that the cut interrupts (a second instance already
    // sweeping could claim the lead first).
    let two = Service::start(&direct_config).await;
    two.app.wait_for_state(&lead_id, "unknown").await;
    proxy.restore();
    // Instance one hears the buyer's answer after losing the lead: it
    // finds the row settled by instance two (or, on a slow machine, still
    // no database) and records nothing.
    wait_until(
        "instance one to give the answer up",
        Duration::from_secs(30),
        || {
            let log = one.log();
            let gave_up =
                log.contains("recovery had settled") || log.contains("could not record the sale");
            async move { gave_up }
        },
    )
    .await;

    assert_eq!(first.calls("post").len(), 1, "never re-sent");
    assert!(
        second.calls("ping").is_empty() && second.calls("post").is_empty(),
        "no instance went on to the next buyer"
    );
    let attempts = attempts_of(&two.app, &lead_id).await;
    let post = attempts
        .iter()
        .find(|attempt| attempt.kind == "post")
        .unwrap();
    assert_eq!(
        (post.outcome.as_str(), post.reason.as_deref()),
        ("timeout", Some("interrupted")),
        "the history written by the instance that took over stands"
    );
    assert_eq!(two.app.lead(&lead_id).await["lead_state"], "unknown");
    assert!(
        sales_of_lead(&two.app, &lead_id).await.is_empty(),
        "left to an operator"
    );
    crate::helpers::close_stores().await;
}

async fn sales_of_lead(app: &TestApp, lead_id: &str) -> Vec<sale::Model> {
    sale::Entity::find()
        .filter(sale::Column::LeadId.eq(lead_id))
        .all(app.store.connection())
        .await
        .unwrap()
}

#[actix_web::test]
async fn a_person_spooled_during_a_cut_drains_in_as_a_duplicate() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let proxy = TcpProxy::start(server_of(&database.url));
    let mut config = ServiceConfig::write(&through(&database.url, proxy.address), "2s", "");
    config.test_database_url = database.url.clone();
    let service = Service::start(&config).await;
    let app = &service.app;
    let person = json!({"lead_id": "first-visit", "email": "same@example.com"});
    let stored = app.post_feed_lead(&person).await.json()["submission_id"]
        .as_str()
        .unwrap()
        .to_string();

    proxy.cut();
    let again = json!({"lead_id": "second-visit", "email": "same@example.com"});
    let spooled = app.post_feed_lead(&again).await;
    assert_eq!(spooled.status, 202, "{}", spooled.text());
    let spooled = spooled.json()["submission_id"]
        .as_str()
        .unwrap()
        .to_string();
    proxy.restore();

    wait_until("the spool to drain", Duration::from_secs(30), || async {
        app.store.find_lead(&spooled).await.ok().flatten().is_some()
    })
    .await;
    let row = app.store.find_lead(&spooled).await.unwrap().unwrap();
    assert_eq!(
        row.state, "duplicate",
        "decided by the same claim as intake"
    );
    assert_eq!(row.duplicate_of.as_deref(), Some(stored.as_str()));
    crate::helpers::close_stores().await;
}

async fn a_crash_mid_auction_re_sends_nothing(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let bid = |amount| Answer::Bid {
        bid: amount,
        delay: Duration::ZERO,
    };
    let high = TestBuyer::start(bid(30.0), Answer::Hang);
    let low = TestBuyer::start(bid(10.0), bid(10.0));
    let buyers = BuyerConfig {
        post_timeout: "60s",
        ..BuyerConfig::new("high", 2)
    }
    .toml(&high.base)
        + &BuyerConfig::new("low", 1).toml(&low.base);
    let config = ServiceConfig::write_with_routing(
        &database.url,
        "2s",
        "mode = \"auction\"\nauction_window = \"2s\"",
        &buyers,
    );
    let mut service = Service::start(&config).await;
    let answer = service.app.post_feed_lead(&feed_lead("mid-auction")).await;
    let lead_id = answer.json()["submission_id"].as_str().unwrap().to_string();
    wait_until(
        "the top bid's post to be out",
        Duration::from_secs(20),
        || async { high.calls("post").len() == 1 },
    )
    .await;
    service.kill_9();

    let service = Service::start(&config).await;
    service.app.wait_for_state(&lead_id, "unknown").await;
    assert_eq!(high.calls("ping").len(), 1, "nobody pinged twice");
    assert_eq!(low.calls("ping").len(), 1, "nobody pinged twice");
    assert_eq!(high.calls("post").len(), 1, "the post is never re-sent");
    assert!(
        low.calls("post").is_empty(),
        "an unanswered post stops the auction"
    );
    crate::helpers::close_stores().await;
}

async fn an_auction_walked_again_after_a_crash_reuses_its_pings(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let hanging = TestBuyer::start(Answer::Hang, accept());
    let low = TestBuyer::start(
        Answer::Bid {
            bid: 10.0,
            delay: Duration::ZERO,
        },
        accept(),
    );
    let buyers = BuyerConfig {
        ping_timeout: Some("60s"),
        ..BuyerConfig::new("hanging", 1)
    }
    .toml(&hanging.base)
        + &BuyerConfig::new("low", 2).toml(&low.base);
    let config = ServiceConfig::write_with_routing(
        &database.url,
        "2s",
        "mode = \"auction\"\nauction_window = \"30s\"",
        &buyers,
    );
    let mut service = Service::start(&config).await;
    let answer = service
        .app
        .post_feed_lead(&feed_lead("crashed-auction"))
        .await;
    let lead_id = answer.json()["submission_id"].as_str().unwrap().to_string();
    wait_until(
        "both pings to be out and one answered",
        Duration::from_secs(20),
        || async {
            let attempts = attempts_of(&service.app, &lead_id).await;
            hanging.calls("ping").len() == 1
                && attempts
                    .iter()
                    .any(|attempt| attempt.buyer_id == "low" && attempt.outcome == "accepted")
        },
    )
    .await;
    service.kill_9();
    hanging.set_ping(Answer::Reject);

    let service = Service::start(&config).await;
    let view = service.app.wait_for_state(&lead_id, "sold").await;
    assert_eq!(
        view["sold_to"], "low",
        "the accepted ping of the first walk"
    );
    assert_eq!(
        low.calls("ping").len(),
        1,
        "an answered ping is not asked again"
    );
    assert_eq!(
        hanging.calls("ping").len(),
        2,
        "the ping the crash cut off is asked again"
    );
    crate::helpers::close_stores().await;
}

/// A configuration of one more instance on the test's PostgreSQL, through
/// the proxy the test cuts (each instance has its own spool).
fn instance_through(proxy: &TcpProxy, database: &TestDatabase) -> ServiceConfig {
    let mut config = ServiceConfig::write(&through(&database.url, proxy.address), "2s", "");
    config.test_database_url = database.url.clone();
    config
}

/// A keyed lead's id is derived from its (source, key) (SPEC section 5):
/// with the database cut, a replay of a stored key on either instance, and
/// of a key held only in the other instance's spool, is answered the id
/// the lead has, at the first try. Once the spools drain there is one lead
/// per key, under that id.
#[actix_web::test]
async fn a_replay_during_a_cut_answers_the_leads_id_on_either_instance() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let proxy = TcpProxy::start(server_of(&database.url));
    let (first_config, second_config) = (
        instance_through(&proxy, &database),
        instance_through(&proxy, &database),
    );
    let first = Service::start(&first_config).await;
    let second = Service::start(&second_config).await;
    let stored = first.app.post_feed_lead(&feed_lead("stored-key")).await;
    assert_eq!(stored.status, 200, "{}", stored.text());
    let stored_id = stored.json()["submission_id"].clone();

    proxy.cut();
    for app in [&first.app, &second.app] {
        let replay = app.post_feed_lead(&feed_lead("stored-key")).await;
        assert_eq!(replay.status, 202, "{}", replay.text());
        assert_eq!(replay.json()["submission_id"], stored_id);
    }
    let spooled = first.app.post_feed_lead(&feed_lead("spooled-key")).await;
    assert_eq!(spooled.status, 202, "{}", spooled.text());
    let spooled_id = spooled.json()["submission_id"].clone();
    let replay = second.app.post_feed_lead(&feed_lead("spooled-key")).await;
    assert_eq!(replay.json()["submission_id"], spooled_id);

    proxy.restore();
    for app in [&first.app, &second.app] {
        wait_for_the_spool_to_drain(app).await;
    }
    let mut ids: Vec<String> = leads_in(&first.app)
        .await
        .into_iter()
        .map(|lead| lead.id)
        .collect();
    ids.sort();
    let mut expected = vec![
        stored_id.as_str().unwrap().to_string(),
        spooled_id.as_str().unwrap().to_string(),
    ];
    expected.sort();
    assert_eq!(ids, expected, "one lead per key, under the id given");
}

/// A service started after an upgrade, with the lead of `key` stored as
/// one stored before ids were derived from keys (migrations 12 to 14): a
/// random id, and its key's digest kept. Answers the service (started on
/// `config` again, so it looks for such leads), the lead's id and the id
/// derived from its key.
async fn upgraded_with_an_earlier_lead(
    config: &ServiceConfig,
    key: &str,
) -> (Service, String, String) {
    let service = Service::start(config).await;
    let app = &service.app;
    let stored = app.post_feed_lead(&feed_lead(key)).await;
    assert_eq!(stored.status, 200, "{}", stored.text());
    let derived_id = stored.json()["submission_id"].as_str().unwrap().to_string();
    app.wait_for_state(&derived_id, "unsold").await;
    let row = lead::Entity::find_by_id(derived_id.clone())
        .one(app.store.connection())
        .await
        .expect("lead read")
        .expect("the lead is stored");
    let digest = lead::key_digest(&row.source_id, row.idempotency_key.as_deref().unwrap());
    let stored_id = leadrouter::domain::new_id();
    crate::helpers::execute(
        app,
        &format!(
            "UPDATE leads SET id = '{stored_id}', key_digest = '{digest}' WHERE id = '{derived_id}'"
        ),
    )
    .await;
    drop(service);
    (Service::start(config).await, stored_id, derived_id)
}

/// A lead stored before ids were derived from keys has a random id: once
/// the upgraded service has started, replays of its key sent all at once
/// answer that lead, and no second lead is stored for the key.
async fn replays_of_a_key_stored_before_the_upgrade_answer_its_lead(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let config = ServiceConfig::write(&database.url, "2s", "");
    let (service, stored_id, _) = upgraded_with_an_earlier_lead(&config, "old-key").await;
    let app = &service.app;
    let replays = join_all((0..20).map(|_| app.post_feed_lead_owned(feed_lead("old-key")))).await;
    for replay in &replays {
        assert_eq!(replay.status, 200, "{}", replay.text());
        assert_eq!(replay.json()["submission_id"], stored_id.as_str());
    }
    let leads = leads_in(app).await;
    assert_eq!(leads.len(), 1, "one lead for the key");
    assert_eq!(leads[0].id, stored_id);
    // A new key of the same source is stored under its derived id.
    let fresh = app.post_feed_lead(&feed_lead("new-key")).await;
    let expected = leadrouter::domain::keyed_lead_id(&leads[0].source_id, "new-key");
    assert_eq!(fresh.json()["submission_id"], expected.as_str());
}

/// A lead stored before ids were derived from keys has a random id: a
/// replay of its key spooled during a cut is given the derived id, which
/// keeps working as an alias of the stored lead once the spool drains.
#[actix_web::test]
async fn a_replay_of_a_pre_upgrade_lead_spooled_during_a_cut_keeps_its_id_working() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let proxy = TcpProxy::start(server_of(&database.url));
    let config = instance_through(&proxy, &database);
    let (service, stored_id, derived_id) = upgraded_with_an_earlier_lead(&config, "kept-key").await;
    let app = &service.app;

    proxy.cut();
    let spooled = app.post_feed_lead(&feed_lead("kept-key")).await;
    assert_eq!(spooled.status, 202, "{}", spooled.text());
    assert_eq!(spooled.json()["submission_id"], derived_id.as_str());

    proxy.restore();
    wait_for_the_spool_to_drain(app).await;
    // The id the sender was given still answers, as the stored lead.
    let status = app
        .send(
            app.client
                .get(app.url(&format!("/v1/leads/{derived_id}/status"))),
            "",
        )
        .await;
    assert_eq!(status.status, 200, "{}", status.text());
    let contract = status.json();
    assert_eq!(contract["submission_id"], stored_id.as_str());
    assert_eq!(contract["server_recorded"], true);
    assert_eq!(app.lead(&derived_id).await["id"], stored_id.as_str());
    let replay = app.post_feed_lead(&feed_lead("kept-key")).await;
    assert_eq!(replay.json()["submission_id"], stored_id.as_str());
    assert_eq!(leads_in(app).await.len(), 1, "one lead for the key");
}

#[actix_web::test]
async fn a_spooled_lead_the_database_refuses_stays_visible_and_is_imported_again() {
    use sea_orm::ConnectionTrait;

    let database = TestDatabase::create(Backend::Postgres).await;
    let proxy = TcpProxy::start(server_of(&database.url));
    let config = instance_through(&proxy, &database);
    let service = Service::start(&config).await;
    let app = &service.app;
    // Something the database will refuse once the lead drains (a
    // constraint added for the test, on the test's own connection).
    let direct = app.store.connection();
    app.post_feed_lead(&feed_lead("first")).await;

    proxy.cut();
    let spooled = app.post_feed_lead(&feed_lead("refuse-me")).await;
    assert_eq!(spooled.status, 202, "{}", spooled.text());
    let id = spooled.json()["submission_id"]
        .as_str()
        .unwrap()
        .to_string();
    direct
        .execute_unprepared(
            "ALTER TABLE leads ADD CONSTRAINT test_refuse CHECK (idempotency_key IS DISTINCT FROM 'refuse-me')",
        )
        .await
        .unwrap();
    proxy.restore();

    let refused = || async {
        app.admin_get("/v1/spool/refused").await.json()["refused"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    wait_until(
        "the lead to be refused and kept",
        Duration::from_secs(30),
        || async { refused().await.iter().any(|lead| lead["id"] == id.as_str()) },
    )
    .await;
    let listed = refused().await;
    assert!(
        listed[0]["reason"]
            .as_str()
            .unwrap()
            .contains("test_refuse"),
        "{listed:?}"
    );
    assert!(
        !listed[0].to_string().contains("@example.com"),
        "no personal data"
    );
    // Its id still answers: safe, pending.
    let status = app
        .send(
            app.client.get(app.url(&format!("/v1/leads/{id}/status"))),
            "",
        )
        .await;
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(status.json()["acceptance"], "pending");
    assert_eq!(status.json()["server_recorded"], true);

    let import = |app: &TestApp| {
        app.client
            .post(app.url(&format!("/v1/spool/refused/{id}/import")))
            .insert_header((
                "Authorization",
                format!("Bearer {}", crate::helpers::ADMIN_TOKEN),
            ))
    };
    let still = app.send(import(app), "").await;
    assert_eq!(
        still.status,
        422,
        "the cause is not fixed yet: {}",
        still.text()
    );

    direct
        .execute_unprepared("ALTER TABLE leads DROP CONSTRAINT test_refuse")
        .await
        .unwrap();
    let imported = app.send(import(app), "").await;
    assert_eq!(imported.status, 200, "{}", imported.text());
    assert_eq!(imported.json()["submission_id"], id.as_str());
    assert!(refused().await.is_empty());
    app.wait_for_state(&id, "unsold").await;
    let status = app
        .send(
            app.client.get(app.url(&format!("/v1/leads/{id}/status"))),
            "",
        )
        .await;
    assert_eq!(status.json()["acceptance"], "accepted");
}

#[actix_web::test]
async fn connections_the_database_terminated_send_leads_to_the_spool_not_to_503() {
    use sea_orm::ConnectionTrait;

    let app = &crate::helpers::spawn_app(Backend::Postgres).await;
    // Every connection of intake's pool open and idle.
    let warm_up = join_all((0..20).map(|n| async move {
        let lead = json!({"email": format!("warm-{n}@example.com")});
        app.post_form_lead(&lead).await
    }))
    .await;
    assert!(warm_up.iter().all(|answer| answer.status == 200));
    // An administrator (or a failover) terminates every session of the
    // database: each pooled connection fails its next statement with
    // 57P01, "terminating connection due to administrator command".
    let url = crate::helpers::database_url_of(app);
    let (server, name) = url.rsplit_once('/').unwrap();
    let admin = sea_orm::Database::connect(format!("{server}/postgres"))
        .await
        .unwrap();
    admin
        .execute_unprepared(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ))
        .await
        .unwrap();

    let answers = join_all((0..10).map(|n| async move {
        let lead = json!({"email": format!("after-{n}@example.com")});
        app.post_form_lead(&lead).await
    }))
    .await;
    // The database is there: each lead is stored at once or from the spool,
    // never refused as if the database had refused it.
    for answer in &answers {
        assert!(
            [200, 202].contains(&answer.status),
            "{}: {}",
            answer.status,
            answer.text()
        );
    }
    wait_until("every lead stored", Duration::from_secs(30), || async {
        use sea_orm::PaginatorTrait;
        // The test's own connections were terminated too: a read may fail.
        lead::Entity::find()
            .count(app.store.connection())
            .await
            .is_ok_and(|stored| stored == 30)
    })
    .await;
}
