//! Lead rows: the intake log, the group-commit insert with database-enforced
//! dedupe, same-person matching, and the reads behind the lead endpoints.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use entity::{attempt, intake_log, lead, lead_alias, sale};
use sea_orm::sea_query::{Expr, Query, UnionType};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DatabaseTransaction, DbBackend,
    DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};
use serde_json::{Map, Value};

use super::handle::Store;
use super::lead_insert::new_leads;
use super::{batch_statement, person};
use crate::config::DuplicateRule;
use crate::domain::{Contract, FieldError, LeadState};

/// A lead as intake built it, before the database has seen it (and as the
/// spool keeps it while the database is unreachable).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NewLead {
    pub id: String,
    pub source_id: String,
    pub idempotency_key: Option<String>,
    pub external_id: Option<String>,
    #[serde(with = "crate::domain::base64_bytes")]
    pub raw: Vec<u8>,
    pub raw_content_type: String,
    pub remote_ip: Option<String>,
    pub fields: Map<String, Value>,
    pub attribution: Map<String, Value>,
    pub is_test: bool,
    pub errors: Vec<FieldError>,
    pub received_at: DateTime<Utc>,
    /// No notify channel was required when it arrived: a valid lead is
    /// `accepted` as soon as it is stored.
    #[serde(default)]
    pub accept_on_store: bool,
}

/// What the database made of one submitted lead.
#[derive(Debug, Clone)]
pub enum PersistOutcome {
    /// A new row.
    Inserted(lead::Model),
    /// The (source, idempotency key) pair already existed: this is that lead.
    Existing(lead::Model),
}

/// Filters of `GET /v1/leads` and the review queue.
#[derive(Debug, Clone, Default)]
pub struct LeadFilter {
    pub states: Vec<LeadState>,
    /// Leads set aside after routing failures too (the review queue).
    pub set_aside: bool,
    /// Leads with a delivery given up after a day of tries too (the
    /// review queue).
    pub undelivered: bool,
    pub source: Option<String>,
    pub limit: u64,
    /// The last id of the previous page.
    pub cursor: Option<String>,
    pub oldest_first: bool,
}

#[derive(Debug, Clone, Default)]
pub struct LeadPage {
    pub leads: Vec<lead::Model>,
    pub next_cursor: Option<String>,
}

impl Store {
    /// Writes the "arrived" records of a batch, before any lead row.
    pub async fn log_arrivals(&self, leads: &[NewLead]) -> Result<(), DbErr> {
        let _first = self.intake_first.writing();
        let txn = self.intake.begin().await?;
        insert_arrivals(&txn, leads).await?;
        txn.commit().await
    }

    /// Inserts a batch of leads in one transaction (group commit), with a
    /// few statements per batch rather than a few per lead. A key already
    /// taken is detected by the unique index (`ON CONFLICT DO NOTHING`),
    /// never by a prior read.
    pub async fn persist_leads(
        &self,
        leads: &[NewLead],
        rule: &DuplicateRule,
    ) -> Result<Vec<PersistOutcome>, DbErr> {
        let _first = self.intake_first.writing();
        let txn = self.intake.begin().await?;
        let rows = self.lead_rows(&txn, leads).await?;
        let written = insert_leads(&txn, rows, rule).await?;
        txn.commit().await?;
        Ok(written.outcomes())
    }

    /// Intake's write: a batch's intake log rows and its leads in one
    /// transaction, so the log is committed with its leads (never after
    /// them, principle 3) at the cost of one commit instead of two. If it
    /// fails, nothing of it is kept, and the caller writes lead by lead with
    /// the log first.
    pub async fn log_and_persist_leads(
        &self,
        leads: &[NewLead],
        rule: &DuplicateRule,
    ) -> Result<Vec<PersistOutcome>, DbErr> {
        let _first = self.intake_first.writing();
        let txn = self.intake.begin().await?;
        let rows = self.lead_rows(&txn, leads).await?;
        let written = if txn.get_database_backend() == DbBackend::Postgres {
            log_and_insert_leads(&txn, leads, rows, rule).await?
        } else {
            insert_arrivals(&txn, leads).await?;
            insert_leads(&txn, rows, rule).await?
        };
        txn.commit().await?;
        Ok(written.outcomes())
    }

