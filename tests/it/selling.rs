//! The selling invariants (SPEC sections 7 and 9), each attacked the way
//! production would: many leads at once, two instances on one database, a
//! statement failing in the middle of a sale, a client that goes away, a
//! crashed buyer actor, a lead whose routing keeps failing.

use std::collections::HashSet;
use std::time::Duration;

use entity::{alert, attempt, lead, sale};
use futures_util::future::join_all;
use leadrouter::config::Settings;
use leadrouter::domain::ConfigSnapshot;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{json, Value};

use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{
    database_url_of, execute, one_value, post_of, spawn_app_adjusted, spawn_app_with,
    spawn_instance_of, wait_until, Backend, TestApp,
};
use crate::on_both_databases;

on_both_databases!(
    a_daily_cap_holds_with_ten_leads_at_once,
    an_hourly_cap_holds_with_six_leads_at_once,
    a_rejected_post_gives_its_cap_slot_back,
    a_failed_sale_commit_leaves_the_lead_sold_to_that_buyer_and_no_other,
    a_post_whose_answer_cannot_be_written_stops_the_walk,
    a_post_row_the_database_refuses_is_never_sent_and_its_ping_is_kept,
    a_client_that_drops_its_retry_still_gets_the_sale_recorded,
    a_retried_post_that_times_out_leaves_the_lead_unknown_with_an_alert,
    a_retried_post_whose_buyer_actor_crashes_leaves_the_lead_unknown_not_unsold,
    one_person_submitted_at_once_under_many_keys_is_one_routable_lead,
    a_half_open_probe_lost_to_a_panic_does_not_keep_the_circuit_half_open,
    a_poison_lead_is_set_aside_while_other_leads_keep_selling,
    skips_carry_their_reason_as_outcome,
    a_recovered_buyer_gets_back_every_lead_it_failed_not_a_page,
    a_retry_never_offers_an_unknown_lead_to_another_buyer,
    a_reroute_cannot_hide_an_accepted_post_without_its_sale,
    a_lead_still_walking_when_its_buyer_recovers_is_offered_again_when_it_settles,
    a_cap_added_by_a_reload_counts_the_sales_already_made,
    a_cap_removed_restored_raised_and_lowered_by_reloads_counts_the_days_sales,
    a_cap_restored_while_posts_wait_for_the_buyers_slot_holds_them,
    a_return_gives_its_cap_slot_back,
    unanswered_posts_give_their_cap_slots_back_once_a_retry_or_resolve_decides,
    fixing_an_invalid_lead_of_a_known_person_makes_it_a_duplicate,
);

/// How long a selling scenario may take to settle.
const SETTLE: Duration = Duration::from_secs(30);

fn post_delayed(millis: u64) -> Answer {
    Answer::Accept {
        delay: Duration::from_millis(millis),
    }
}

async fn sales_to(app: &TestApp, buyer_id: &str) -> Vec<sale::Model> {
    sale::Entity::find()
        .filter(sale::Column::BuyerId.eq(buyer_id))
        .all(app.store.connection())
        .await
        .unwrap()
}

async fn leads_in_state(app: &TestApp, state: &str) -> Vec<lead::Model> {
    lead::Entity::find()
        .filter(lead::Column::State.eq(state))
        .all(app.store.connection())
        .await
        .unwrap()
}

async fn wait_until_sold(app: &TestApp, count: usize) {
    wait_until(&format!("{count} leads sold"), SETTLE, || async {
        leads_in_state(app, "sold").await.len() == count
    })
    .await;
}

/// A capped buyer (first, slow posts so that every lead is in flight at
/// once) and a backup buyer that takes what the cap leaves.
fn capped_and_backup(cap: &str) -> (TestBuyer, TestBuyer, String) {
    let capped = TestBuyer::start(accept(), post_delayed(300));
    let backup = TestBuyer::start(accept(), accept());
    let extra = format!("max_concurrency = 32\n{cap}");
    let toml = BuyerConfig {
        extra: &extra,
        ..BuyerConfig::new("capped", 1)
    }
    .toml(&capped.base)
        + &BuyerConfig::new("backup", 2).toml(&backup.base);
    (capped, backup, toml)
}

/// Waits out the last seconds of an hour (and so of a day): a cap's
/// period that ends during a test makes room for more sales, rightly.
async fn clear_of_a_period_end() {
    use chrono::Timelike;
    let now = chrono::Utc::now();
    let left = 3600 - i64::from(now.minute() * 60 + now.second());
    if left <= 30 {
        actix_web::rt::time::sleep(Duration::from_secs(left as u64 + 1)).await;
    }
}

async fn a_cap_holds_under_concurrency(backend: Backend, cap: &str, limit: usize, leads: usize) {
    clear_of_a_period_end().await;
    let (capped, backup, toml) = capped_and_backup(cap);
    let app = spawn_app_with(backend, &toml).await;
    join_all((0..leads).map(|n| app.submit(json!({"email": format!("cap{n}@example.com")})))).await;
    wait_until_sold(&app, leads).await;

    assert_eq!(sales_to(&app, "capped").await.len(), limit);
    assert_eq!(capped.calls("post").len(), limit, "no post beyond the cap");
    assert_eq!(sales_to(&app, "backup").await.len(), leads - limit);
    assert_eq!(backup.calls("post").len(), leads - limit);
    let buyers = app.admin_get("/v1/buyers").await.json();
    let caps = &buyers.as_array().unwrap()[0]["caps"];
    assert_eq!(caps[0]["used"], limit, "{caps}");
    assert_eq!(caps[0]["limit"], limit, "{caps}");
}

async fn a_daily_cap_holds_with_ten_leads_at_once(backend: Backend) {
    a_cap_holds_under_concurrency(backend, "daily_cap = 3", 3, 10).await;
}

async fn an_hourly_cap_holds_with_six_leads_at_once(backend: Backend) {
    a_cap_holds_under_concurrency(backend, "hourly_cap = 2", 2, 6).await;
}

