//! Claims and settles over a backlog (PostgreSQL). A walk's leads are
//! found by key, whatever the planner's statistics say: a claim or a
//! settle reads its own leads' index entries, never those of every lead
//! waiting, so a backlog drains at the same cost per lead however long
//! it is. A takeover of a lead whose lease ran out sees every row its
//! previous owner committed before the lead was taken (`takeover`).

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

/// A claim's statement on PostgreSQL reads the database as it was when
/// the statement began: a takeover claim of a lead whose lease ran out is
/// held (a test trigger, once the claim's snapshot is taken and before it
/// locks a row) while the previous owner's last commit lands. The claim
/// must still see everything that commit made.
mod takeover {
    use std::time::Duration;

    use chrono::Utc;
    use leadrouter::domain::{
        AttemptKind, CallOutcome, ClaimToken, ConfigSnapshot, LeadId, LeadState,
    };
    use leadrouter::store::{AttemptEnd, Begun, Claimed, NewAttempt, SaleOf, Store, Written};
    use sea_orm::{
        ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, TransactionTrait,
    };
    use serde_json::json;

    use crate::helpers::{one_value, open_store, stored_leads, wait_until, Backend, TestDatabase};

    /// The advisory locks the test triggers wait on: new attempt rows, and
    /// claims (statements that skip locked rows).
    const ATTEMPT_ROWS: i64 = 1;
    const CLAIMS: i64 = 2;

    /// Short, so that it runs out while the previous owner's commit waits.
    const FIRST_LEASE: Duration = Duration::from_secs(2);

    #[actix_web::test]
    async fn an_in_flight_post_committed_during_the_claim_is_in_the_claimed_history() {
        let scene = Scene::set().await;
        let (lead, first) = scene.first_claim().await;
        // The first owner's post row: its claim holds when it is checked,
        // and its commit waits until after the takeover's snapshot.
        let writes = scene.hold(ATTEMPT_ROWS).await;
        let post = {
            let store = scene.store.clone();
            let post = post_of(&lead, &first.token);
            actix_web::rt::spawn(async move { store.begin_attempt(post).await })
        };
        scene.wait_for_waiter(ATTEMPT_ROWS).await;
        wait_for_lease_end(&first).await;
        let claims = scene.hold(CLAIMS).await;
        let takeover = scene.takeover(&lead);
        scene.wait_for_waiter(CLAIMS).await;
        writes.commit().await.unwrap();
        let Begun::Call(post_id, _) = post.await.unwrap().unwrap() else {
            panic!("the first owner's post was written while its claim held");
        };
        claims.commit().await.unwrap();

        let claimed = takeover.await.unwrap().unwrap();
        assert_eq!(
            claimed.leads.len(),
            1,
            "the lease ran out: the lead is taken over"
        );
        let history: Vec<&str> = claimed.leads[0]
            .history
            .iter()
            .map(|a| a.id.as_str())
            .collect();
        assert_eq!(
            history,
            [post_id.as_str()],
            "the post committed before the lead was taken is in its history (so the walk \
             settles it as interrupted, lead unknown, and never posts it again)"
        );
        crate::helpers::close_stores().await;
    }

    #[actix_web::test]
    async fn an_accepted_post_committed_during_the_claim_stops_the_takeover() {
        let scene = Scene::set().await;
        let (lead, first) = scene.first_claim().await;
        let Begun::Call(post_id, _) = scene
            .store
            .begin_attempt(post_of(&lead, &first.token))
            .await
            .unwrap()
        else {
            panic!("the first owner's post was written while its claim held");
        };
        wait_for_lease_end(&first).await;
        let claims = scene.hold(CLAIMS).await;
        let takeover = scene.takeover(&lead);
        scene.wait_for_waiter(CLAIMS).await;
        // The buyer accepted: the sale commits while the takeover is held.
        let sale = SaleOf {
            lead_id: lead.as_str(),
            buyer_id: "acme",
            price: Some(10.0),
            payout: None,
        };
        let sold = scene.store.sell(&post_id, accepted(), sale).await.unwrap();
        assert_eq!(sold, Written::Done);
        claims.commit().await.unwrap();

        let claimed = takeover.await.unwrap().unwrap();
        assert!(
            claimed.leads.is_empty(),
            "a lead sold before it was locked is not taken over"
        );
        let state: String = one_value(
            &scene.admin,
            &format!("SELECT state FROM leads WHERE id = '{lead}'"),
        )
        .await;
        assert_eq!(state, LeadState::Sold.as_str());
        let sales: i64 = one_value(&scene.admin, "SELECT COUNT(*) FROM sales").await;
        assert_eq!(sales, 1);
        crate::helpers::close_stores().await;
    }