    /// The rows intake writes for `leads`, stored now: a key of a lead
    /// stored before ids were derived takes that lead's id.
    async fn lead_rows(
        &self,
        txn: &DatabaseTransaction,
        leads: &[NewLead],
    ) -> Result<Vec<lead::Model>, DbErr> {
        let stored_at = Utc::now();
        let mut rows: Vec<lead::Model> = leads.iter().map(|new| lead_row(new, stored_at)).collect();
        self.earlier_keys.adopt_ids(txn, &mut rows).await?;
        Ok(rows)
    }

    pub async fn find_lead(&self, id: &str) -> Result<Option<lead::Model>, DbErr> {
        if let Some(row) = lead::Entity::find_by_id(id.to_string())
            .one(&self.db)
            .await?
        {
            return Ok(Some(row));
        }
        // An id given for a spooled replay of a stored key names that lead.
        let Some(alias) = lead_alias::Entity::find_by_id(id.to_string())
            .one(&self.db)
            .await?
        else {
            return Ok(None);
        };
        lead::Entity::find_by_id(alias.lead_id).one(&self.db).await
    }

    /// Records that each (alias, lead): the id a spooled lead was given
    /// names the stored lead its key belongs to.
    pub async fn record_aliases(&self, pairs: &[(String, String)]) -> Result<(), DbErr> {
        if pairs.is_empty() {
            return Ok(());
        }
        let now = Utc::now();
        let rows = pairs
            .iter()
            .map(|(alias, lead_id)| lead_alias::ActiveModel {
                alias_id: Set(alias.clone()),
                lead_id: Set(lead_id.clone()),
                created_at: Set(now),
            });
        lead_alias::Entity::insert_many(rows)
            .on_conflict(
                sea_orm::sea_query::OnConflict::column(lead_alias::Column::AliasId)
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(&self.intake)
            .await?;
        Ok(())
    }

    /// Attempts of a lead in the order they were made.
    pub async fn attempts_of(&self, lead_id: &str) -> Result<Vec<attempt::Model>, DbErr> {
        attempt::Entity::find()
            .filter(attempt::Column::LeadId.eq(lead_id))
            .order_by_asc(attempt::Column::StartedAt)
            .order_by_asc(attempt::Column::Id)
            .all(&self.db)
            .await
    }

    /// The attempts of each of these leads, each lead's in the order they
    /// were made (a lead without any has no entry), read on routing's own
    /// connections: every claim reads them, and busy readers must not stall it.
    pub async fn attempts_of_leads(
        &self,
        lead_ids: &[&str],
    ) -> Result<HashMap<String, Vec<attempt::Model>>, DbErr> {
        let mut histories: HashMap<String, Vec<attempt::Model>> = HashMap::new();
        for chunk in lead_ids.chunks(500) {
            let attempts = attempt::Entity::find()
                .filter(attempt::Column::LeadId.is_in(chunk.iter().copied()))
                .order_by_asc(attempt::Column::StartedAt)
                .order_by_asc(attempt::Column::Id)
                .all(&self.routing)
                .await?;
            for attempt in attempts {
                histories
                    .entry(attempt.lead_id.clone())
                    .or_default()
                    .push(attempt);
            }
        }
        Ok(histories)
    }

    /// One page of leads by arrival (then id); the cursor is the id of the
    /// last lead of the page before. (A keyed lead's id is derived from its
    /// key, so ids alone do not sort by arrival.)
    pub async fn list_leads(&self, filter: &LeadFilter) -> Result<LeadPage, DbErr> {
        let mut query = lead::Entity::find();
        if !filter.states.is_empty() {
            let mut wanted = Condition::any()
                .add(lead::Column::State.is_in(filter.states.iter().map(|s| s.as_str())));
            if filter.set_aside {
                wanted = wanted.add(lead::Column::SetAsideReason.is_not_null());
            }
            if filter.undelivered {
                wanted = wanted.add(lead::Column::Id.in_subquery(abandoned_deliveries()));
            }
            query = query.filter(wanted);
        }
        if let Some(source) = &filter.source {
            query = query.filter(lead::Column::SourceId.eq(source.as_str()));
        }
        if let Some(cursor) = &filter.cursor {
            let Some(at) = lead::Entity::find_by_id(cursor.clone())
                .select_only()
                .column(lead::Column::ReceivedAt)
                .into_tuple::<DateTime<Utc>>()
                .one(&self.db)
                .await?
            else {
                return Ok(LeadPage::default());
            };
            query = query.filter(past_the_cursor(at, cursor, filter.oldest_first));
        }
        let order = if filter.oldest_first {
            sea_orm::Order::Asc
        } else {
            sea_orm::Order::Desc
        };
        query = query
            .order_by(lead::Column::ReceivedAt, order.clone())
            .order_by(lead::Column::Id, order);
        let mut leads = query.limit(filter.limit + 1).all(&self.db).await?;
        let next_cursor = if leads.len() as u64 > filter.limit {
            leads.truncate(filter.limit as usize);
            leads.last().map(|lead| lead.id.clone())
        } else {
            None
        };
        Ok(LeadPage { leads, next_cursor })
    }
}

/// The leads after the cursor's (arrival time `at`, id `cursor`) in the
/// page order: later ones when `oldest_first`, else earlier ones.
fn past_the_cursor(at: DateTime<Utc>, cursor: &str, oldest_first: bool) -> Condition {
    let (time, id) = if oldest_first {
        (lead::Column::ReceivedAt.gt(at), lead::Column::Id.gt(cursor))
    } else {
        (lead::Column::ReceivedAt.lt(at), lead::Column::Id.lt(cursor))
    };
    Condition::any().add(time).add(
        Condition::all()
            .add(lead::Column::ReceivedAt.eq(at))
            .add(id),
    )
}

/// The intake log rows of a batch, in `txn`.
async fn insert_arrivals(txn: &DatabaseTransaction, leads: &[NewLead]) -> Result<(), DbErr> {
    for chunk in small_statements(leads, |lead| lead.raw.len()) {
        intake_log::Entity::insert_many(chunk.iter().map(log_row))
            .exec_without_returning(txn)
            .await?;
    }
    Ok(())
}

/// The intake log row of a lead: what arrived, as it arrived.
fn log_row(lead: &NewLead) -> intake_log::ActiveModel {
    intake_log::ActiveModel {
        id: Set(crate::domain::new_id()),
        lead_id: Set(lead.id.clone()),
        source_id: Set(Some(lead.source_id.clone())),
        content_type: Set(lead.raw_content_type.clone()),
        remote_ip: Set(lead.remote_ip.clone()),
        idempotency_key: Set(lead.idempotency_key.clone()),
        body: Set(lead.raw.clone()),
        received_at: Set(lead.received_at),
    }
}

/// A batch's leads as inserted in a transaction not yet committed.
struct InsertedLeads {
    outcomes: Vec<PersistOutcome>,
    /// Fresh leads that proved same-person duplicates, with their originals.
    originals: HashMap<String, String>,
}

impl InsertedLeads {
    /// The outcomes once committed, duplicates shown as such.
    fn outcomes(mut self) -> Vec<PersistOutcome> {
        for outcome in &mut self.outcomes {
            if let PersistOutcome::Inserted(row) = outcome {
                if let Some(original) = self.originals.get(&row.id) {
                    row.state = LeadState::Duplicate.as_str().into();
                    row.duplicate_of = Some(original.clone());
                }
            }
        }
        self.outcomes
    }
}

/// Inserts a batch's leads in `txn`: keys taken already answer the lead
/// they belong to, and same-person duplicates are marked.
async fn insert_leads(
    txn: &DatabaseTransaction,
    rows: Vec<lead::Model>,
    rule: &DuplicateRule,
) -> Result<InsertedLeads, DbErr> {
    let mut stored = HashSet::with_capacity(rows.len());
    for chunk in small_statements(&rows, |row| row.raw.len() * 2) {
        let insert = txn.get_database_backend().build(&new_leads(chunk));
        for row in txn.query_all_raw(insert).await? {
            stored.insert(row.try_get::<String>("", "id")?);
        }
    }
    settle_leads(txn, rows, stored, rule).await
}

/// PostgreSQL: each run of a batch's intake log rows, its leads and the
/// values its stored leads claim go in one statement (`batch_statement`),
/// three round trips per batch instead of five. What that statement could
/// not take (a key or a value owned already) is settled as `insert_leads`
/// settles it, in the same transaction.
async fn log_and_insert_leads(
    txn: &DatabaseTransaction,
    leads: &[NewLead],
    rows: Vec<lead::Model>,
    rule: &DuplicateRule,
) -> Result<InsertedLeads, DbErr> {
    // A key sent twice in the batch derives one id: its first row alone
    // may be stored, and claim the person's values.
    let mut ids = HashSet::with_capacity(rows.len());
    let fresh: Vec<&lead::Model> = rows
        .iter()
        .filter(|row| ids.insert(row.id.as_str()))
        .collect();
    let plan = person::Plan::of(&fresh, rule);
    let wanted = plan.wanted();
    let mut taken = batch_statement::Taken::default();
    let mut start = 0;
    // Each run's log body, raw body and fields.
    for run in small_statements(leads, |lead| lead.raw.len() * 3) {
        let run_rows = &rows[start..start + run.len()];
        start += run.len();
        let ids: HashSet<&str> = run_rows.iter().map(|row| row.id.as_str()).collect();
        let keys: Vec<_> = wanted
            .iter()
            .filter(|(_, row)| ids.contains(row.id.as_str()))
            .copied()
            .collect();
        taken +=
            batch_statement::log_store_and_claim(txn, run.iter().map(log_row), run_rows, &keys)
                .await?;
    }
    if taken.leads.len() != rows.len() || taken.keys != wanted.len() {
        return settle_leads(txn, rows, taken.leads, rule).await;
    }
    let originals = person::mark_planned_duplicates(txn, plan).await?;
    Ok(InsertedLeads {
        outcomes: rows.into_iter().map(PersistOutcome::Inserted).collect(),
        originals,
    })
}

/// After the batch's `rows` whose ids are in `stored` were inserted in
/// `txn`: keys taken already (before, or by an earlier row of the batch)
/// answer the lead they belong to, and same-person duplicates are marked.
async fn settle_leads(
    txn: &DatabaseTransaction,
    rows: Vec<lead::Model>,
    mut stored: HashSet<String>,
    rule: &DuplicateRule,
) -> Result<InsertedLeads, DbErr> {
    let mut outcomes = Vec::with_capacity(rows.len());
    for row in rows {
        // A key sent twice in one batch derives one id: the first row is it.
        if stored.remove(&row.id) {
            outcomes.push(PersistOutcome::Inserted(row));
            continue;
        }
        outcomes.push(PersistOutcome::Existing(stored_before(txn, &row).await?));
    }
    let fresh: Vec<&lead::Model> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            PersistOutcome::Inserted(row) => Some(row),
            PersistOutcome::Existing(_) => None,
        })
        .collect();
    let originals = person::mark_duplicates(txn, &fresh, rule).await?;
    Ok(InsertedLeads {
        outcomes,
        originals,
    })
}

