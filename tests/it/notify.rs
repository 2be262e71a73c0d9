//! Accountable delivery (SPEC section 7) on both databases, against real
//! receivers on loopback: a required channel makes a lead `accepted`
//! (within `accept_wait`, or later by polling); a channel that is down
//! keeps the lead `pending` and safe while it is still sold; a replay after
//! it recovers delivers exactly once; two instances never notify one lead
//! twice; events are sent once each and `lead.accepted` never for a
//! pending lead; Slack, Telegram and SMTP channels deliver to real servers;
//! leads drained from the spool long after they arrived, more than a page
//! of them at once, are each delivered and announced once.

use std::time::Duration;

use leadrouter::store::NewLead;
use serde_json::{json, Value};

use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{
    new_leads, spawn_app_adjusted, spawn_app_with, spawn_instance_of, test_settings, wait_until,
    Backend, TestApp,
};
use crate::inbox::{Reply, TestInbox, TestSmtp};
use crate::on_both_databases;

on_both_databases!(
    a_required_channel_accepts_the_lead_within_accept_wait,
    a_later_confirmation_flips_the_contract_to_accepted,
    a_channel_that_is_down_keeps_the_lead_pending_and_a_replay_delivers_it_once,
    two_instances_never_notify_one_lead_twice,
    a_delivery_given_up_after_a_day_alerts_and_waits_in_the_review_queue,
    kill_9_mid_delivery_sends_every_lead_and_none_confirmed_twice,
    events_are_sent_once_each_and_never_accepted_for_a_pending_lead,
    unsold_and_unknown_leads_are_announced,
    slack_telegram_and_email_channels_deliver_readable_messages,
    leads_drained_after_a_long_outage_are_each_notified_and_announced_once,
    a_backlog_beyond_one_page_is_planned_page_after_page,
);

const WAIT: Duration = Duration::from_secs(20);

/// A required manager channel at `inbox` (retries an hour apart, so a test
/// sees only the tries it causes).
fn manager_channel(inbox: &TestInbox) -> String {
    format!(
        "\n[[notify]]\nid = \"manager\"\nrole = \"manager\"\nurl = \"{}/hook\"\ntimeout = \"3s\"\nrequired = true\nretry_backoff = \"1h\"\n",
        inbox.base
    )
}

/// `intake.accept_wait`.
fn accept_wait(wait: &str) -> String {
    format!("\n[intake]\naccept_wait = \"{wait}\"\n")
}

fn a_lead(email: &str) -> Value {
    json!({
        "email": email,
        "first_name": "Ann",
        "utm_source": "google",
        "consent_text": "I agree to be contacted.",
    })
}

async fn status_of(app: &TestApp, id: &str) -> Value {
    let answer = app
        .send(
            app.client.get(app.url(&format!("/v1/leads/{id}/status"))),
            "",
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

async fn replay(app: &TestApp, key: &str, body: &Value) -> Value {
    let request = app
        .client
        .post(app.url("/v1/leads?source=website"))
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key));
    let answer = app.send(request, serde_json::to_vec(body).unwrap()).await;
    assert!(answer.status < 300, "{}", answer.text());
    answer.json()
}

fn id_of(contract: &Value) -> String {
    contract["submission_id"].as_str().unwrap().to_string()
}

/// Waits until the lead's `channel` delivery is confirmed (admin view).
async fn wait_confirmed(app: &TestApp, id: &str, target: &str) {
    wait_until(&format!("{target} to confirm lead {id}"), WAIT, || async {
        app.lead(id).await["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|row| {
                let name = match row["event"].as_str() {
                    Some(event) => format!("{}:{event}", row["channel"].as_str().unwrap()),
                    None => row["channel"].as_str().unwrap().to_string(),
                };
                name == target && row["state"] == "confirmed"
            })
    })
    .await;
}