    struct Scene {
        _database: TestDatabase,
        url: String,
        store: Store,
        admin: DatabaseConnection,
    }

    impl Scene {
        /// A store on PostgreSQL whose new attempt rows wait while the
        /// test holds `ATTEMPT_ROWS`, and whose claims (once their
        /// statement's snapshot is taken) while it holds `CLAIMS`.
        async fn set() -> Self {
            let database = TestDatabase::create(Backend::Postgres).await;
            let store = open_store(&database.url).await;
            store.migrate().await.unwrap();
            let admin = Database::connect(&database.url).await.unwrap();
            admin
                .execute_unprepared(&format!(
                    r#"
CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'attempts' OR current_query() LIKE '%SKIP LOCKED%' THEN
        PERFORM pg_advisory_xact_lock_shared(TG_ARGV[0]::bigint);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER test_hold_attempt_rows BEFORE INSERT ON attempts
    FOR EACH STATEMENT EXECUTE FUNCTION test_hold('{ATTEMPT_ROWS}');
CREATE TRIGGER test_hold_claims BEFORE UPDATE ON leads
    FOR EACH STATEMENT EXECUTE FUNCTION test_hold('{CLAIMS}');
"#
                ))
                .await
                .unwrap();
            Self {
                url: database.url.clone(),
                _database: database,
                store,
                admin,
            }
        }

        /// One lead, claimed by the first owner under a short lease.
        async fn first_claim(&self) -> (LeadId, Claimed) {
            let lead = stored_leads(&self.store, 1).await.remove(0);
            let claimed = self
                .store
                .claim_leads(std::slice::from_ref(&lead), "first", FIRST_LEASE)
                .await
                .unwrap();
            assert_eq!(claimed.leads.len(), 1);
            (lead, claimed)
        }

        /// Holds the advisory lock `key` until the transaction ends.
        async fn hold(&self, key: i64) -> DatabaseTransaction {
            let connection = Database::connect(&self.url).await.unwrap();
            let hold = connection.begin().await.unwrap();
            hold.execute_unprepared(&format!("SELECT pg_advisory_xact_lock({key})"))
                .await
                .unwrap();
            hold
        }

        /// Waits until a statement waits for the advisory lock `key`.
        async fn wait_for_waiter(&self, key: i64) {
            let query = format!(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND objid = {key} AND NOT granted"
            );
            wait_until(
                "a statement held by the test",
                Duration::from_secs(20),
                || {
                    let (admin, query) = (self.admin.clone(), query.clone());
                    async move { one_value::<i64>(&admin, &query).await > 0 }
                },
            )
            .await;
        }

        /// The second owner's claim of the lead, under way.
        fn takeover(
            &self,
            lead: &LeadId,
        ) -> actix_web::rt::task::JoinHandle<Result<Claimed, sea_orm::DbErr>> {
            let (store, lead) = (self.store.clone(), lead.clone());
            actix_web::rt::spawn(async move {
                store
                    .claim_leads(&[lead], "second", Duration::from_secs(60))
                    .await
            })
        }
    }

    /// Waits until the first owner's lease has run out.
    async fn wait_for_lease_end(first: &Claimed) {
        let until = first.leads[0]
            .row
            .lease_until
            .expect("a claimed lead has a lease");
        wait_until("the lease to run out", FIRST_LEASE * 5, || async {
            Utc::now() > until
        })
        .await;
    }

    fn post_of(lead: &LeadId, token: &ClaimToken) -> NewAttempt {
        NewAttempt {
            lead_id: lead.clone(),
            buyer_id: "acme".into(),
            kind: AttemptKind::POST,
            request: json!({}),
            snapshot: ConfigSnapshot::of(json!({})),
            retry_of: None,
            instance_id: "first".into(),
            claim_token: token.clone(),
            caps: Vec::new(),
            answered: None,
        }
    }

    fn accepted() -> AttemptEnd {
        AttemptEnd {
            outcome: CallOutcome::Accepted,
            reason: None,
            http_status: Some(200),
            duration: Duration::from_millis(5),
            response_body: Some("{}".into()),
            bid: None,
            ping_id: None,
        }
    }
}