/// The lead a row that was not inserted is: the lead its id names. That
/// is the row itself, written before (a commit whose answer was lost, then
/// written again from the spool or lead by lead), or the lead its key
/// belongs to (a replay: a keyed id is derived from the key, or adopted
/// from an earlier lead's). The whole key is compared: two keys whose
/// derived ids met would be an error, never one lead answered for another.
async fn stored_before(txn: &DatabaseTransaction, row: &lead::Model) -> Result<lead::Model, DbErr> {
    let stored = lead::Entity::find_by_id(row.id.clone())
        .one(txn)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("lead behind a conflicting id".into()))?;
    if (&stored.source_id, &stored.idempotency_key) != (&row.source_id, &row.idempotency_key) {
        return Err(DbErr::Custom(format!(
            "lead {} belongs to another (source, key)",
            row.id
        )));
    }
    Ok(stored)
}

/// Bytes of row data per multi-row INSERT, so that one statement stays a
/// modest message whatever the batch holds. (Bigger than sqlx's write
/// buffer is fine: `tcp_nodelay` keeps its last part from waiting out the
/// server's delayed ACK.)
const STATEMENT_BYTES: usize = 64 * 1024;
/// Room for a row's other columns besides its variable-size body.
const ROW_OVERHEAD_BYTES: usize = 400;