async fn a_required_channel_accepts_the_lead_within_accept_wait(backend: Backend) {
    let inbox = TestInbox::start(Reply::ok());
    let buyer = TestBuyer::start(accept(), accept());
    let config = format!(
        "{}{}{}",
        accept_wait("5s"),
        manager_channel(&inbox),
        BuyerConfig::new("acme", 1).toml(&buyer.base)
    );
    let app = spawn_app_with(backend, &config).await;

    let answer = app.post_form_lead(&a_lead("ann@example.com")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let contract = answer.json();
    assert_eq!(contract["acceptance"], "accepted");
    assert_eq!(contract["manager_notified"], true);
    assert_eq!(contract["crm_synced"], false);
    let id = id_of(&contract);

    let received = inbox.confirmed_for(&id);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].idempotency_key, format!("{id}:manager:notify"));
    let body = received[0].json();
    assert_eq!(body["fields"]["email"], "ann@example.com");
    assert_eq!(body["attribution"]["utm_source"], "google");
    assert_eq!(
        body["attribution"]["consent_text"],
        "I agree to be contacted."
    );
    assert_eq!(body["test"], false);

    let view = app.wait_for_state(&id, "sold").await;
    let notify: Vec<&Value> = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|attempt| attempt["kind"] == "notify")
        .collect();
    assert_eq!(notify.len(), 1, "{view}");
    assert_eq!(notify[0]["buyer_id"], "manager");
    assert_eq!(notify[0]["outcome"], "accepted");
    assert_eq!(notify[0]["http_status"], 200);
    assert_eq!(view["deliveries"][0]["state"], "confirmed");
    assert_eq!(view["contract"]["acceptance"], "accepted");
}

async fn a_later_confirmation_flips_the_contract_to_accepted(backend: Backend) {
    let inbox = TestInbox::start(Reply::ok().after(Duration::from_millis(1500)));
    let app = spawn_app_with(
        backend,
        &format!("{}{}", accept_wait("200ms"), manager_channel(&inbox)),
    )
    .await;

    let answer = app.post_form_lead(&a_lead("bob@example.com")).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    let contract = answer.json();
    assert_eq!(contract["acceptance"], "pending");
    assert_eq!(contract["server_recorded"], true);
    assert_eq!(contract["manager_notified"], false);
    let id = id_of(&contract);

    wait_until("the status to flip to accepted", WAIT, || async {
        status_of(&app, &id).await["acceptance"] == "accepted"
    })
    .await;
    let status = status_of(&app, &id).await;
    assert_eq!(status["accepted"], true);
    assert_eq!(status["manager_notified"], true);
    assert_eq!(inbox.confirmed_for(&id).len(), 1);
}

async fn a_channel_that_is_down_keeps_the_lead_pending_and_a_replay_delivers_it_once(
    backend: Backend,
) {
    let inbox = TestInbox::start(Reply::status(500));
    let buyer = TestBuyer::start(accept(), accept());
    let config = format!(
        "{}{}",
        manager_channel(&inbox),
        BuyerConfig::new("acme", 1).toml(&buyer.base)
    );
    let app = spawn_app_with(backend, &config).await;
    let lead = a_lead("cat@example.com");

    let first = replay(&app, "form-key-1", &lead).await;
    assert_eq!(first["acceptance"], "pending");
    assert_eq!(first["replayed"], false);
    let id = id_of(&first);
    // Sold while its manager is down: delivery is independent of routing.
    app.wait_for_state(&id, "sold").await;
    wait_until("the channel's first (failed) try", WAIT, || async {
        !inbox.received().is_empty()
    })
    .await;
    let status = status_of(&app, &id).await;
    assert_eq!(status["acceptance"], "pending", "{status}");
    assert_eq!(status["lead_state"], "sold");
    assert_eq!(status["manager_notified"], false);

    // The status page shows the channel failing (once the try's answer is
    // recorded).
    wait_until("the channel to show its failure", WAIT, || async {
        app.send(app.client.get(app.url("/v1/status")), "")
            .await
            .json()["notify"][0]["consecutive_failures"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    })
    .await;
    let status = app
        .send(app.client.get(app.url("/v1/status")), "")
        .await
        .json();
    let channel = &status["notify"][0];
    assert_eq!(channel["id"], "manager");
    assert_eq!(channel["required"], true);
    assert!(
        channel["consecutive_failures"].as_u64().unwrap() >= 1,
        "{channel}"
    );

    inbox.set_reply(Reply::ok());
    let second = replay(&app, "form-key-1", &lead).await;
    assert_eq!(second["replayed"], true);
    assert_eq!(id_of(&second), id);
    wait_until("the replay to deliver", WAIT, || async {
        status_of(&app, &id).await["acceptance"] == "accepted"
    })
    .await;
    let third = replay(&app, "form-key-1", &lead).await;
    assert_eq!(third["acceptance"], "accepted");
    assert_eq!(third["manager_notified"], true);

    // Another lead delivered after the replays: the courier kept working
    // (ticks, plans, claims) and still sent the first lead once.
    let later = id_of(&replay(&app, "form-key-2", &a_lead("dan@example.com")).await);
    wait_confirmed(&app, &later, "manager").await;
    wait_until("the channel to show it is healthy", WAIT, || async {
        let status = app
            .send(app.client.get(app.url("/v1/status")), "")
            .await
            .json();
        status["notify"][0]["consecutive_failures"] == 0
            && status["notify"][0]["last_confirmed_at"].is_string()
    })
    .await;
    assert_eq!(inbox.confirmed_for(&id).len(), 1, "{:?}", inbox.received());
    let view = app.lead(&id).await;
    let tries: Vec<&Value> = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|attempt| attempt["kind"] == "notify")
        .collect();
    assert_eq!(tries.len(), 2, "one failed try, one confirmed: {view}");
    assert_eq!(tries[0]["outcome"], "error");
    assert_eq!(tries[1]["outcome"], "accepted");
}

