//! Lead rows: the intake log, the group-commit insert with database-enforced
//! dedupe, same-person matching, and the reads behind the lead endpoints.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::{attempt, intake_log, lead, lead_match_key, sale};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, IntoActiveModel,
    QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};
use serde_json::{Map, Value};

use super::Store;
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
}

/// How same-person duplicates are found (`intake.duplicate_*`).
#[derive(Debug, Clone)]
pub struct DuplicateRule {
    pub window: Duration,
    pub keys: Vec<String>,
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
    pub source: Option<String>,
    pub limit: u64,
    /// The last id of the previous page.
    pub cursor: Option<String>,
    pub oldest_first: bool,
}

#[derive(Debug, Clone)]
pub struct LeadPage {
    pub leads: Vec<lead::Model>,
    pub next_cursor: Option<String>,
}

impl Store {
    /// Writes the "arrived" records of a batch, before any lead row.
    pub async fn log_arrivals(&self, leads: &[NewLead]) -> Result<(), DbErr> {
        let txn = self.db.begin().await?;
        for chunk in small_statements(leads, |lead| lead.raw.len()) {
            let rows = chunk.iter().map(|lead| intake_log::ActiveModel {
                id: Set(crate::domain::new_id()),
                lead_id: Set(lead.id.clone()),
                source_id: Set(Some(lead.source_id.clone())),
                content_type: Set(lead.raw_content_type.clone()),
                remote_ip: Set(lead.remote_ip.clone()),
                idempotency_key: Set(lead.idempotency_key.clone()),
                body: Set(lead.raw.clone()),
                received_at: Set(lead.received_at),
            });
            intake_log::Entity::insert_many(rows)
                .exec_without_returning(&txn)
                .await?;
        }
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
        // Read before the transaction: on SQLite a transaction that reads
        // first cannot wait for the write lock (it fails with SQLITE_BUSY).
        let originals = find_same_person(&self.db, leads, rule).await?;
        let txn = self.db.begin().await?;
        let rows: Vec<lead::Model> = leads
            .iter()
            .zip(originals)
            .map(|(new, original)| lead_row(new, original))
            .collect();
        let mut written = 0;
        for chunk in small_statements(&rows, |row| row.raw.len() * 2) {
            written += lead::Entity::insert_many(
                chunk
                    .iter()
                    .cloned()
                    .map(IntoActiveModel::into_active_model),
            )
            .on_conflict(
                OnConflict::columns([lead::Column::SourceId, lead::Column::IdempotencyKey])
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(&txn)
            .await?;
        }
        let inserted: HashSet<String> = if written as usize == rows.len() {
            rows.iter().map(|row| row.id.clone()).collect()
        } else {
            lead::Entity::find()
                .select_only()
                .column(lead::Column::Id)
                .filter(lead::Column::Id.is_in(rows.iter().map(|row| row.id.as_str())))
                .into_tuple()
                .all(&txn)
                .await?
                .into_iter()
                .collect()
        };
        // A replay's server id was never stored: remember which lead it is.
        let mut replayed_as: HashMap<&str, lead::Model> = HashMap::new();
        for row in rows.iter().filter(|row| !inserted.contains(&row.id)) {
            let existing = lead::Entity::find()
                .filter(lead::Column::SourceId.eq(row.source_id.as_str()))
                .filter(lead::Column::IdempotencyKey.eq(row.idempotency_key.clone()))
                .one(&txn)
                .await?
                .ok_or_else(|| DbErr::RecordNotFound("lead behind a conflicting key".into()))?;
            replayed_as.insert(row.id.as_str(), existing);
        }
        let mut outcomes = Vec::with_capacity(rows.len());
        for row in &rows {
            if let Some(existing) = replayed_as.get(row.id.as_str()) {
                outcomes.push(PersistOutcome::Existing(existing.clone()));
                continue;
            }
            let mut row = row.clone();
            let original_was_replay = row
                .duplicate_of
                .as_deref()
                .and_then(|id| replayed_as.get(id));
            if let Some(original) = original_was_replay {
                // Matched a lead of this batch that proved to be a replay.
                row.duplicate_of = Some(original.id.clone());
                lead::Entity::update_many()
                    .col_expr(lead::Column::DuplicateOf, original.id.clone().into())
                    .filter(lead::Column::Id.eq(row.id.as_str()))
                    .exec(&txn)
                    .await?;
            }
            outcomes.push(PersistOutcome::Inserted(row));
        }
        let fresh: Vec<&lead::Model> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                PersistOutcome::Inserted(row) => Some(row),
                PersistOutcome::Existing(_) => None,
            })
            .collect();
        record_match_keys(&txn, &fresh, rule).await?;
        txn.commit().await?;
        Ok(outcomes)
    }

    pub async fn find_lead(&self, id: &str) -> Result<Option<lead::Model>, DbErr> {
        lead::Entity::find_by_id(id.to_string()).one(&self.db).await
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

    /// One page of leads; ids are time-ordered, so the id is the cursor.
    pub async fn list_leads(&self, filter: &LeadFilter) -> Result<LeadPage, DbErr> {
        let mut query = lead::Entity::find();
        if !filter.states.is_empty() {
            query =
                query.filter(lead::Column::State.is_in(filter.states.iter().map(|s| s.as_str())));
        }
        if let Some(source) = &filter.source {
            query = query.filter(lead::Column::SourceId.eq(source.as_str()));
        }
        query = match (&filter.cursor, filter.oldest_first) {
            (Some(cursor), true) => query.filter(lead::Column::Id.gt(cursor.as_str())),
            (Some(cursor), false) => query.filter(lead::Column::Id.lt(cursor.as_str())),
            (None, _) => query,
        };
        query = if filter.oldest_first {
            query.order_by_asc(lead::Column::Id)
        } else {
            query.order_by_desc(lead::Column::Id)
        };
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

/// Bytes of row data per multi-row INSERT. sqlx does not set TCP_NODELAY
/// on PostgreSQL connections, so a statement that spans several TCP
/// segments waits out the server's delayed ACK (~40 ms, measured: a
/// 63-lead INSERT took 45 ms, eight 8-lead INSERTs 4 ms). Small statements
/// keep a group commit fast.
const STATEMENT_BYTES: usize = 8 * 1024;
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

/// The row intake writes for a new lead, given its same-person match.
fn lead_row(new: &NewLead, duplicate_of: Option<String>) -> lead::Model {
    let state = if !new.errors.is_empty() {
        LeadState::Invalid
    } else if duplicate_of.is_some() {
        LeadState::Duplicate
    } else {
        LeadState::Received
    };
    lead::Model {
        id: new.id.clone(),
        source_id: new.source_id.clone(),
        idempotency_key: new.idempotency_key.clone(),
        external_id: new.external_id.clone(),
        state: state.as_str().to_string(),
        raw: new.raw.clone(),
        raw_content_type: new.raw_content_type.clone(),
        fields: Value::Object(new.fields.clone()),
        attribution: Value::Object(new.attribution.clone()),
        is_test: new.is_test,
        errors: serde_json::to_value(&new.errors).unwrap_or_default(),
        duplicate_of,
        manager_notified: false,
        crm_synced: false,
        lease_owner: None,
        lease_until: None,
        received_at: new.received_at,
        updated_at: new.received_at,
        history_from: None,
        offer_tried: false,
    }
}

/// Leads that take part in same-person matching (valid, not tests).
fn is_matchable(new: &NewLead) -> bool {
    new.errors.is_empty() && !new.is_test
}

fn match_keys<'a>(
    new: &'a NewLead,
    rule: &'a DuplicateRule,
) -> impl Iterator<Item = (&'a str, &'a str)> {
    rule.keys.iter().filter_map(|name| {
        new.fields
            .get(name)
            .and_then(Value::as_str)
            .map(|value| (name.as_str(), value))
    })
}

fn window_start(received_at: DateTime<Utc>, window: Duration) -> DateTime<Utc> {
    received_at - chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX)
}