/// Splits `rows` into runs whose estimated size stays under
/// `STATEMENT_BYTES` (each run holds at least one row).
fn small_statements<T>(rows: &[T], body_bytes: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (index, row) in rows.iter().enumerate() {
        let size = body_bytes(row) + ROW_OVERHEAD_BYTES;
        if index > start && bytes + size > STATEMENT_BYTES {
            runs.push(&rows[start..index]);
            (start, bytes) = (index, 0);
        }
        bytes += size;
    }
    if start < rows.len() {
        runs.push(&rows[start..]);
    }
    runs
}

/// The row intake writes for a new lead (same-person matching may make it
/// a duplicate within the same transaction). Stored at `stored_at`: its
/// last change, and its acceptance if it is accepted once stored, even if
/// it was received long before (a lead drained from the spool).
fn lead_row(new: &NewLead, stored_at: DateTime<Utc>) -> lead::Model {
    let state = if new.errors.is_empty() {
        LeadState::Received
    } else {
        LeadState::Invalid
    };
    lead::Model {
        id: new.id.clone(),
        source_id: new.source_id.clone(),
        idempotency_key: new.idempotency_key.clone(),
        key_digest: None,
        external_id: new.external_id.clone(),
        state: state.as_str().to_string(),
        raw: new.raw.clone(),
        raw_content_type: new.raw_content_type.clone(),
        fields: Value::Object(new.fields.clone()),
        attribution: Value::Object(new.attribution.clone()),
        is_test: new.is_test,
        errors: serde_json::to_value(&new.errors).unwrap_or_default(),
        duplicate_of: None,
        manager_notified: false,
        crm_synced: false,
        lease_owner: None,
        lease_until: None,
        received_at: new.received_at,
        updated_at: stored_at,
        history_from: None,
        offer_tried: false,
        claim_token: None,
        route_failures: 0,
        route_after: None,
        set_aside_reason: None,
        accepted_at: (new.accept_on_store && new.errors.is_empty()).then_some(stored_at),
    }
}

