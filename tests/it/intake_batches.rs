//! Intake's batch write (on PostgreSQL one statement for a batch's log
//! rows, leads and person keys): a batch mixing a replay, same-person
//! duplicates of a stored lead and of each other, and new people is
//! answered and stored as if each lead had been written alone. On
//! PostgreSQL a second batch is written beside a first only once enough
//! leads wait to fill it.

use std::collections::HashMap;
use std::time::Duration;

use entity::{intake_log, person_key};
use futures_util::future::join_all;
use leadrouter::config::DuplicateRule;
use leadrouter::store::{NewLead, PersistOutcome};
use sea_orm::EntityTrait;
use serde_json::json;

use crate::helpers::{
    database_url_of, hold_the_leads_table, one_value, open_store, spawn_app, wait_for_pending,
    wait_until, Backend, TestDatabase,
};
use crate::on_both_databases;

on_both_databases!(
    a_mixed_batch_is_answered_and_stored_as_if_each_lead_came_alone,
    a_lead_written_again_after_its_commit_answer_was_lost_is_that_lead,
);

/// Leads that must wait before a second batch starts (the intake actor's
/// `SECOND_BATCH_FROM`).
const SECOND_BATCH_FROM: usize = 16;

async fn a_mixed_batch_is_answered_and_stored_as_if_each_lead_came_alone(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    let rule = email_rule();
    let stored = lead("k-stored", "ann@example.com");
    let first = store
        .log_and_persist_leads(std::slice::from_ref(&stored), &rule)
        .await
        .unwrap();
    assert!(matches!(&first[0], PersistOutcome::Inserted(row) if row.state == "received"));

    let batch = [
        // A replay of the stored lead's key, with a new person's e-mail:
        // it is the stored lead, and claims nothing.
        lead("k-stored", "bob@example.com"),
        // Bob's first lead: the replay above never counts as his.
        lead("k-bob", "bob@example.com"),
        // Ann again: a duplicate of the lead stored before.
        lead("k-ann-again", "ann@example.com"),
        // Cy, twice in the batch: the second duplicates the first.
        lead("k-cy", "cy@example.com"),
        lead("k-cy-again", "cy@example.com"),
    ];
    let outcomes = store.log_and_persist_leads(&batch, &rule).await.unwrap();
    let answered: Vec<(&str, &str, Option<&str>)> = outcomes
        .iter()
        .map(|outcome| match outcome {
            PersistOutcome::Inserted(row) => {
                ("inserted", row.state.as_str(), row.duplicate_of.as_deref())
            }
            PersistOutcome::Existing(row) => ("existing", row.id.as_str(), None),
        })
        .collect();
    assert_eq!(
        answered,
        [
            ("existing", stored.id.as_str(), None),
            ("inserted", "received", None),
            ("inserted", "duplicate", Some(stored.id.as_str())),
            ("inserted", "received", None),
            ("inserted", "duplicate", Some(batch[3].id.as_str())),
        ]
    );

    let owners: HashMap<String, String> = person_key::Entity::find()
        .all(store.connection())
        .await
        .unwrap()
        .into_iter()
        .map(|key| (key.value, key.lead_id))
        .collect();
    assert_eq!(
        owners,
        HashMap::from([
            ("ann@example.com".to_string(), stored.id.clone()),
            ("bob@example.com".to_string(), batch[1].id.clone()),
            ("cy@example.com".to_string(), batch[3].id.clone()),
        ]),
        "each person's value is owned by their routable lead, none by a replay's unstored id"
    );
    let mut logged: Vec<String> = intake_log::Entity::find()
        .all(store.connection())
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.lead_id)
        .collect();
    logged.sort();
    let mut submitted: Vec<String> = std::iter::once(&stored)
        .chain(&batch)
        .map(|lead| lead.id.clone())
        .collect();
    submitted.sort();
    assert_eq!(logged, submitted, "every submission has its intake log row");
}

/// Same-person matching on the e-mail within an hour.
fn email_rule() -> DuplicateRule {
    DuplicateRule {
        window: Duration::from_secs(3600),
        keys: vec!["email".into()],
    }
}

/// A keyed lead as intake builds it: its id derived from its key.
fn lead(key: &str, email: &str) -> NewLead {
    let fields = json!({"email": email});
    NewLead {
        id: leadrouter::domain::keyed_lead_id("website", key),
        source_id: "website".into(),
        idempotency_key: Some(key.into()),
        external_id: None,
        raw: serde_json::to_vec(&fields).unwrap(),
        raw_content_type: "application/json".into(),
        remote_ip: None,
        fields: fields.as_object().unwrap().clone(),
        attribution: serde_json::Map::new(),
        is_test: false,
        errors: Vec::new(),
        received_at: chrono::Utc::now(),
        accept_on_store: true,
    }
}

