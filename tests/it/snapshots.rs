//! Attempts' configurations (SPEC principle 7, "snapshot every attempt"),
//! stored once in `config_snapshots` and named by each attempt: shared by
//! the calls of one configuration, a new one at a reload, never missing
//! for a committed attempt, and kept through the migration that moved
//! them out of the attempt rows.

use entity::{attempt, config_snapshot, lead};
use futures_util::future::join_all;
use migration::{Migrator, MigratorTrait};
use sea_orm::{ColumnTrait, ConnectionTrait, Database, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};

use crate::buyers::{accept, BuyerConfig, TestBuyer};
use crate::helpers::{
    database_url_of, execute, one_value, spawn_app_with, wait_until, write_config, Backend,
    TestApp, TestDatabase,
};
use crate::on_both_databases;

on_both_databases!(
    the_calls_of_one_configuration_share_its_stored_copy_and_a_reload_adds_one,
    no_attempt_is_committed_without_its_configuration,
    stored_attempts_keep_their_configurations_through_the_migration,
);

const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// The post URL the lead's stored post attempt says its buyer had.
async fn post_url_of_snapshot(app: &TestApp, id: &str) -> String {
    let view = app.lead(id).await;
    let post = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|attempt| attempt["kind"] == "post")
        .unwrap_or_else(|| panic!("no post in {view}"));
    post["snapshot"]["post"]["url"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn the_calls_of_one_configuration_share_its_stored_copy_and_a_reload_adds_one(
    backend: Backend,
) {
    let old = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&old.base)).await;
    let emails: Vec<String> = (0..6).map(|n| format!("ann{n}@example.com")).collect();
    let ids = join_all(
        emails
            .iter()
            .map(|email| app.submit(json!({"email": email}))),
    )
    .await;
    for id in &ids {
        app.wait_for_state(id, "sold").await;
    }
    let db = app.store.connection();
    let calls = attempt::Entity::find().all(db).await.unwrap();
    assert_eq!(calls.len(), 12, "a ping and a post per lead");
    assert!(
        calls
            .iter()
            .all(|call| call.snapshot_id == calls[0].snapshot_id),
        "every call of one configuration names the same copy"
    );
    assert_eq!(config_snapshot::Entity::find().count(db).await.unwrap(), 1);
    assert!(post_url_of_snapshot(&app, &ids[0])
        .await
        .starts_with(&old.base));

    let new = TestBuyer::start(accept(), accept());
    write_config(
        app.config_path.as_ref().unwrap(),
        &database_url_of(&app),
        &BuyerConfig::new("acme", 1).toml(&new.base),
    );
    let reloaded = app.admin_send("POST", "/v1/admin/reload", json!({})).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    let after = app.submit(json!({"email": "bob@example.com"})).await;
    app.wait_for_state(&after, "sold").await;

    assert_eq!(config_snapshot::Entity::find().count(db).await.unwrap(), 2);
    assert!(post_url_of_snapshot(&app, &after)
        .await
        .starts_with(&new.base));
    assert!(
        post_url_of_snapshot(&app, &ids[0])
            .await
            .starts_with(&old.base),
        "the attempts made before the reload keep the configuration they used"
    );
}

async fn no_attempt_is_committed_without_its_configuration(backend: Backend) {
    let buyer = TestBuyer::start(accept(), accept());
    let app = spawn_app_with(backend, &BuyerConfig::new("acme", 1).toml(&buyer.base)).await;
    // The first call's row would bring its configuration: that write fails.
    execute(
        &app,
        "ALTER TABLE config_snapshots RENAME TO config_snapshots_moved_away",
    )
    .await;
    let id = app.submit(json!({"email": "ann@example.com"})).await;
    let db = app.store.connection();
    wait_until("routing to fail on our side", SETTLE, || async {
        let row = lead::Entity::find_by_id(id.as_str()).one(db).await.unwrap();
        row.is_some_and(|row| row.route_failures > 0)
    })
    .await;
    let rows = attempt::Entity::find()
        .filter(attempt::Column::LeadId.eq(id.as_str()))
        .count(db)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the attempt went with its configuration");
    assert!(buyer.calls("ping").is_empty(), "no call without its row");

    execute(
        &app,
        "ALTER TABLE config_snapshots_moved_away RENAME TO config_snapshots",
    )
    .await;
    app.wait_for_state(&id, "sold").await;
    let unnamed: i64 = one_value(
        db,
        "SELECT COUNT(*) FROM attempts WHERE NOT EXISTS \
         (SELECT 1 FROM config_snapshots WHERE config_snapshots.id = attempts.snapshot_id)",
    )
    .await;
    assert_eq!(unnamed, 0, "every attempt's configuration is stored");
    assert_eq!(buyer.calls("post").len(), 1);
}

/// Attempts written before the migration, each with its configuration in
/// its row: two calls to one buyer configuration, one to another.
const BEFORE: [(&str, &str); 3] = [
    (
        "a1",
        r#"{"id": "acme", "post": {"url": "http://old.test/post"}}"#,
    ),
    (
        "a2",
        r#"{"id": "acme", "post": {"url": "http://old.test/post"}}"#,
    ),
    (
        "a3",
        r#"{"id": "zen", "post": {"url": "http://zen.test/post"}}"#,
    ),
];

/// The migration before `config_snapshots`.
const WITH_COPIES_IN_ROWS: u32 = 9;

async fn stored_attempts_keep_their_configurations_through_the_migration(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let db = Database::connect(&database.url).await.unwrap();
    Migrator::up(&db, Some(WITH_COPIES_IN_ROWS)).await.unwrap();
    for (id, snapshot) in BEFORE {
        db.execute_unprepared(&format!(
            "INSERT INTO attempts (id, lead_id, buyer_id, kind, outcome, started_at, request, snapshot) \
             VALUES ('{id}', 'lead', 'acme', 'post', 'accepted', '2026-12-01 10:00:00+00:00', '{{}}', '{snapshot}')"
        ))
        .await
        .unwrap();
    }
    Migrator::up(&db, None).await.unwrap();

    let rows = attempt::Entity::find().all(&db).await.unwrap();
    let stored: std::collections::HashMap<String, Value> = config_snapshot::Entity::find()
        .all(&db)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.id, row.snapshot))
        .collect();
    assert_eq!(stored.len(), 2, "one copy per distinct configuration");
    for (id, snapshot) in BEFORE {
        let row = rows.iter().find(|row| row.id == id).unwrap();
        let expected: Value = serde_json::from_str(snapshot).unwrap();
        assert_eq!(stored[&row.snapshot_id], expected, "attempt {id}");
    }

    let after_copies = Migrator::migrations().len() as u32 - WITH_COPIES_IN_ROWS;
    Migrator::down(&db, Some(after_copies)).await.unwrap();
    for (id, snapshot) in BEFORE {
        let kept: String = one_value(
            &db,
            &format!("SELECT CAST(snapshot AS TEXT) FROM attempts WHERE id = '{id}'"),
        )
        .await;
        let expected: Value = serde_json::from_str(snapshot).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&kept).unwrap(),
            expected,
            "attempt {id}"
        );
    }
}