/// The leads with a delivery given up after a day of tries.
fn abandoned_deliveries() -> sea_orm::sea_query::SelectStatement {
    use sea_orm::QueryTrait;
    entity::delivery::Entity::find()
        .select_only()
        .column(entity::delivery::Column::LeadId)
        .filter(
            entity::delivery::Column::State
                .eq(super::deliveries::DeliveryState::Abandoned.as_str()),
        )
        .into_query()
}

/// The acceptance contract of a stored lead row: `accepted` once
/// `accepted_at` is set (stored valid with no required notify channel, or
/// a required channel confirmed it), as the database says, whatever the
/// configuration says now.
pub fn contract_of_row(row: &lead::Model) -> Contract {
    let awaiting_required_notify = row.accepted_at.is_none();
    let state = LeadState::parse(&row.state).unwrap_or(LeadState::Received);
    let errors: Vec<FieldError> = serde_json::from_value(row.errors.clone()).unwrap_or_default();
    let mut contract = Contract::for_stored(
        row.id.clone(),
        state,
        row.duplicate_of.clone(),
        errors,
        awaiting_required_notify,
    );
    contract.manager_notified = row.manager_notified;
    contract.crm_synced = row.crm_synced;
    contract
}

impl Store {
    /// Which of these lead ids have a row.
    pub async fn existing_lead_ids(&self, lead_ids: &[String]) -> Result<HashSet<String>, DbErr> {
        let mut found = HashSet::new();
        for chunk in lead_ids.chunks(500) {
            let ids: Vec<String> = lead::Entity::find()
                .select_only()
                .column(lead::Column::Id)
                .filter(lead::Column::Id.is_in(chunk.iter().map(String::as_str)))
                .into_tuple()
                .all(&self.intake)
                .await?;
            found.extend(ids);
        }
        Ok(found)
    }