/// A commit whose answer was lost (the connection cut during `COMMIT`)
/// stored its leads; intake then writes the same leads again, from the
/// spool or lead by lead. Each is answered as the lead it is, keyless or
/// keyed, through both writes, and none is stored twice or refused (a
/// keyless lead's id taken by itself was a unique violation: `failed`).
async fn a_lead_written_again_after_its_commit_answer_was_lost_is_that_lead(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    let rule = email_rule();
    let keyless = NewLead {
        id: leadrouter::domain::new_id(),
        idempotency_key: None,
        ..lead("unused", "keyless@example.com")
    };
    let keyed = lead("k-keyed", "keyed@example.com");
    // Another keyless lead of the source, stored first: a lead is never
    // taken for another that merely shares its lack of a key.
    let earlier = NewLead {
        id: leadrouter::domain::new_id(),
        idempotency_key: None,
        ..lead("unused", "earlier@example.com")
    };
    store
        .log_and_persist_leads(&[earlier], &rule)
        .await
        .unwrap();
    let batch = [keyless, keyed];
    let first = store.log_and_persist_leads(&batch, &rule).await.unwrap();
    assert!(first
        .iter()
        .all(|outcome| matches!(outcome, PersistOutcome::Inserted(_))));
    let again = store.log_and_persist_leads(&batch, &rule).await.unwrap();
    for lead in &batch {
        let one_by_one = store
            .persist_leads(std::slice::from_ref(lead), &rule)
            .await
            .unwrap();
        for outcome in again.iter().chain(&one_by_one) {
            if let PersistOutcome::Existing(row) = outcome {
                assert_eq!(row.state, "received", "never a duplicate of itself");
            } else {
                panic!("written again, {} was stored anew: {outcome:?}", lead.id);
            }
        }
    }
    let ids: Vec<&str> = again
        .iter()
        .map(|outcome| match outcome {
            PersistOutcome::Existing(row) | PersistOutcome::Inserted(row) => row.id.as_str(),
        })
        .collect();
    assert_eq!(ids, [batch[0].id.as_str(), batch[1].id.as_str()]);
    let leads: i64 = one_value(store.connection(), "SELECT COUNT(*) FROM leads").await;
    assert_eq!(leads, 3);
}

/// PostgreSQL: while intake's batch waits for the database (another
/// connection holds the leads table), fewer than 16 leads waiting start no
/// second batch; 16 or more do, and never a third; once the table is free
/// every lead is accepted.
#[actix_web::test]
async fn a_second_batch_starts_beside_a_waiting_one_once_sixteen_leads_wait() {
    let app = spawn_app(Backend::Postgres).await;
    let hold = hold_the_leads_table(&app, Backend::Postgres).await;
    // Another connection: a transaction sees one snapshot of pg_stat_activity.
    let observer = sea_orm::Database::connect(database_url_of(&app).as_str())
        .await
        .unwrap();
    let batches_waiting = || {
        one_value::<i64>(
            &observer,
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE 'WITH \"logged\"%'",
        )
    };
    let post = |n: usize| {
        app.post_feed_lead_owned(
            json!({"email": format!("p{n}@example.com"), "lead_id": format!("p{n}")}),
        )
    };
    let first = post(0);
    let short_of_a_batch = async {
        wait_until(
            "the first batch waiting",
            Duration::from_secs(20),
            || async { batches_waiting().await == 1 },
        )
        .await;
        join_all((1..SECOND_BATCH_FROM).map(post)).await
    };
    let enough_for_a_batch = async {
        wait_for_pending(&app, SECOND_BATCH_FROM).await;
        assert_eq!(
            batches_waiting().await,
            1,
            "15 leads waiting start no batch"
        );
        join_all((SECOND_BATCH_FROM..3 * SECOND_BATCH_FROM).map(post)).await
    };
    let release = async {
        wait_until(
            "the second batch waiting",
            Duration::from_secs(20),
            || async { batches_waiting().await == 2 },
        )
        .await;
        wait_for_pending(&app, 3 * SECOND_BATCH_FROM).await;
        assert_eq!(batches_waiting().await, 2, "never a third batch");
        hold.rollback().await.unwrap();
    };
    let (first, short, enough, ()) =
        futures_util::join!(first, short_of_a_batch, enough_for_a_batch, release);
    for answer in std::iter::once(&first).chain(&short).chain(&enough) {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["acceptance"], "accepted");
    }
}
