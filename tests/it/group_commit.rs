//! The attempt writer's group commit: writes queued at the same moment
//! share one transaction, written with one statement per kind of change;
//! each must still get the result its own conditions give (the claim it
//! was made under, the cap it takes, the row still being `in_flight`, the
//! lead's one sale), as if it had been written alone.

use std::time::Duration;

use chrono::Utc;
use entity::{attempt, lead, sale};
use futures_util::future::join_all;
use leadrouter::domain::{AttemptKind, CallOutcome, ClaimToken, ConfigSnapshot, LeadId};
use leadrouter::store::{AttemptEnd, Begun, CapPeriod, CapSlot, SaleOf, Written};
use sea_orm::{
    ColumnTrait, ConnectionTrait, Database, EntityTrait, QueryFilter, Statement, TransactionTrait,
};
use serde_json::json;

use crate::helpers::{open_store, stored_leads, Backend, TestDatabase};
use crate::on_both_databases;

on_both_databases!(writes_sharing_one_commit_each_keep_their_own_conditions);

const LEASE: Duration = Duration::from_secs(60);

async fn writes_sharing_one_commit_each_keep_their_own_conditions(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    let leads = stored_leads(&store, 3).await;
    let claimed = store.claim_leads(&leads, "test", LEASE).await.unwrap();
    assert_eq!(claimed.leads.len(), 3);
    let token = claimed.token;
    let [first, second, third] = [0, 1, 2].map(|n| leads[n].clone());

    // Calls already answered once, whose second answer must not land,
    // and calls in flight, whose answers must.
    let answered = begun(
        store
            .begin_attempt(call(&first, &token, "b1", AttemptKind::PING))
            .await,
    );
    store
        .finish_attempt(&answered, end(CallOutcome::Rejected), Vec::new())
        .await
        .unwrap();
    let in_flight = begun(
        store
            .begin_attempt(call(&first, &token, "b2", AttemptKind::PING))
            .await,
    );
    let waiting_for_a_slot = begun(
        store
            .begin_attempt(call(&first, &token, "b6", AttemptKind::PING))
            .await,
    );
    let posts: Vec<String> = join_all(
        ["b1", "b2"]
            .map(|buyer| store.begin_attempt(call(&second, &token, buyer, AttemptKind::POST))),
    )
    .await
    .into_iter()
    .map(begun)
    .collect();

    // All at once: they reach the writer together.
    let capped_post = |buyer: &str| {
        let mut post = call(&third, &token, buyer, AttemptKind::POST);
        post.caps = vec![CapSlot {
            buyer_id: buyer.into(),
            period: CapPeriod::Hour,
            start: Utc::now(),
            limit: 1,
        }];
        post
    };
    let stale_token = ClaimToken::fresh();
    let (begins, finishes, sells, skips) = futures_util::join!(
        join_all([
            store.begin_attempt(call(&third, &token, "b3", AttemptKind::PING)),
            store.begin_attempt(call(&third, &stale_token, "b4", AttemptKind::PING)),
            store.begin_attempt(capped_post("b5")),
            store.begin_attempt(capped_post("b5")),
        ]),
        join_all([
            store.finish_attempt(&in_flight, end(CallOutcome::Accepted), Vec::new()),
            store.finish_attempt(&answered, end(CallOutcome::Accepted), Vec::new()),
        ]),
        join_all(posts.iter().map(|post| {
            let sale = SaleOf {
                lead_id: second.as_str(),
                buyer_id: "b1",
                price: Some(10.0),
                payout: None,
            };
            store.sell(post, end(CallOutcome::Accepted), sale)
        })),
        join_all([
            store.call_skipped_as_busy(&waiting_for_a_slot, Vec::new()),
            store.call_skipped_as_busy(&answered, Vec::new()),
        ]),
    );

    let begins: Vec<Begun> = begins.into_iter().map(Result::unwrap).collect();
    assert!(matches!(begins[0], Begun::Call(..)), "{:?}", begins[0]);
    assert_eq!(
        begins[1],
        Begun::Fenced,
        "a write under a stale claim is fenced"
    );
    let capped = begins[2..]
        .iter()
        .filter(|begun| **begun == Begun::Capped)
        .count();
    let called = begins[2..]
        .iter()
        .filter(|begun| matches!(begun, Begun::Call(..)))
        .count();
    assert_eq!(
        (called, capped),
        (1, 1),
        "an hourly cap of 1 takes one post of two: {begins:?}"
    );

    let finishes: Vec<Written> = finishes.into_iter().map(Result::unwrap).collect();
    assert_eq!(finishes, [Written::Done, Written::Stale]);
    let db = store.connection();
    let answered_row = attempt::Entity::find_by_id(answered.clone())
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        answered_row.outcome, "rejected",
        "a stale answer does not overwrite the first"
    );
    let in_flight_row = attempt::Entity::find_by_id(in_flight)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(in_flight_row.outcome, "accepted");
    assert_eq!(in_flight_row.http_status, Some(200));

    let skips: Vec<Written> = skips.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        skips,
        [Written::Done, Written::Stale],
        "only a row still in flight becomes a skip"
    );
    let skipped_row = attempt::Entity::find_by_id(waiting_for_a_slot)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (skipped_row.kind.as_str(), skipped_row.outcome.as_str()),
        ("skip", "busy")
    );

    let mut sells: Vec<Written> = sells.into_iter().map(Result::unwrap).collect();
    sells.sort_by_key(|written| format!("{written:?}"));
    assert_eq!(
        sells,
        [Written::AlreadySold, Written::Done],
        "one sale per lead"
    );
    let sales = sale::Entity::find()
        .filter(sale::Column::LeadId.eq(second.as_str()))
        .all(db)
        .await
        .unwrap();
    assert_eq!(sales.len(), 1);
    let sold = lead::Entity::find_by_id(second.to_string())
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((sold.state.as_str(), sold.claim_token), ("sold", None));

    let rows = attempt::Entity::find()
        .filter(attempt::Column::LeadId.eq(third.as_str()))
        .all(db)
        .await
        .unwrap();
    let mut outcomes: Vec<(String, String)> = rows
        .into_iter()
        .map(|row| (row.buyer_id, row.outcome))
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            ("b3".into(), "in_flight".into()),
            ("b5".into(), "capped".into()),
            ("b5".into(), "in_flight".into()),
        ],
        "the fenced write left no row; the capped one is a skip"
    );
}