    /// How many leads are in each state. `COUNT(*)`, not of a column: the
    /// (state, received_at) index then answers it alone on PostgreSQL (an
    /// index-only scan, about 2.5x quicker than reading every row).
    pub async fn lead_counts(&self) -> Result<HashMap<String, u64>, DbErr> {
        let rows: Vec<(String, i64)> = lead::Entity::find()
            .select_only()
            .column(lead::Column::State)
            .column_as(Expr::cust("COUNT(*)"), "leads")
            .group_by(lead::Column::State)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(state, count)| (state, count as u64))
            .collect())
    }

    /// Leads in the review queue besides invalid and unknown ones: set
    /// aside after routing failures, or with a delivery given up. Found
    /// through the few such rows (the `leads_set_aside` partial index, the
    /// deliveries' state index), never by reading every lead.
    pub async fn set_aside_count(&self) -> Result<u64, DbErr> {
        let set_aside = Query::select()
            .column(lead::Column::Id)
            .from(lead::Entity)
            .and_where(lead::Column::SetAsideReason.is_not_null())
            .union(UnionType::Distinct, abandoned_deliveries())
            .to_owned();
        lead::Entity::find()
            .filter(
                lead::Column::State
                    .is_not_in([LeadState::Invalid.as_str(), LeadState::Unknown.as_str()]),
            )
            .filter(lead::Column::Id.in_subquery(set_aside))
            .count(&self.db)
            .await
    }

    /// The posts that made a sale of this lead, returned ones included.
    pub async fn sale_attempts_of(&self, lead_id: &str) -> Result<HashSet<String>, DbErr> {
        let attempts: Vec<Option<String>> = sale::Entity::find()
            .select_only()
            .column(sale::Column::AttemptId)
            .filter(sale::Column::LeadId.eq(lead_id))
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(attempts.into_iter().flatten().collect())
    }

    /// The lead's sales that their buyers returned, oldest first.
    pub async fn returns_of(&self, lead_id: &str) -> Result<Vec<sale::Model>, DbErr> {
        sale::Entity::find()
            .filter(sale::Column::LeadId.eq(lead_id))
            .filter(sale::Column::ReturnedAt.is_not_null())
            .order_by_asc(sale::Column::ReturnedAt)
            .all(&self.db)
            .await
    }

    /// The sale (not returned) of each lead in `lead_ids` that has one.
    pub async fn sales_of(
        &self,
        lead_ids: &[String],
    ) -> Result<std::collections::HashMap<String, sale::Model>, DbErr> {
        if lead_ids.is_empty() {
            return Ok(Default::default());
        }
        let sales = sale::Entity::find()
            .filter(sale::Column::LeadId.is_in(lead_ids.iter().map(String::as_str)))
            .filter(sale::Column::ReturnedAt.is_null())
            .all(&self.db)
            .await?;
        Ok(sales
            .into_iter()
            .map(|sale| (sale.lead_id.clone(), sale))
            .collect())
    }
}