async fn a_rejected_post_gives_its_cap_slot_back(backend: Backend) {
    let capped = TestBuyer::start(accept(), Answer::Reject);
    let app = spawn_app_with(
        backend,
        &BuyerConfig {
            extra: "daily_cap = 1",
            ..BuyerConfig::new("capped", 1)
        }
        .toml(&capped.base),
    )
    .await;
    let first = app.submit(json!({"email": "first@example.com"})).await;
    app.wait_for_state(&first, "unsold").await;
    capped.set_post(accept());
    let second = app.submit(json!({"email": "second@example.com"})).await;
    app.wait_for_state(&second, "sold").await;
    let third = app.submit(json!({"email": "third@example.com"})).await;
    let view = app.wait_for_state(&third, "unsold").await;
    assert_eq!(view["attempts"][0]["outcome"], "capped", "{view}");
    assert_eq!(capped.calls("post").len(), 2);
}

#[actix_web::test]
async fn two_instances_on_one_postgres_sell_exactly_the_cap() {
    let (capped, backup, toml) = capped_and_backup("daily_cap = 4");
    // No sweeps: each instance routes the leads it took in, so both sell
    // against the one cap at the same time.
    let no_sweep =
        |settings: &mut Settings| settings.routing.sweep_interval = Duration::from_secs(600);
    let one = spawn_app_adjusted(Backend::Postgres, &toml, no_sweep).await;
    let two = spawn_instance_of(&one, &toml, no_sweep).await;
    // A lead sold by each instance first (each takes a cap slot): each
    // router's sweep at start is over by then. Late, it could claim the
    // other instance's leads of the race below, and one instance sell all.
    for (n, app) in [&one, &two].into_iter().enumerate() {
        app.submit(json!({"email": format!("first{n}@example.com")}))
            .await;
        wait_until_sold(&one, n + 1).await;
    }
    let raced = join_all((0..16).map(|n| {
        let app = if n % 2 == 0 { &one } else { &two };
        app.submit(json!({"email": format!("both{n}@example.com")}))
    }))
    .await;
    wait_until_sold(&one, 18).await;
    assert_eq!(sales_to(&one, "capped").await.len(), 4);
    assert_eq!(capped.calls("post").len(), 4);
    assert_eq!(backup.calls("post").len(), 14);
    let instances: HashSet<Option<String>> = attempt::Entity::find()
        .filter(attempt::Column::LeadId.is_in(raced))
        .all(one.store.connection())
        .await
        .unwrap()
        .into_iter()
        .map(|attempt| attempt.instance_id)
        .collect();
    assert_eq!(instances.len(), 2, "both instances routed the raced leads");
    crate::helpers::close_stores().await;
}

/// Two buyers that accept; the first answers its post slowly, so the test
/// can break the database while the post is out.
fn slow_first_and_second() -> (TestBuyer, TestBuyer, String) {
    let first = TestBuyer::start(accept(), post_delayed(700));
    let second = TestBuyer::start(accept(), accept());
    let toml = BuyerConfig::new("first", 1).toml(&first.base)
        + &BuyerConfig::new("second", 2).toml(&second.base);
    (first, second, toml)
}

async fn a_failed_sale_commit_leaves_the_lead_sold_to_that_buyer_and_no_other(backend: Backend) {
    let (first, second, toml) = slow_first_and_second();
    let app = spawn_app_with(backend, &toml).await;
    let id = app.submit(json!({"email": "sale@example.com"})).await;
    wait_until("the post to be out", SETTLE, || async {
        !first.calls("post").is_empty()
    })
    .await;
    // The sale's commit fails: its table is gone while the buyer accepts.
    execute(&app, "ALTER TABLE sales RENAME TO sales_moved_away").await;
    wait_until("the acceptance to be kept alone", SETTLE, || async {
        let posts = attempt::Entity::find()
            .filter(attempt::Column::LeadId.eq(id.as_str()))
            .filter(attempt::Column::Outcome.eq("accepted"))
            .filter(attempt::Column::Kind.eq("post"))
            .all(app.store.connection())
            .await
            .unwrap();
        !posts.is_empty()
    })
    .await;
    execute(&app, "ALTER TABLE sales_moved_away RENAME TO sales").await;

    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "first");
    assert_eq!(view["price"], 15.0);
    assert_eq!(sales_to(&app, "first").await.len(), 1);
    assert_eq!(first.calls("post").len(), 1, "the post is never re-sent");
    assert!(
        second.calls("ping").is_empty() && second.calls("post").is_empty(),
        "a lead with an accepted post is never offered to another buyer"
    );
}

/// What a trigger refuses of a buyer's post rows.
#[derive(Clone, Copy)]
enum Refused {
    /// Writing the row (the post is never sent).
    Row,
    /// Writing its answer.
    Answer,
}

/// Makes the database refuse `buyer_id`'s post rows or their answers, or
/// lifts that again.
async fn refuse_posts(app: &TestApp, backend: Backend, refused: Refused, buyer_id: &str, on: bool) {
    let (event, row) = match refused {
        Refused::Row => ("INSERT", "NEW"),
        Refused::Answer => ("UPDATE", "OLD"),
    };
    let statements: Vec<String> = match (backend, on) {
        (Backend::Sqlite, true) => vec![format!(
            "CREATE TRIGGER refuse_posts BEFORE {event} ON attempts \
             WHEN {row}.buyer_id = '{buyer_id}' AND {row}.kind = 'post' \
             BEGIN SELECT RAISE(ABORT, 'post refused'); END"
        )],
        (Backend::Sqlite, false) => vec!["DROP TRIGGER refuse_posts".into()],
        (Backend::Postgres, true) => vec![
            format!(
                "CREATE FUNCTION refuse_posts() RETURNS trigger AS $$ BEGIN \
                 IF {row}.buyer_id = '{buyer_id}' AND {row}.kind = 'post' THEN \
                 RAISE EXCEPTION 'post refused'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            ),
            format!(
                "CREATE TRIGGER refuse_posts BEFORE {event} ON attempts \
                 FOR EACH ROW EXECUTE FUNCTION refuse_posts()"
            ),
        ],
        (Backend::Postgres, false) => vec![
            "DROP TRIGGER refuse_posts ON attempts".into(),
            "DROP FUNCTION refuse_posts()".into(),
        ],
    };
    for statement in statements {
        execute(app, &statement).await;
    }
}

/// A ping's answer is held for the commit of the walk's next row: when
/// that commit fails (the post's row refused), no post is sent, and the
/// answer is still written before the walk ends.
async fn a_post_row_the_database_refuses_is_never_sent_and_its_ping_is_kept(backend: Backend) {
    let first = TestBuyer::start(accept(), accept());
    let second = TestBuyer::start(accept(), accept());
    let toml = BuyerConfig::new("first", 1).toml(&first.base)
        + &BuyerConfig::new("second", 2).toml(&second.base);
    let app = spawn_app_with(backend, &toml).await;
    refuse_posts(&app, backend, Refused::Row, "first", true).await;
    let id = app
        .submit(json!({"email": "refused-row@example.com"}))
        .await;
    wait_until("two walks to stop on the refused row", SETTLE, || async {
        let row = app.store.find_lead(&id).await.unwrap().unwrap();
        row.route_failures >= 2
    })
    .await;
    refuse_posts(&app, backend, Refused::Row, "first", false).await;
    assert!(
        first.calls("post").is_empty() && second.calls("ping").is_empty(),
        "nothing is sent after a row that could not be written"
    );
    let pings = first.calls("ping").len();
    assert!(pings >= 2, "each walk pinged: {pings}");

    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "first");
    let rows = app.store.attempts_of(&id).await.unwrap();
    let ping_outcomes: Vec<&str> = rows
        .iter()
        .filter(|attempt| attempt.kind == "ping")
        .map(|attempt| attempt.outcome.as_str())
        .collect();
    assert!(
        ping_outcomes.len() > pings && ping_outcomes.iter().all(|outcome| *outcome == "accepted"),
        "every ping's answer was written, none left in flight: {ping_outcomes:?}"
    );
    assert_eq!(first.calls("post").len(), 1);
}