/// On PostgreSQL a group's check of the claims its new rows are written
/// under locks those leads' rows until its commit: another instance taking
/// a lead over waits for the group (here it runs out of its lock timeout
/// while the group is held up after the check), so a row is never written
/// under a claim that was taken over in between.
#[actix_web::test]
async fn a_groups_claim_check_holds_the_leads_until_its_commit() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    let leads = stored_leads(&store, 1).await;
    let claimed = store.claim_leads(&leads, "test", LEASE).await.unwrap();
    let other = Database::connect(&database.url).await.unwrap();

    // The attempts table is held: the group stops between its check and its insert.
    let holding_table = other.begin().await.unwrap();
    holding_table
        .execute_unprepared("LOCK TABLE attempts IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let group = actix_web::rt::spawn({
        let (store, call) = (
            store.clone(),
            call(&leads[0], &claimed.token, "b1", AttemptKind::PING),
        );
        async move { store.begin_attempt(call).await }
    });
    crate::helpers::wait_until(
        "the group waits at its insert",
        Duration::from_secs(10),
        || {
            let other = other.clone();
            async move {
                let waiting = other
                .query_one_raw(Statement::from_string(
                    other.get_database_backend(),
                    "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND query LIKE 'INSERT INTO \"attempts\"%'",
                ))
                .await
                .unwrap()
                .unwrap();
                waiting.try_get::<i64>("", "n").unwrap() == 1
            }
        },
    )
    .await;

    let takeover = other.begin().await.unwrap();
    takeover
        .execute_unprepared("SET LOCAL lock_timeout = '200ms'")
        .await
        .unwrap();
    let taken = takeover
        .execute_raw(Statement::from_sql_and_values(
            takeover.get_database_backend(),
            "UPDATE leads SET claim_token = 'thief' WHERE id = $1",
            [leads[0].as_str().into()],
        ))
        .await;
    let refused = taken
        .expect_err("the lead's row is locked by the group")
        .to_string();
    assert!(refused.contains("lock timeout"), "{refused}");
    takeover.rollback().await.unwrap();

    holding_table.rollback().await.unwrap();
    begun(group.await.unwrap());
}

fn call(
    lead: &LeadId,
    token: &ClaimToken,
    buyer: &str,
    kind: AttemptKind,
) -> leadrouter::store::NewAttempt {
    leadrouter::store::NewAttempt {
        lead_id: lead.clone(),
        buyer_id: buyer.into(),
        kind,
        request: json!({}),
        snapshot: ConfigSnapshot::of(json!({})),
        retry_of: None,
        instance_id: "test".into(),
        claim_token: token.clone(),
        caps: Vec::new(),
        answered: None,
    }
}

fn end(outcome: CallOutcome) -> AttemptEnd {
    AttemptEnd {
        outcome,
        reason: None,
        http_status: Some(200),
        duration: Duration::from_millis(5),
        response_body: Some("{}".into()),
        bid: None,
        ping_id: None,
    }
}

fn begun(begun: Result<Begun, sea_orm::DbErr>) -> String {
    match begun.unwrap() {
        Begun::Call(id, _) => id,
        other => panic!("expected a call, got {other:?}"),
    }
}

/// On PostgreSQL, each page of `attempts` keeps room for the answers of
/// the rows written on it, so that an answer is a heap-only update that
/// writes no index entry.
#[actix_web::test]
async fn attempt_pages_keep_room_for_their_answers() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    let options = store
        .connection()
        .query_one_raw(Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT array_to_string(reloptions, ',') AS options FROM pg_class \
             WHERE relname = 'attempts'",
        ))
        .await
        .unwrap()
        .expect("the attempts table");
    let options: Option<String> = options.try_get("", "options").unwrap();
    assert_eq!(options.as_deref(), Some("fillfactor=70"));
}