async fn two_instances_never_notify_one_lead_twice(backend: Backend) {
    // A backlog built while the channel is down, retried every 200 ms by
    // both instances at once: they compete for the same rows.
    let inbox = TestInbox::start(Reply::status(503));
    let config =
        manager_channel(&inbox).replace("retry_backoff = \"1h\"", "retry_backoff = \"200ms\"");
    let first = spawn_app_with(backend, &config).await;
    let second = spawn_instance_of(&first, &config, |_| {}).await;

    let submissions = (0..30).map(|n| {
        let app = if n % 2 == 0 { &first } else { &second };
        async move { app.submit(a_lead(&format!("p{n}@example.com"))).await }
    });
    let ids = futures_util::future::join_all(submissions).await;
    wait_until("every lead to fail once", WAIT, || async {
        let tried: std::collections::HashSet<String> = inbox
            .received()
            .iter()
            .map(|call| {
                call.json()["lead_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        ids.iter().all(|id| tried.contains(id))
    })
    .await;
    inbox.set_reply(Reply::ok().after(Duration::from_millis(50)));
    for id in &ids {
        wait_until(&format!("lead {id} to be accepted"), WAIT, || async {
            status_of(&first, id).await["acceptance"] == "accepted"
        })
        .await;
    }
    // Both couriers have ticked over these leads again by the time a lead
    // submitted later is confirmed on the other instance.
    let later = second.submit(a_lead("later@example.com")).await;
    wait_confirmed(&first, &later, "manager").await;
    for id in &ids {
        assert_eq!(inbox.confirmed_for(id).len(), 1, "lead {id}");
    }
}

async fn a_delivery_given_up_after_a_day_alerts_and_waits_in_the_review_queue(backend: Backend) {
    use entity::delivery;
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

    let inbox = TestInbox::start(Reply::status(500));
    let config =
        manager_channel(&inbox).replace("retry_backoff = \"1h\"", "retry_backoff = \"100ms\"");
    let app = spawn_app_with(backend, &config).await;
    let lead = a_lead("ike@example.com");
    let id = id_of(&replay(&app, "given-up", &lead).await);
    wait_until("a failed try", WAIT, || async {
        !inbox.received().is_empty()
    })
    .await;

    // A day has passed since the delivery was planned: the next failed
    // try is the last.
    let day_ago = chrono::Utc::now() - chrono::Duration::hours(25);
    delivery::Entity::update_many()
        .col_expr(delivery::Column::CreatedAt, Expr::value(day_ago))
        .filter(delivery::Column::LeadId.eq(id.as_str()))
        .exec(app.store.connection())
        .await
        .unwrap();
    wait_until("the delivery to be given up", WAIT, || async {
        app.lead(&id).await["deliveries"][0]["state"] == "abandoned"
    })
    .await;
    let tries = inbox.received().len();
    // The alert is raised right after the row is given up.
    wait_until("the delivery_failed alert", WAIT, || async {
        app.admin_get("/v1/alerts").await.json()["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|alert| alert["kind"] == "delivery_failed" && alert["lead_id"] == id.as_str())
    })
    .await;
    let review = app.admin_get("/v1/review").await.json();
    assert!(
        review["leads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|listed| listed["id"] == id.as_str()),
        "{review}"
    );
    let status = app
        .send(app.client.get(app.url("/v1/status")), "")
        .await
        .json();
    assert_eq!(status["review"]["pending"], 1, "{status}");
    assert_eq!(status_of(&app, &id).await["acceptance"], "pending");

    // Given up means no more tries until an operator acts.
    let later = id_of(&replay(&app, "given-up-later", &a_lead("jon@example.com")).await);
    wait_until("the later lead's first try", WAIT, || async {
        inbox
            .received()
            .iter()
            .any(|call| call.json()["lead_id"] == later.as_str())
    })
    .await;
    let given_up = inbox
        .received()
        .iter()
        .filter(|call| call.json()["lead_id"] == id.as_str())
        .count();
    assert_eq!(given_up, tries, "no try after giving up");

    // An operator retries the try once the channel is back: delivered,
    // and a second retry is refused (never sent again).
    inbox.set_reply(Reply::ok());
    let view = app.lead(&id).await;
    let last_try = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|attempt| attempt["kind"] == "notify")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let retry = |app: &TestApp| {
        app.client
            .post(app.url(&format!("/v1/attempts/{last_try}/retry")))
            .insert_header((
                "Authorization",
                format!("Bearer {}", crate::helpers::ADMIN_TOKEN),
            ))
    };
    let retried = app.send(retry(&app), "").await;
    assert_eq!(retried.status, 202, "{}", retried.text());
    assert_eq!(retried.json()["delivery"], "manager");
    wait_confirmed(&app, &id, "manager").await;
    assert_eq!(status_of(&app, &id).await["acceptance"], "accepted");
    assert_eq!(app.send(retry(&app), "").await.status, 409);
    assert_eq!(inbox.confirmed_for(&id).len(), 1);
}

async fn kill_9_mid_delivery_sends_every_lead_and_none_confirmed_twice(backend: Backend) {
    use crate::process::{Service, ServiceConfig};
    use crate::scratch_db::TestDatabase;
    use entity::delivery;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

    let database = TestDatabase::create(backend).await;
    let inbox = TestInbox::start(Reply::ok().after(Duration::from_millis(200)));
    let config = ServiceConfig::write(&database.url, "2s", &manager_channel(&inbox));
    let mut service = Service::start(&config).await;
    let mut ids = Vec::new();
    for n in 0..12 {
        let answer = service
            .app
            .post_form_lead(&a_lead(&format!("k{n}@example.com")))
            .await;
        assert_eq!(answer.status, 202, "{}", answer.text());
        ids.push(id_of(&answer.json()));
    }
    // What the database says was confirmed.
    let confirmed = |app: &TestApp| {
        let db = app.store.connection().clone();
        async move {
            let rows = delivery::Entity::find()
                .filter(delivery::Column::State.eq("confirmed"))
                .all(&db)
                .await
                .unwrap();
            rows.into_iter()
                .map(|row| row.lead_id)
                .collect::<Vec<String>>()
        }
    };
    // Killed once a first confirmation is recorded (not once some tries
    // arrived: the first four can arrive together, before any answer),
    // while the other deliveries are still to be sent or in flight.
    wait_until("a first confirmation", WAIT, || async {
        !confirmed(&service.app).await.is_empty()
    })
    .await;
    service.kill_9();
    let confirmed_before = confirmed(&service.app).await;
    assert!(!confirmed_before.is_empty() && confirmed_before.len() < ids.len());

    let service = Service::start(&config).await;
    for id in &ids {
        wait_until(
            &format!("lead {id} to be accepted"),
            Duration::from_secs(40),
            || async { status_of(&service.app, id).await["acceptance"] == "accepted" },
        )
        .await;
    }
    for id in &ids {
        let confirmations = inbox.confirmed_for(id).len();
        assert!(confirmations >= 1, "lead {id} never delivered");
        if confirmed_before.contains(id) {
            assert_eq!(confirmations, 1, "lead {id} was confirmed before the crash");
        }
    }
}

/// Event sink `analytics` at `sink` for every lifecycle event.
fn event_sink(sink: &TestInbox) -> String {
    format!(
        "\n[[events]]\nid = \"analytics\"\nurl = \"{}/events\"\non = [\"lead.accepted\", \"lead.sold\", \"lead.unsold\", \"lead.unknown\"]\ntimeout = \"2s\"\n",
        sink.base
    )
}

/// The events the sink got about `lead_id`, by name.
fn events_for(sink: &TestInbox, lead_id: &str) -> Vec<String> {
    sink.confirmed_for(lead_id)
        .iter()
        .map(|call| {
            call.json()["event"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

async fn events_are_sent_once_each_and_never_accepted_for_a_pending_lead(backend: Backend) {
    let manager = TestInbox::start(Reply::status(503));
    let sink = TestInbox::start(Reply::ok());
    let buyer = TestBuyer::start(accept(), accept());
    let config = format!(
        "{}{}{}",
        manager_channel(&manager),
        event_sink(&sink),
        BuyerConfig::new("acme", 1).toml(&buyer.base)
    );
    let app = spawn_app_with(backend, &config).await;
    let lead = a_lead("eve@example.com");
    let id = id_of(&replay(&app, "event-key", &lead).await);

    app.wait_for_state(&id, "sold").await;
    wait_until("lead.sold to be sent", WAIT, || async {
        events_for(&sink, &id).contains(&"lead.sold".to_string())
    })
    .await;
    let sold = sink
        .confirmed_for(&id)
        .into_iter()
        .find(|call| call.json()["event"] == "lead.sold")
        .unwrap();
    assert_eq!(sold.idempotency_key, format!("{id}:lead.sold:event"));
    let body = sold.json();
    assert_eq!(body["buyer_id"], "acme");
    assert_eq!(body["price"], 15.0);
    assert_eq!(body["source"], "website");
    assert_eq!(body["test"], false);
    assert!(body["at"].is_string(), "{body}");
    assert_eq!(status_of(&app, &id).await["acceptance"], "pending");
    assert!(
        !events_for(&sink, &id).contains(&"lead.accepted".to_string()),
        "never lead.accepted for a pending lead: {:?}",
        events_for(&sink, &id)
    );

    manager.set_reply(Reply::ok());
    replay(&app, "event-key", &lead).await;
    wait_until("lead.accepted to be sent", WAIT, || async {
        events_for(&sink, &id).contains(&"lead.accepted".to_string())
    })
    .await;
    // A later lead's events arrive after more ticks over the first lead.
    let later = id_of(&replay(&app, "event-key-2", &a_lead("fay@example.com")).await);
    wait_confirmed(&app, &later, "analytics:lead.sold").await;
    let mut events = events_for(&sink, &id);
    events.sort();
    assert_eq!(events, ["lead.accepted", "lead.sold"], "each once");
    let view = app.lead(&id).await;
    let rows = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|attempt| attempt["kind"] == "event")
        .count();
    assert_eq!(rows, 2, "each event is an attempt row: {view}");
}

async fn unsold_and_unknown_leads_are_announced(backend: Backend) {
    let sink = TestInbox::start(Reply::ok());
    let buyer = TestBuyer::start(accept(), Answer::Reject);
    let buyer_config = BuyerConfig {
        post_timeout: "300ms",
        ..BuyerConfig::new("acme", 1)
    };
    let config = format!("{}{}", event_sink(&sink), buyer_config.toml(&buyer.base));
    let app = spawn_app_with(backend, &config).await;

    let unsold = app.submit(a_lead("gil@example.com")).await;
    app.wait_for_state(&unsold, "unsold").await;
    buyer.set_post(Answer::Hang);
    let unknown = app.submit(a_lead("hal@example.com")).await;
    app.wait_for_state(&unknown, "unknown").await;
    wait_confirmed(&app, &unknown, "analytics:lead.unknown").await;
    wait_confirmed(&app, &unsold, "analytics:lead.unsold").await;
    // No required channel: stored and valid is accepted.
    for (id, last) in [(&unsold, "lead.unsold"), (&unknown, "lead.unknown")] {
        wait_confirmed(&app, id, "analytics:lead.accepted").await;
        let mut events = events_for(&sink, id);
        events.sort();
        assert_eq!(events, ["lead.accepted", last], "lead {id}");
    }
}

async fn slack_telegram_and_email_channels_deliver_readable_messages(backend: Backend) {
    let slack = TestInbox::start(Reply::ok());
    let telegram = TestInbox::start(Reply::ok());
    let smtp = TestSmtp::start().await;
    let config = format!(
        r#"
[[notify]]
id = "slack"
role = "manager"
kind = "slack"
url = "{slack}/services/T000/B000/slack-secret-path"

[[notify]]
id = "telegram"
role = "manager"
kind = "telegram"
url = "{telegram}"
bot_token = "123456:telegram-secret-token"
chat_id = "-1001"

[[notify]]
id = "mail"
role = "crm"
kind = "email"
url = "{smtp}"
from = "leads@example.com"
to = ["sales@example.com"]
"#,
        slack = slack.base,
        telegram = telegram.base,
        smtp = smtp.url,
    );
    let app = spawn_app_with(backend, &config).await;
    let id = app.submit(a_lead("ivy@example.com")).await;
    for channel in ["slack", "telegram", "mail"] {
        wait_confirmed(&app, &id, channel).await;
    }

    let slack_call = &slack.received()[0];
    assert_eq!(slack_call.path, "/services/T000/B000/slack-secret-path");
    let text = slack_call.json()["text"].as_str().unwrap().to_string();
    assert!(text.contains("New lead from website"), "{text}");
    assert!(text.contains("email: ivy@example.com"), "{text}");
    assert!(text.contains(&id), "{text}");

    let telegram_call = &telegram.received()[0];
    assert_eq!(
        telegram_call.path,
        "/bot123456:telegram-secret-token/sendMessage"
    );
    let message = telegram_call.json();
    assert_eq!(message["chat_id"], "-1001");
    assert!(message["text"]
        .as_str()
        .unwrap()
        .contains("email: ivy@example.com"));

    let mails = smtp.mails();
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].from, "<leads@example.com>");
    assert_eq!(mails[0].to, ["<sales@example.com>"]);
    assert!(
        mails[0].data.contains("Subject: New lead from website"),
        "{}",
        mails[0].data
    );
    assert!(
        mails[0].data.contains("ivy@example.com"),
        "{}",
        mails[0].data
    );

    let status = status_of(&app, &id).await;
    assert_eq!(status["manager_notified"], true);
    assert_eq!(status["crm_synced"], true);
    // The attempt views keep no channel secret.
    let view = app.lead(&id).await.to_string();
    assert!(!view.contains("slack-secret-path"), "{view}");
    assert!(!view.contains("telegram-secret-token"), "{view}");
}

/// How many times `inbox` confirmed a request about each lead.
fn confirmations_per_lead(inbox: &TestInbox) -> std::collections::HashMap<String, usize> {
    let mut counts = std::collections::HashMap::new();
    for call in inbox.received() {
        if (200..300).contains(&call.answered) {
            let lead_id = call.json()["lead_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            *counts.entry(lead_id).or_default() += 1;
        }
    }
    counts
}

/// More leads than a page (500) of deliveries planned at once.
const BACKLOG: usize = 520;

/// A (not required) manager channel at `manager` and a sink of
/// `lead.accepted` at `sink`.
fn backlog_config(manager: &TestInbox, sink: &TestInbox) -> String {
    format!(
        "{}\n[[events]]\nid = \"analytics\"\nurl = \"{}/events\"\non = [\"lead.accepted\"]\n",
        manager_channel(manager)
            .replace("required = true", "required = false\nmax_concurrency = 16"),
        sink.base
    )
}

/// `BACKLOG` leads received at `received_at`, all one person sent again and
/// again (a form bot looping): the duplicates are not routed, so nothing
/// after they are stored changes them.
fn one_person_looping(received_at: chrono::DateTime<chrono::Utc>) -> Vec<NewLead> {
    let mut leads = new_leads(BACKLOG, received_at);
    for lead in &mut leads {
        lead.fields["email"] = json!("looping@example.com");
    }
    leads
}

/// Waits until each of `leads` is notified at `manager` and announced at
/// `sink`, then checks each was sent there once.
async fn each_notified_and_announced_once(
    manager: &TestInbox,
    sink: &TestInbox,
    leads: &[NewLead],
) {
    for (inbox, what) in [(manager, "notified"), (sink, "announced")] {
        wait_until(
            &format!("every lead to be {what}"),
            Duration::from_secs(120),
            || async {
                let confirmed = confirmations_per_lead(inbox);
                leads.iter().all(|lead| confirmed.contains_key(&lead.id))
            },
        )
        .await;
        let confirmed = confirmations_per_lead(inbox);
        for lead in leads {
            assert_eq!(confirmed[&lead.id], 1, "lead {} {what} once", lead.id);
        }
    }
}

/// An outage longer than every planning window of the couriers: leads
/// received two days ago, more than a page of them, wait in one spool
/// journal and are drained at once when the app starts. Each is delivered
/// to the manager channel and announced `lead.accepted` exactly once.
async fn leads_drained_after_a_long_outage_are_each_notified_and_announced_once(backend: Backend) {
    use leadrouter::domain::Contract;
    use leadrouter::spool::{Spool, SpooledLead};

    let (manager, sink) = (TestInbox::start(Reply::ok()), TestInbox::start(Reply::ok()));
    let leads = one_person_looping(chrono::Utc::now() - chrono::Duration::days(2));
    let spooled: Vec<SpooledLead> = leads
        .iter()
        .map(|lead| SpooledLead {
            contract: Contract::spooled(lead.id.clone(), Vec::new()),
            lead: lead.clone(),
        })
        .collect();
    let _app = spawn_app_adjusted(backend, &backlog_config(&manager, &sink), |settings| {
        Spool::open(&settings.intake.spool_dir)
            .append(&spooled)
            .unwrap();
    })
    .await;
    each_notified_and_announced_once(&manager, &sink, &leads).await;
}

/// More than a page of leads stored an hour ago and never planned (an
/// instance without these channels stored them): an instance that starts
/// with the channels plans them all, page after page, though they changed
/// long before its plans' overlap.
async fn a_backlog_beyond_one_page_is_planned_page_after_page(backend: Backend) {
    use sea_orm::sea_query::Expr;
    use sea_orm::EntityTrait;

    let (manager, sink) = (TestInbox::start(Reply::ok()), TestInbox::start(Reply::ok()));
    let first = spawn_app_with(backend, "").await;
    let leads = one_person_looping(chrono::Utc::now());
    first
        .store
        .persist_leads(&leads, &test_settings("").duplicate_rule())
        .await
        .unwrap();
    let hour_ago = chrono::Utc::now() - chrono::Duration::hours(1);
    entity::lead::Entity::update_many()
        .col_expr(entity::lead::Column::UpdatedAt, Expr::value(hour_ago))
        .col_expr(entity::lead::Column::AcceptedAt, Expr::value(hour_ago))
        .exec(first.store.connection())
        .await
        .unwrap();
    let _second = spawn_instance_of(&first, &backlog_config(&manager, &sink), |_| {}).await;
    each_notified_and_announced_once(&manager, &sink, &leads).await;
}