async fn a_post_whose_answer_cannot_be_written_stops_the_walk(backend: Backend) {
    let first = TestBuyer::start(accept(), Answer::Reject);
    let second = TestBuyer::start(accept(), accept());
    let toml = BuyerConfig::new("first", 1).toml(&first.base)
        + &BuyerConfig::new("second", 2).toml(&second.base);
    let app = spawn_app_with(backend, &toml).await;
    refuse_posts(&app, backend, Refused::Answer, "first", true).await;
    let id = app.submit(json!({"email": "lost@example.com"})).await;
    wait_until(
        "the walk to stop on the unrecorded answer",
        SETTLE,
        || async {
            let row = app.store.find_lead(&id).await.unwrap().unwrap();
            row.route_failures >= 2
        },
    )
    .await;
    refuse_posts(&app, backend, Refused::Answer, "first", false).await;

    let view = app.wait_for_state(&id, "unknown").await;
    assert_eq!(first.calls("post").len(), 1, "never re-sent");
    assert!(
        second.calls("ping").is_empty() && second.calls("post").is_empty(),
        "an unrecorded post is never followed by another buyer"
    );
    let post = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|attempt| attempt["kind"] == "post")
        .unwrap()
        .clone();
    assert_eq!(post["outcome"], "timeout");
    assert_eq!(post["reason"], "interrupted");
}

async fn a_client_that_drops_its_retry_still_gets_the_sale_recorded(backend: Backend) {
    let buyer = TestBuyer::start(accept(), Answer::Reject);
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    let id = app.submit(json!({"email": "retry@example.com"})).await;
    let post = post_of(&app.wait_for_state(&id, "unsold").await);

    buyer.set_post(post_delayed(1500));
    let impatient = awc::Client::builder()
        .timeout(Duration::from_millis(200))
        .finish();
    let dropped = impatient
        .post(app.url(&format!("/v1/attempts/{post}/retry")))
        .insert_header(("Authorization", "Bearer test-admin-token"))
        .send()
        .await;
    assert!(dropped.is_err(), "the client gave up before the answer");

    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "acme");
    assert_eq!(sales_to(&app, "acme").await.len(), 1);
    let retried = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|attempt| attempt["retry_of"] == post.as_str())
        .cloned()
        .unwrap();
    assert_eq!(retried["outcome"], "accepted");
    assert_eq!(buyer.calls("post").len(), 2);
}

async fn a_retried_post_that_times_out_leaves_the_lead_unknown_with_an_alert(backend: Backend) {
    let buyer = TestBuyer::start(accept(), Answer::Reject);
    let config = BuyerConfig {
        post_timeout: "500ms",
        ..BuyerConfig::new("acme", 1)
    };
    let app = spawn_app_with(backend, &config.toml(&buyer.base)).await;
    let id = app.submit(json!({"email": "hang@example.com"})).await;
    let post = post_of(&app.wait_for_state(&id, "unsold").await);

    buyer.set_post(Answer::Hang);
    let retried = app
        .admin_send("POST", &format!("/v1/attempts/{post}/retry"), json!({}))
        .await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(retried.json()["outcome"], "timeout");
    assert_eq!(app.lead(&id).await["lead_state"], "unknown");
    let alerts = post_timeout_alerts(&app, &id).await;
    assert_eq!(alerts.len(), 1, "the timed-out retry raised an alert");
    // Never re-sent: the sweep leaves an unknown lead alone.
    actix_web::rt::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(buyer.calls("post").len(), 2);
}

/// The `post_timeout` alerts raised for this lead.
async fn post_timeout_alerts(app: &TestApp, lead_id: &str) -> Vec<alert::Model> {
    alert::Entity::find()
        .filter(alert::Column::Kind.eq("post_timeout"))
        .filter(alert::Column::LeadId.eq(lead_id))
        .all(app.store.connection())
        .await
        .unwrap()
}