/// Same-person originals for a batch, in one query plus the batch itself:
/// the earliest lead within the window sharing any duplicate-key value.
/// Only one batch is written at a time per instance, so reading outside
/// the write transaction misses nothing of our own.
async fn find_same_person(
    txn: &impl ConnectionTrait,
    leads: &[NewLead],
    rule: &DuplicateRule,
) -> Result<Vec<Option<String>>, DbErr> {
    let mut wanted = Condition::any();
    let mut any = false;
    for new in leads.iter().filter(|new| is_matchable(new)) {
        for (name, value) in match_keys(new, rule) {
            any = true;
            wanted = wanted.add(
                Condition::all()
                    .add(lead_match_key::Column::Name.eq(name))
                    .add(lead_match_key::Column::Value.eq(value)),
            );
        }
    }
    let mut known: HashMap<(String, String), (DateTime<Utc>, String)> = HashMap::new();
    if any {
        let oldest = leads
            .iter()
            .map(|new| new.received_at)
            .min()
            .unwrap_or_else(Utc::now);
        let rows = lead_match_key::Entity::find()
            .filter(wanted)
            .filter(lead_match_key::Column::ReceivedAt.gte(window_start(oldest, rule.window)))
            .all(txn)
            .await?;
        for row in rows {
            let entry = known
                .entry((row.name, row.value))
                .or_insert((row.received_at, row.lead_id.clone()));
            if row.received_at < entry.0 {
                *entry = (row.received_at, row.lead_id);
            }
        }
    }
    let mut originals = Vec::with_capacity(leads.len());
    for new in leads {
        if !is_matchable(new) {
            originals.push(None);
            continue;
        }
        let since = window_start(new.received_at, rule.window);
        let original = match_keys(new, rule)
            .filter_map(|(name, value)| known.get(&(name.to_string(), value.to_string())))
            .filter(|(at, _)| *at >= since)
            .min_by_key(|(at, _)| *at)
            .map(|(_, id)| id.clone());
        if original.is_none() {
            // Later leads of this batch match this one.
            for (name, value) in match_keys(new, rule) {
                known
                    .entry((name.to_string(), value.to_string()))
                    .or_insert((new.received_at, new.id.clone()));
            }
        }
        originals.push(original);
    }
    Ok(originals)
}

