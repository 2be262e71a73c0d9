//! Claims and settles over a backlog (PostgreSQL). A walk's leads are
//! found by key, whatever the planner's statistics say: a claim or a
//! settle reads its own leads' index entries, never those of every lead
//! waiting, so a backlog drains at the same cost per lead however long
//! it is.

use std::time::Duration;

use leadrouter::domain::LeadState;
use leadrouter::store::{FailurePolicy, HeldLead, LeadEnd};
use sea_orm::{ConnectionTrait, Database};

use crate::helpers::{one_value, open_store, stored_leads, wait_until, Backend, TestDatabase};

/// Leads waiting.
const BACKLOG: usize = 3000;
/// Leads claimed (then settled) at a time, as a narrowed router does.
const CLAIM: usize = 20;
const CLAIMS: usize = 5;

#[actix_web::test]
async fn claims_and_settles_by_key_never_read_the_backlogs_state_entries() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let store = open_store(&database.url).await;
    store.migrate().await.unwrap();
    let admin = Database::connect(&database.url).await.unwrap();
    // The statistics of a young table (none), kept so for the test:
    // autovacuum would analyze it within the minute.
    admin
        .execute_unprepared("ALTER TABLE leads SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let leads = stored_leads(&store, BACKLOG).await;
    let policy = FailurePolicy {
        limit: 3,
        backoff: Duration::from_secs(1),
    };
    for chunk in leads.chunks(CLAIM).take(CLAIMS) {
        let claimed = store
            .claim_leads(chunk, "test", Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(claimed.leads.len(), CLAIM);
        let held: Vec<HeldLead> = chunk
            .iter()
            .map(|lead_id| HeldLead {
                lead_id: lead_id.clone(),
                token: claimed.token.clone(),
                end: LeadEnd::State(LeadState::Unsold),
            })
            .collect();
        let (settled, _) = store.settle_leads(&held, policy).await.unwrap();
        assert_eq!(settled, CLAIM as u64);
    }
    // A backend's counters reach the statistics views some time after its
    // statements; its updates and its index reads are reported together.
    let updates = (2 * CLAIM * CLAIMS) as i64;
    wait_until("the claims' statistics", Duration::from_secs(30), || {
        let admin = admin.clone();
        async move {
            one_value::<i64>(
                &admin,
                "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'leads'",
            )
            .await
                >= updates
        }
    })
    .await;
    let state_entries_read: i64 = one_value(
        &admin,
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'leads_state_received_at'",
    )
    .await;
    assert!(
        state_entries_read < BACKLOG as i64,
        "{CLAIMS} claims and settles of {CLAIM} leads read {state_entries_read} entries of the state index ({BACKLOG} leads waiting)"
    );
    crate::helpers::close_stores().await;
}