/// The retried post's row is written, then the buyer actor panics (an
/// injected fault on a second instance): the post may have gone out, so
/// the lead may not go back to `unsold` with it still in flight (its cap
/// slot held for ever, and a sale to another buyer possible).
async fn a_retried_post_whose_buyer_actor_crashes_leaves_the_lead_unknown_not_unsold(
    backend: Backend,
) {
    let buyer = TestBuyer::start(accept(), Answer::Reject);
    let buyers = BuyerConfig::new("acme", 1).toml(&buyer.base);
    let app = spawn_app_with(backend, &buyers).await;
    let id = app.submit(json!({"email": "crash@example.com"})).await;
    let post = post_of(&app.wait_for_state(&id, "unsold").await);

    let faulty = spawn_instance_of(
        &app,
        &format!("{buyers}\n[faults]\nbuyer_panics = {{ acme = 1 }}\n"),
        |_| {},
    )
    .await;
    let retried = faulty
        .admin_send("POST", &format!("/v1/attempts/{post}/retry"), json!({}))
        .await;
    assert_eq!(retried.status, 503, "{}", retried.text());

    let view = app.lead(&id).await;
    assert_eq!(
        view["lead_state"], "unknown",
        "settled with the retry's answer"
    );
    let attempts = view["attempts"].as_array().unwrap();
    let retry = attempts
        .iter()
        .find(|attempt| attempt["retry_of"] == post.as_str())
        .expect("the retry's row was written");
    assert_eq!(retry["outcome"], "timeout", "{view}");
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt["outcome"] != "in_flight"),
        "{view}"
    );
    assert_eq!(buyer.calls("post").len(), 1, "nothing re-sent");
    let alerts = post_timeout_alerts(&app, &id).await;
    assert_eq!(
        alerts.len(),
        1,
        "the operator is told the post's fate is unknown"
    );
}

async fn one_person_submitted_at_once_under_many_keys_is_one_routable_lead(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let answers = join_all((0..12).map(|n| {
        let body = json!({"email": "same@example.com", "phone": format!("555010{n:04}")});
        let request = if n % 2 == 0 {
            app.client
                .post(app.url("/v1/leads?source=website"))
                .insert_header(("Idempotency-Key", format!("form-{n}")))
        } else {
            app.client
                .post(app.url("/v1/leads"))
                .insert_header(("X-Api-Key", crate::helpers::PARTNER_KEY))
                .insert_header(("Idempotency-Key", format!("feed-{n}")))
        };
        app.send(
            request.insert_header(("Content-Type", "application/json")),
            serde_json::to_vec(&body).unwrap(),
        )
    }))
    .await;
    assert!(answers.iter().all(|answer| answer.status < 300));
    let leads = lead::Entity::find()
        .all(app.store.connection())
        .await
        .unwrap();
    assert_eq!(leads.len(), 12, "every submission is stored");
    let routable: Vec<&lead::Model> = leads
        .iter()
        .filter(|lead| lead.state != "duplicate")
        .collect();
    assert_eq!(routable.len(), 1, "exactly one routable lead");
    for lead in leads.iter().filter(|lead| lead.state == "duplicate") {
        assert_eq!(lead.duplicate_of.as_deref(), Some(routable[0].id.as_str()));
    }
}

#[actix_web::test]
async fn one_person_at_two_instances_at_once_is_one_routable_lead() {
    let one = spawn_app_with(Backend::Postgres, "").await;
    let two = spawn_instance_of(&one, "", |_| {}).await;
    for round in 0..5 {
        join_all((0..10).map(|n| {
            let app = if n % 2 == 0 { &one } else { &two };
            app.submit(json!({"email": format!("person{round}@example.com"), "phone": format!("555{round}{n:06}")}))
        }))
        .await;
    }
    let leads = lead::Entity::find()
        .all(one.store.connection())
        .await
        .unwrap();
    assert_eq!(leads.len(), 50);
    for round in 0..5 {
        let email = format!("person{round}@example.com");
        let person: Vec<&lead::Model> = leads
            .iter()
            .filter(|lead| lead.fields["email"] == email.as_str())
            .collect();
        let routable: Vec<&&lead::Model> = person
            .iter()
            .filter(|lead| lead.state != "duplicate")
            .collect();
        assert_eq!(routable.len(), 1, "{email}: one routable lead");
        assert!(person
            .iter()
            .filter(|lead| lead.state == "duplicate")
            .all(|lead| lead.duplicate_of.as_deref() == Some(routable[0].id.as_str())));
    }
    crate::helpers::close_stores().await;
}

async fn a_half_open_probe_lost_to_a_panic_does_not_keep_the_circuit_half_open(backend: Backend) {
    let buyer = TestBuyer::start(Answer::Status(503), accept());
    let config = BuyerConfig {
        extra: "circuit = { failure_threshold = 1, open_for = \"500ms\", max_open_for = \"1s\" }",
        ..BuyerConfig::new("flaky", 1)
    };
    let toml = format!(
        "[faults]\nprobe_panics = {{ flaky = 1 }}\n{}",
        config.toml(&buyer.base)
    );
    let app = spawn_app_with(backend, &toml).await;
    let id = app.submit(json!({"email": "probe@example.com"})).await;
    app.wait_for_state(&id, "unsold").await;
    // The buyer is back; the probe that half-opening offers it panics.
    buyer.set_ping(accept());

    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "flaky");
    let circuit = app.admin_get("/v1/buyers").await.json()[0]["circuit"].clone();
    assert_eq!(circuit, "closed");
    assert!(
        view["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|attempt| attempt["reason"] == "interrupted"),
        "the probe that panicked is in the history: {view}"
    );
}