async fn record_match_keys(
    txn: &impl ConnectionTrait,
    rows: &[&lead::Model],
    rule: &DuplicateRule,
) -> Result<(), DbErr> {
    let keys: Vec<_> = rows
        .iter()
        .filter(|row| row.state == LeadState::Received.as_str() && !row.is_test)
        .flat_map(|row| {
            rule.keys.iter().filter_map(move |name| {
                row.fields.get(name).and_then(Value::as_str).map(|value| {
                    lead_match_key::ActiveModel {
                        name: Set(name.clone()),
                        value: Set(value.to_string()),
                        lead_id: Set(row.id.clone()),
                        received_at: Set(row.received_at),
                    }
                })
            })
        })
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    lead_match_key::Entity::insert_many(keys)
        .on_conflict(
            OnConflict::columns([
                lead_match_key::Column::Name,
                lead_match_key::Column::Value,
                lead_match_key::Column::LeadId,
            ])
            .do_nothing()
            .to_owned(),
        )
        .exec_without_returning(txn)
        .await?;
    Ok(())
}

/// The acceptance contract of a stored lead row.
pub fn contract_of_row(row: &lead::Model, awaiting_required_notify: bool) -> Contract {
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
                .all(&self.db)
                .await?;
            found.extend(ids);
        }
        Ok(found)
    }

    /// How many leads are in each state.
    pub async fn lead_counts(&self) -> Result<HashMap<String, u64>, DbErr> {
        let rows: Vec<(String, i64)> = lead::Entity::find()
            .select_only()
            .column(lead::Column::State)
            .column_as(lead::Column::Id.count(), "leads")
            .group_by(lead::Column::State)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(state, count)| (state, count as u64))
            .collect())
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