/// Makes every attempt of the feed lead with this external id fail to be
/// written (a routing failure on our side), or lifts that again.
async fn poison(app: &TestApp, backend: Backend, external_id: &str, on: bool) {
    let statements: Vec<String> = match (backend, on) {
        (Backend::Sqlite, true) => vec![format!(
            "CREATE TRIGGER poison BEFORE INSERT ON attempts \
             WHEN NEW.lead_id IN (SELECT id FROM leads WHERE external_id = '{external_id}') \
             BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
        )],
        (Backend::Sqlite, false) => vec!["DROP TRIGGER poison".into()],
        (Backend::Postgres, true) => vec![
            format!(
                "CREATE FUNCTION poison() RETURNS trigger AS $$ BEGIN \
                 IF EXISTS (SELECT 1 FROM leads WHERE id = NEW.lead_id AND external_id = '{external_id}') \
                 THEN RAISE EXCEPTION 'poisoned'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            ),
            "CREATE TRIGGER poison BEFORE INSERT ON attempts \
             FOR EACH ROW EXECUTE FUNCTION poison()"
                .into(),
        ],
        (Backend::Postgres, false) => vec!["DROP TRIGGER poison ON attempts".into()],
    };
    for statement in statements {
        execute(app, &statement).await;
    }
}

async fn a_poison_lead_is_set_aside_while_other_leads_keep_selling(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    poison(&app, backend, "poison-1", true).await;
    let poisoned = app
        .post_feed_lead(&json!({"lead_id": "poison-1", "email": "poison@example.com"}))
        .await
        .json()["submission_id"]
        .as_str()
        .unwrap()
        .to_string();
    let healthy =
        join_all((0..5).map(|n| app.submit(json!({"email": format!("ok{n}@example.com")})))).await;
    for id in &healthy {
        app.wait_for_state(id, "sold").await;
    }
    wait_until("the poison lead to be set aside", SETTLE, || async {
        let row = app.store.find_lead(&poisoned).await.unwrap().unwrap();
        row.set_aside_reason.is_some()
    })
    .await;
    let row = app.store.find_lead(&poisoned).await.unwrap().unwrap();
    assert_eq!(
        row.route_failures, 5,
        "the test configuration's failure_limit"
    );
    assert_eq!(row.state, "received");
    let review = app.admin_get("/v1/review").await.json();
    assert!(
        review["leads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|lead| lead["id"] == poisoned.as_str()),
        "in the review queue: {review}"
    );
    let view = app.lead(&poisoned).await;
    assert!(
        view["why"].as_str().unwrap().contains("set aside"),
        "{view}"
    );
    let status = app
        .send(app.client.get(app.url("/v1/status")), "")
        .await
        .json();
    assert_eq!(
        status["review"]["pending"], 1,
        "the set-aside lead counts in the review backlog: {status}"
    );
    let alerts = alert::Entity::find()
        .filter(alert::Column::Kind.eq("routing_failed"))
        .all(app.store.connection())
        .await
        .unwrap();
    assert_eq!(alerts.len(), 1);
    // Left alone until an operator acts: no more tries.
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        app.store
            .find_lead(&poisoned)
            .await
            .unwrap()
            .unwrap()
            .route_failures,
        5
    );

    poison(&app, backend, "poison-1", false).await;
    let rerouted = app
        .admin_send("POST", &format!("/v1/leads/{poisoned}/reroute"), json!({}))
        .await;
    assert_eq!(rerouted.status, 200, "{}", rerouted.text());
    app.wait_for_state(&poisoned, "sold").await;
}

async fn skips_carry_their_reason_as_outcome(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let config = BuyerConfig {
        extra: "filters = { state = [\"TX\"] }",
        ..BuyerConfig::new("texas", 1)
    };
    let app = spawn_app_with(backend, &config.toml(&buyer.base)).await;
    let id = app
        .submit(json!({"email": "ca@example.com", "state": "CA"}))
        .await;
    let view = app.wait_for_state(&id, "unsold").await;
    let skip = &view["attempts"][0];
    assert_eq!(skip["kind"], "skip");
    assert_eq!(skip["outcome"], "filtered");
    assert_eq!(skip["reason"], "filtered");
    assert!(
        view["why"].as_str().unwrap().contains("skipped: filtered"),
        "{view}"
    );
    let buyers = app.admin_get("/v1/buyers").await.json();
    assert_eq!(buyers[0]["counts"]["skipped"], 1);
}

/// A lead stored unsold after `buyer_id` failed it with an error.
fn unsold_after_an_error(n: usize, buyer_id: &str) -> (lead::ActiveModel, attempt::ActiveModel) {
    use sea_orm::{IntoActiveModel, Set};
    let now = chrono::Utc::now();
    let id = format!("outage-{n:05}");
    let lead = lead::Model {
        id: id.clone(),
        source_id: "website".into(),
        idempotency_key: Some(id.clone()),
        key_digest: None,
        external_id: None,
        state: "unsold".into(),
        raw: b"{}".to_vec(),
        raw_content_type: "application/json".into(),
        fields: json!({"email": format!("{id}@example.com")}),
        attribution: json!({}),
        is_test: false,
        errors: json!([]),
        duplicate_of: None,
        manager_notified: false,
        crm_synced: false,
        lease_owner: None,
        lease_until: None,
        received_at: now,
        updated_at: now,
        history_from: None,
        offer_tried: false,
        claim_token: None,
        route_failures: 0,
        route_after: None,
        set_aside_reason: None,
        accepted_at: None,
    };
    let attempt = attempt::ActiveModel {
        id: Set(format!("{id}-post")),
        lead_id: Set(id),
        buyer_id: Set(buyer_id.into()),
        kind: Set("post".into()),
        outcome: Set("error".into()),
        reason: Set(Some("HTTP 503".into())),
        http_status: Set(Some(503)),
        started_at: Set(now - chrono::Duration::seconds(5)),
        duration_ms: Set(Some(3)),
        retry_of: Set(None),
        request: Set(Value::Null),
        response_body: Set(None),
        // A row made by hand: the configuration it names is never read.
        snapshot_id: Set(ConfigSnapshot::default().id),
        bid: Set(None),
        ping_id: Set(None),
        instance_id: Set(None),
    };
    (lead.into_active_model(), attempt)
}

async fn a_recovered_buyer_gets_back_every_lead_it_failed_not_a_page(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let rows: Vec<_> = (0..2_345)
        .map(|n| unsold_after_an_error(n, "acme"))
        .collect();
    for chunk in rows.chunks(200) {
        let (leads, attempts): (Vec<_>, Vec<_>) = chunk.iter().cloned().unzip();
        lead::Entity::insert_many(leads)
            .exec_without_returning(app.store.connection())
            .await
            .unwrap();
        attempt::Entity::insert_many(attempts)
            .exec_without_returning(app.store.connection())
            .await
            .unwrap();
    }
    // One lead the buyer rejected afterwards: its answer is final.
    let mut rejected = rows.last().unwrap().1.clone();
    rejected.id = sea_orm::Set("later-rejection".into());
    rejected.outcome = sea_orm::Set("rejected".into());
    rejected.started_at = sea_orm::Set(chrono::Utc::now());
    attempt::Entity::insert(rejected)
        .exec_without_returning(app.store.connection())
        .await
        .unwrap();

    let now = chrono::Utc::now();
    let day_ago = now - chrono::Duration::days(1);
    let requeued = app
        .store
        .requeue_for_buyer("acme", day_ago, now, None, None)
        .await
        .unwrap();
    assert_eq!(
        requeued, 2_344,
        "every lead but the rejected one, past the first page"
    );
    let probe = app
        .store
        .requeue_for_buyer("other", day_ago, now, Some(1), None)
        .await
        .unwrap();
    assert_eq!(probe, 0, "another buyer's failures are not this buyer's");
}

async fn a_retry_never_offers_an_unknown_lead_to_another_buyer(backend: Backend) {
    let failing = TestBuyer::start(Answer::Status(503), accept());
    let hanging = TestBuyer::start(accept(), Answer::Hang);
    let toml = BuyerConfig::new("failing", 1).toml(&failing.base)
        + &BuyerConfig {
            post_timeout: "300ms",
            ..BuyerConfig::new("hanging", 2)
        }
        .toml(&hanging.base);
    let app = spawn_app_with(backend, &toml).await;
    let id = app.submit(json!({"email": "unknown@example.com"})).await;
    let view = app.wait_for_state(&id, "unknown").await;
    let attempt_of = |buyer: &str, kind: &str| {
        view["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|attempt| attempt["buyer_id"] == buyer && attempt["kind"] == kind)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    failing.set_ping(accept());
    let elsewhere = app
        .admin_send(
            "POST",
            &format!("/v1/attempts/{}/retry", attempt_of("failing", "ping")),
            json!({}),
        )
        .await;
    assert_eq!(elsewhere.status, 409, "{}", elsewhere.text());
    assert_eq!(
        failing.calls("ping").len(),
        1,
        "the other buyer was not called"
    );

    hanging.set_post(accept());
    let same = app
        .admin_send(
            "POST",
            &format!("/v1/attempts/{}/retry", attempt_of("hanging", "post")),
            json!({}),
        )
        .await;
    assert_eq!(same.status, 200, "{}", same.text());
    assert_eq!(app.wait_for_state(&id, "sold").await["sold_to"], "hanging");
}

async fn a_reroute_cannot_hide_an_accepted_post_without_its_sale(backend: Backend) {
    let (first, second, toml) = slow_first_and_second();
    let app = spawn_app_with(backend, &toml).await;
    let id = app.submit(json!({"email": "hidden@example.com"})).await;
    app.wait_for_state(&id, "sold").await;
    // As if the sale's commit had been lost and the lead left unsold.
    execute(&app, &format!("DELETE FROM sales WHERE lead_id = '{id}'")).await;
    execute(
        &app,
        &format!("UPDATE leads SET state = 'unsold' WHERE id = '{id}'"),
    )
    .await;

    let rerouted = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{id}/reroute"),
            json!({"include_tried": true}),
        )
        .await;
    assert_eq!(rerouted.status, 200, "{}", rerouted.text());
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "first", "sold from its history");
    assert_eq!(first.calls("post").len(), 1, "never re-sent");
    assert!(
        second.calls("post").is_empty(),
        "never offered to another buyer"
    );
}

async fn a_lead_still_walking_when_its_buyer_recovers_is_offered_again_when_it_settles(
    backend: Backend,
) {
    let down = TestBuyer::start(accept(), Answer::Status(503));
    let slow = TestBuyer::start(accept(), Answer::Reject);
    let toml = BuyerConfig {
        extra: "circuit = { failure_threshold = 1, open_for = \"300ms\", max_open_for = \"1s\" }",
        ..BuyerConfig::new("down", 1)
    }
    .toml(&down.base)
        + &BuyerConfig {
            ping_timeout: Some("10s"),
            ..BuyerConfig::new("slow", 2)
        }
        .toml(&slow.base);
    let app = spawn_app_with(backend, &toml).await;
    slow.set_ping(post_delayed(4000));
    let walking = app.submit(json!({"email": "walking@example.com"})).await;
    wait_until("the down buyer to fail the lead", SETTLE, || async {
        !down.calls("post").is_empty()
    })
    .await;
    // The buyer comes back and answers (its circuit closes) while the
    // lead is still being walked at the slow buyer.
    down.set_post(accept());
    wait_until("the circuit to half-open", SETTLE, || async {
        app.admin_get("/v1/buyers").await.json()[0]["circuit"] == "half_open"
    })
    .await;
    let other = app.submit(json!({"email": "other@example.com"})).await;
    app.wait_for_state(&other, "sold").await;
    assert_eq!(app.lead(&walking).await["lead_state"], "routing");

    let view = app.wait_for_state(&walking, "sold").await;
    assert_eq!(view["sold_to"], "down");
}

async fn a_cap_added_by_a_reload_counts_the_sales_already_made(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    for n in 0..2 {
        let id = app
            .submit(json!({"email": format!("early{n}@example.com")}))
            .await;
        app.wait_for_state(&id, "sold").await;
    }
    app.reload_with(&acme_capped(&buyer, "daily_cap = 2")).await;
    wait_for_cap_use(&app, 2).await;
    let late = app.submit(json!({"email": "late@example.com"})).await;
    let view = app.wait_for_state(&late, "unsold").await;
    assert_eq!(view["attempts"][0]["outcome"], "capped", "{view}");
    assert_eq!(buyer.calls("post").len(), 2);
}

/// `acme` at the test buyer, with `cap` (a `[[buyers]]` key, or none).
fn acme_capped(buyer: &TestBuyer, cap: &str) -> String {
    BuyerConfig {
        extra: cap,
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base)
}

/// Buyer `acme` posted to directly (no ping), with `extra` settings.
fn acme_posted_directly(buyer: &TestBuyer, extra: &str) -> String {
    BuyerConfig {
        ping_timeout: None,
        extra,
        ..BuyerConfig::new("acme", 1)
    }
    .toml(&buyer.base)
}

/// Waits until the first buyer's first cap shows `used` slots.
async fn wait_for_cap_use(app: &TestApp, used: u64) {
    wait_until(&format!("the cap to count {used}"), SETTLE, || async {
        let buyers = app.admin_get("/v1/buyers").await.json();
        buyers[0]["caps"][0]["used"] == used
    })
    .await;
}

/// Submits leads one after another, each waited for until `state`.
async fn submit_each(app: &TestApp, tag: &str, count: usize, state: &str) {
    for n in 0..count {
        let id = app
            .submit(json!({"email": format!("{tag}{n}@example.com")}))
            .await;
        app.wait_for_state(&id, state).await;
    }
}

/// A daily cap of 3 is reached, removed by a reload while 3 more leads
/// sell, then restored: the counter is reconciled with the 6 sales of the
/// day, so no post reaches the buyer. Raised to 8 it takes exactly 2 more
/// of 5 leads offered at once;
/// lowered to 5 (below the 8 sales) it takes none. The buyer's own count
/// of posts is the witness.
async fn a_cap_removed_restored_raised_and_lowered_by_reloads_counts_the_days_sales(
    backend: Backend,
) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &acme_capped(&buyer, "daily_cap = 3")).await;
    submit_each(&app, "capped", 3, "sold").await;
    submit_each(&app, "over", 1, "unsold").await;
    assert_eq!(buyer.calls("post").len(), 3);

    app.reload_with(&acme_capped(&buyer, "")).await;
    submit_each(&app, "uncapped", 3, "sold").await;
    assert_eq!(buyer.calls("post").len(), 6);

    app.reload_with(&acme_capped(&buyer, "daily_cap = 3")).await;
    wait_for_cap_use(&app, 6).await;
    submit_each(&app, "restored", 2, "unsold").await;
    assert_eq!(
        buyer.calls("post").len(),
        6,
        "a restored cap counts the sales made while it was off"
    );

    app.reload_with(&acme_capped(&buyer, "daily_cap = 8")).await;
    let raised =
        join_all((0..5).map(|n| app.submit(json!({"email": format!("raised{n}@example.com")}))))
            .await;
    wait_until("the leads offered at once to settle", SETTLE, || async {
        let states = join_all(raised.iter().map(|id| app.lead(id))).await;
        states
            .iter()
            .all(|view| view["lead_state"] == "sold" || view["lead_state"] == "unsold")
    })
    .await;
    assert_eq!(
        buyer.calls("post").len(),
        8,
        "raised to 8 over 6 sales: exactly 2 more, of 5 at once"
    );

    app.reload_with(&acme_capped(&buyer, "daily_cap = 5")).await;
    wait_for_cap_use(&app, 8).await;
    submit_each(&app, "lowered", 1, "unsold").await;
    assert_eq!(buyer.calls("post").len(), 8, "lowered below the sales made");
    assert_eq!(sales_to(&app, "acme").await.len(), 8);
}

/// A cap restored by a reload while a post made under the cap-less
/// settings is on its way to the database (its row waits on a lock held on
/// `attempts`): the recount waits for the writes queued before it, so the
/// post counts, and no lead sells beyond the cap. Before the fix the
/// recount ran at once, missed the post, and a third sale followed it.
/// PostgreSQL: the lock blocks the row's insert and leaves the recount's
/// reads free (on SQLite it would hold the recount too).
#[actix_web::test]
async fn a_cap_restored_while_a_post_is_being_written_counts_that_post() {
    use sea_orm::{ConnectionTrait, TransactionTrait};

    let buyer = TestBuyer::start(accept(), accept());
    let acme = |extra| acme_posted_directly(&buyer, extra);
    let app = spawn_app_with(Backend::Postgres, &acme("daily_cap = 3")).await;
    submit_each(&app, "capped", 1, "sold").await;
    app.reload_with(&acme("")).await;
    submit_each(&app, "uncapped", 1, "sold").await;

    let url = database_url_of(&app);
    let blocker = sea_orm::Database::connect(url.as_str()).await.unwrap();
    let hold = blocker.begin().await.unwrap();
    hold.execute_unprepared("LOCK TABLE attempts IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let in_flight = app.submit(json!({"email": "in-flight@example.com"})).await;
    let watcher = sea_orm::Database::connect(url.as_str()).await.unwrap();
    wait_until("the post's row to wait for the lock", SETTLE, || async {
        one_value::<i64>(
            &watcher,
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'INSERT INTO \"attempts\"%'",
        )
        .await
            > 0
    })
    .await;
    app.reload_with(&acme("daily_cap = 3")).await;
    // Unfixed, the recount runs at once and counts the two sales only: the
    // counter shows 2 within moments. Fixed, it waits for the post's row,
    // so it cannot move while the lock is held; after a while the lock goes.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let buyers = app.admin_get("/v1/buyers").await.json();
        if buyers[0]["caps"][0]["used"] == 2 {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    hold.rollback().await.unwrap();
    app.wait_for_state(&in_flight, "sold").await;
    for n in 0..2 {
        let over = app
            .submit(json!({"email": format!("over{n}@example.com")}))
            .await;
        wait_until("the lead over the cap to settle", SETTLE, || async {
            let state = app.lead(&over).await["lead_state"].clone();
            state == "sold" || state == "unsold"
        })
        .await;
    }
    assert_eq!(buyer.calls("post").len(), 3, "no post beyond the cap of 3");
    assert_eq!(sales_to(&app, "acme").await.len(), 3);
}

/// A cap restored by a reload while posts wait for the buyer's one slot:
/// a post takes its slot before its row is written, and reserves the caps
/// of the buyer's settings as they are then, so the posts that waited
/// (offered while the cap was off) are held by the restored cap.
async fn a_cap_restored_while_posts_wait_for_the_buyers_slot_holds_them(backend: Backend) {
    let buyer = TestBuyer::start(
        accept(),
        Answer::Accept {
            delay: Duration::from_secs(2),
        },
    );
    // Direct posts (no ping): the posts themselves wait for the slot.
    let acme = |extra| acme_posted_directly(&buyer, extra);
    let one_slot = "max_concurrency = 1\nqueue_timeout = \"30s\"";
    let capped = format!("{one_slot}\ndaily_cap = 1");
    let app = spawn_app_with(backend, &acme(&capped)).await;
    submit_each(&app, "capped", 1, "sold").await;

    app.reload_with(&acme(one_slot)).await;
    let offered =
        join_all((0..3).map(|n| app.submit(json!({"email": format!("waits{n}@example.com")}))))
            .await;
    wait_until(
        "one post out, the other leads waiting for the slot",
        SETTLE,
        || async {
            let states = join_all(offered.iter().map(|id| app.lead(id))).await;
            buyer.calls("post").len() == 2
                && states.iter().all(|view| view["lead_state"] == "routing")
        },
    )
    .await;
    app.reload_with(&acme(&capped)).await;
    for id in &offered {
        wait_until("the lead to settle", SETTLE, || async {
            let state = app.lead(id).await["lead_state"].clone();
            state == "sold" || state == "unsold"
        })
        .await;
    }
    assert_eq!(
        buyer.calls("post").len(),
        2,
        "the posts that waited for the slot reserve the restored cap"
    );
}

async fn a_return_gives_its_cap_slot_back(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let config = BuyerConfig {
        extra: "daily_cap = 1",
        ..BuyerConfig::new("acme", 1)
    };
    let app = spawn_app_with(backend, &config.toml(&buyer.base)).await;
    let sold = app.submit(json!({"email": "kept@example.com"})).await;
    app.wait_for_state(&sold, "sold").await;
    let capped = app.submit(json!({"email": "capped@example.com"})).await;
    app.wait_for_state(&capped, "unsold").await;

    let returned = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{sold}/return"),
            json!({"reason": "bad number"}),
        )
        .await;
    assert_eq!(returned.status, 200, "{}", returned.text());
    let buyers = app.admin_get("/v1/buyers").await.json();
    assert_eq!(buyers[0]["caps"][0]["used"], 0, "{buyers}");
    let next = app.submit(json!({"email": "next@example.com"})).await;
    app.wait_for_state(&next, "sold").await;
}

/// A post that got no answer keeps its cap slot in case it sold; once an
/// operator's retry or resolve decides the lead, each sale holds exactly
/// one slot and every other unanswered post gives its slot back.
async fn unanswered_posts_give_their_cap_slots_back_once_a_retry_or_resolve_decides(
    backend: Backend,
) {
    let buyer = TestBuyer::start(accept(), Answer::Hang);
    let config = BuyerConfig {
        post_timeout: "300ms",
        extra: "daily_cap = 10",
        ..BuyerConfig::new("acme", 1)
    };
    let app = spawn_app_with(backend, &config.toml(&buyer.base)).await;
    let used = || async {
        let buyers = app.admin_get("/v1/buyers").await.json();
        buyers[0]["caps"][0]["used"].as_u64().unwrap()
    };
    let retry = |post: String| {
        let app = &app;
        async move {
            let path = format!("/v1/attempts/{post}/retry");
            app.admin_send("POST", &path, json!({})).await.json()["outcome"].clone()
        }
    };
    let resolve = |id: String, sold: bool| {
        let app = &app;
        async move {
            let path = format!("/v1/leads/{id}/resolve");
            let body = json!({"buyer_id": "acme", "sold": sold});
            app.admin_send("POST", &path, body).await.json()["lead_state"].clone()
        }
    };

    // Sold by a retry: one sale, one slot.
    let by_retry = app.submit(json!({"email": "a@example.com"})).await;
    let post = post_of(&app.wait_for_state(&by_retry, "unknown").await);
    assert_eq!(used().await, 1, "the unanswered post keeps its slot");
    buyer.set_post(accept());
    assert_eq!(retry(post).await, "accepted");
    assert_eq!(app.lead(&by_retry).await["lead_state"], "sold");
    assert_eq!(used().await, 1, "one sale holds one slot");

    // Two unanswered posts each, then resolved: sold keeps one slot, not
    // sold none.
    buyer.set_post(Answer::Hang);
    let mut sales = 1;
    for (email, sold, state) in [
        ("b@example.com", true, "sold"),
        ("c@example.com", false, "unsold"),
    ] {
        let id = app.submit(json!({"email": email})).await;
        let post = post_of(&app.wait_for_state(&id, "unknown").await);
        assert_eq!(retry(post).await, "timeout");
        assert_eq!(used().await, sales + 2, "both posts keep their slots");
        assert_eq!(resolve(id, sold).await, state);
        sales += u64::from(sold);
        assert_eq!(used().await, sales, "after resolving {email} {state}");
    }

    // Rerouted once the buyer said it did not sell: the slot comes back.
    let rerouted = app.submit(json!({"email": "d@example.com"})).await;
    app.wait_for_state(&rerouted, "unknown").await;
    assert_eq!(used().await, sales + 1);
    let path = format!("/v1/leads/{rerouted}/reroute");
    let answer = app.admin_send("POST", &path, json!({})).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    app.wait_for_state(&rerouted, "unsold").await;
    assert_eq!(
        used().await,
        sales,
        "the rerouted lead's post gave its slot back"
    );

    // A sale to a buyer that was never posted the lead is refused and
    // keeps the slot; resolved not sold, the slot comes back.
    let elsewhere = app.submit(json!({"email": "e@example.com"})).await;
    app.wait_for_state(&elsewhere, "unknown").await;
    assert_eq!(used().await, sales + 1);
    let path = format!("/v1/leads/{elsewhere}/resolve");
    let body = json!({"buyer_id": "by-phone", "sold": true});
    let answer = app.admin_send("POST", &path, body).await;
    assert_eq!(answer.status, 422, "{}", answer.text());
    assert_eq!(used().await, sales + 1, "a refused resolve changes nothing");
    assert_eq!(resolve(elsewhere, false).await, "unsold");
    assert_eq!(used().await, sales, "acme's unanswered post did not sell");
}

async fn fixing_an_invalid_lead_of_a_known_person_makes_it_a_duplicate(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let original = app.submit(json!({"email": "known@example.com"})).await;
    let invalid = app
        .post_form_lead(&json!({"email": "known@example.com", "phone": "12"}))
        .await;
    assert_eq!(invalid.status, 422, "{}", invalid.text());
    let invalid = invalid.json()["submission_id"]
        .as_str()
        .unwrap()
        .to_string();

    let fixed = app
        .admin_send(
            "PATCH",
            &format!("/v1/leads/{invalid}"),
            json!({"fields": {"phone": null}}),
        )
        .await;
    assert_eq!(fixed.status, 200, "{}", fixed.text());
    assert_eq!(fixed.json()["lead_state"], "duplicate");
    assert_eq!(fixed.json()["duplicate_of"], original.as_str());
}
