//! Same-person matching, decided by the database inside intake's write:
//! each `duplicate_keys` value (an e-mail, a phone) is a row of
//! `person_keys` whose primary key makes its owner unique. A new routable
//! lead claims its values; a value owned by another lead within
//! `intake.duplicate_window` makes it that lead's duplicate (and it gives
//! back the values it took), an owner older than the window is taken over.
//! Submissions of one person arriving at once on any instance, through
//! intake or the spool drainer, leave exactly one routable lead.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entity::{lead, person_key};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, QueryFilter,
};
use serde_json::Value;

use crate::config::DuplicateRule;
use crate::domain::LeadState;

/// Key rows per INSERT (modest statements, as `leads::STATEMENT_BYTES`).
const KEYS_PER_STATEMENT: usize = 64;
/// Duplicates made so by one UPDATE.
const DUPLICATES_PER_STATEMENT: usize = 500;
/// Tries at one contended value before the write gives up (and intake
/// retries the lead on its own).
const CLAIM_TRIES: usize = 3;

/// A duplicate-key value: its key's name and the value.
pub(super) type Key = (String, String);

/// Claims the values of the routable leads among `fresh` and makes those
/// that prove duplicates `duplicate` rows; returns them with their originals.
pub(super) async fn mark_duplicates(
    txn: &impl ConnectionTrait,
    fresh: &[&lead::Model],
    rule: &DuplicateRule,
) -> Result<HashMap<String, String>, DbErr> {
    let originals = claim_keys(txn, Plan::of(fresh, rule)).await?;
    set_duplicates(txn, &originals).await?;
    Ok(originals)
}

/// After the values `plan` wants were all taken (by intake's one statement
/// on PostgreSQL): makes the batch's own duplicates `duplicate` rows.
pub(super) async fn mark_planned_duplicates(
    txn: &impl ConnectionTrait,
    plan: Plan<'_>,
) -> Result<HashMap<String, String>, DbErr> {
    let originals = resolve(plan.originals);
    set_duplicates(txn, &originals).await?;
    Ok(originals)
}

/// Makes each duplicate a `duplicate` row pointing at its original: one
/// statement per original (and per `DUPLICATES_PER_STATEMENT` of its
/// duplicates), not one per duplicate, so that a person sent again and
/// again costs a batch one round trip, not one per lead.
async fn set_duplicates(
    txn: &impl ConnectionTrait,
    originals: &HashMap<String, String>,
) -> Result<(), DbErr> {
    let mut by_original: HashMap<&str, Vec<&str>> = HashMap::new();
    for (duplicate, original) in originals {
        by_original
            .entry(original.as_str())
            .or_default()
            .push(duplicate.as_str());
    }
    for (original, duplicates) in by_original {
        for chunk in duplicates.chunks(DUPLICATES_PER_STATEMENT) {
            lead::Entity::update_many()
                .col_expr(
                    lead::Column::State,
                    Expr::value(LeadState::Duplicate.as_str()),
                )
                .col_expr(lead::Column::DuplicateOf, Expr::value(original))
                .filter(lead::Column::Id.is_in(chunk.iter().copied()))
                .exec(txn)
                .await?;
        }
    }
    Ok(())
}

/// The values a batch's routable leads claim, decided within the batch
/// before the database is asked: the first lead with a value is its
/// claimant; a later one sharing a value duplicates it and claims nothing.
pub(super) struct Plan<'a> {
    rule: &'a DuplicateRule,
    /// Leads that duplicate an earlier lead of the batch.
    originals: HashMap<String, String>,
    /// Each claimant with its values.
    candidates: Vec<(&'a lead::Model, Vec<Key>)>,
}

impl<'a> Plan<'a> {
    pub(super) fn of(fresh: &[&'a lead::Model], rule: &'a DuplicateRule) -> Self {
        let mut originals = HashMap::new();
        let mut claimant: HashMap<Key, String> = HashMap::new();
        let mut candidates = Vec::new();
        for row in fresh.iter().filter(|row| is_matchable(row)) {
            let keys = keys_of(row, rule);
            if let Some(first) = keys.iter().find_map(|key| claimant.get(key)) {
                originals.insert(row.id.clone(), first.clone());
                continue;
            }
            for key in &keys {
                claimant.insert(key.clone(), row.id.clone());
            }
            if !keys.is_empty() {
                candidates.push((*row, keys));
            }
        }
        Self {
            rule,
            originals,
            candidates,
        }
    }

    /// Every value wanted with its claimant, sorted so that concurrent
    /// writers lock them in the same order.
    pub(super) fn wanted(&self) -> Vec<(&Key, &'a lead::Model)> {
        let mut wanted: Vec<(&Key, &lead::Model)> = self
            .candidates
            .iter()
            .flat_map(|(row, keys)| keys.iter().map(move |key| (key, *row)))
            .collect();
        wanted.sort_by(|a, b| a.0.cmp(b.0));
        wanted
    }
}

/// Claims the values `plan` wants; returns each lead that proved a
/// duplicate with the lead it duplicates.
async fn claim_keys(
    txn: &impl ConnectionTrait,
    plan: Plan<'_>,
) -> Result<HashMap<String, String>, DbErr> {
    if plan.candidates.is_empty() {
        return Ok(plan.originals);
    }
    // The fast path, one person new to us: insert every value.
    let wanted = plan.wanted();
    let mut inserted = 0;
    for chunk in wanted.chunks(KEYS_PER_STATEMENT) {
        let rows = chunk
            .iter()
            .map(|((name, value), row)| key_row(name, value, row));
        inserted += insert_unowned(txn, rows).await?;
    }
    if inserted as usize == wanted.len() {
        return Ok(resolve(plan.originals));
    }
    // Some values were taken: settle each candidate value by value.
    let mut owners = owners_of(txn, wanted.iter().map(|(key, _)| *key)).await?;
    let mut originals = plan.originals;
    for (row, keys) in &plan.candidates {
        let cutoff = window_start(row.received_at, plan.rule);
        for key in keys {
            match claim_one(txn, key, row, cutoff, owners.remove(key)).await? {
                Claim::Ours => {}
                Claim::OwnedBy(original) => {
                    originals.insert(row.id.clone(), original);
                    give_back(txn, row, keys).await?;
                    break;
                }
            }
        }
    }
    Ok(resolve(originals))
}

/// Gives back the values of `keys` that `row` holds (it proved a
/// duplicate). Named value by value: `person_keys` has no index by lead.
async fn give_back(
    txn: &impl ConnectionTrait,
    row: &lead::Model,
    keys: &[Key],
) -> Result<(), DbErr> {
    let values = keys.iter().fold(Condition::any(), |any, (name, value)| {
        any.add(
            Condition::all()
                .add(person_key::Column::Name.eq(name.as_str()))
                .add(person_key::Column::Value.eq(value.as_str())),
        )
    });
    person_key::Entity::delete_many()
        .filter(values)
        .filter(person_key::Column::LeadId.eq(row.id.as_str()))
        .exec(txn)
        .await?;
    Ok(())
}

enum Claim {
    Ours,
    OwnedBy(String),
}

/// Settles one value for `row`, starting from its owner as last read.
async fn claim_one(
    txn: &impl ConnectionTrait,
    (name, value): &Key,
    row: &lead::Model,
    cutoff: DateTime<Utc>,
    mut owner: Option<person_key::Model>,
) -> Result<Claim, DbErr> {
    for _ in 0..CLAIM_TRIES {
        match &owner {
            Some(held) if held.lead_id == row.id => return Ok(Claim::Ours),
            Some(held) if held.received_at >= cutoff => {
                return Ok(Claim::OwnedBy(held.lead_id.clone()))
            }
            // Its owner is older than the window: take the value over.
            Some(_) => {
                let taken = person_key::Entity::update_many()
                    .col_expr(person_key::Column::LeadId, row.id.clone().into())
                    .col_expr(person_key::Column::ReceivedAt, row.received_at.into())
                    .filter(person_key::Column::Name.eq(name.as_str()))
                    .filter(person_key::Column::Value.eq(value.as_str()))
                    .filter(person_key::Column::ReceivedAt.lt(cutoff))
                    .exec(txn)
                    .await?
                    .rows_affected;
                if taken == 1 {
                    return Ok(Claim::Ours);
                }
            }
            // Given back meanwhile by a lead that proved a duplicate.
            None => {
                if insert_unowned(txn, [key_row(name, value, row)]).await? == 1 {
                    return Ok(Claim::Ours);
                }
            }
        }
        owner = person_key::Entity::find_by_id((name.clone(), value.clone()))
            .one(txn)
            .await?;
    }
    Err(DbErr::Custom(format!(
        "the {name} value of lead {} stayed contended",
        row.id
    )))
}

/// Inserts key rows whose values nobody owns; answers how many it took.
async fn insert_unowned(
    txn: &impl ConnectionTrait,
    rows: impl IntoIterator<Item = person_key::ActiveModel>,
) -> Result<u64, DbErr> {
    person_key::Entity::insert_many(rows)
        .on_conflict(value_owned_already())
        .exec_without_returning(txn)
        .await
}

/// A value someone owns already is skipped, not an error.
pub(super) fn value_owned_already() -> OnConflict {
    OnConflict::columns([person_key::Column::Name, person_key::Column::Value])
        .do_nothing()
        .to_owned()
}

/// The owners of these values now.
async fn owners_of(
    txn: &impl ConnectionTrait,
    keys: impl Iterator<Item = &Key>,
) -> Result<HashMap<Key, person_key::Model>, DbErr> {
    let keys: Vec<&Key> = keys.collect();
    let mut owners = HashMap::new();
    for chunk in keys.chunks(KEYS_PER_STATEMENT) {
        let wanted = chunk
            .iter()
            .fold(Condition::any(), |wanted, (name, value)| {
                wanted.add(
                    Condition::all()
                        .add(person_key::Column::Name.eq(name.as_str()))
                        .add(person_key::Column::Value.eq(value.as_str())),
                )
            });
        for owner in person_key::Entity::find().filter(wanted).all(txn).await? {
            owners.insert((owner.name.clone(), owner.value.clone()), owner);
        }
    }
    Ok(owners)
}

/// A duplicate of a lead that proved a duplicate itself (both in this
/// batch) points at the routable one.
fn resolve(originals: HashMap<String, String>) -> HashMap<String, String> {
    originals
        .keys()
        .map(|duplicate| {
            let mut original = &originals[duplicate];
            for _ in 0..originals.len() {
                match originals.get(original) {
                    Some(next) => original = next,
                    None => break,
                }
            }
            (duplicate.clone(), original.clone())
        })
        .collect()
}

/// Leads that take part in same-person matching (routable, not tests).
fn is_matchable(row: &lead::Model) -> bool {
    row.state == LeadState::Received.as_str() && !row.is_test
}

/// The lead's duplicate-key values, by key name.
fn keys_of(row: &lead::Model, rule: &DuplicateRule) -> Vec<Key> {
    let mut keys: Vec<Key> = rule
        .keys
        .iter()
        .filter_map(|name| {
            row.fields
                .get(name)
                .and_then(Value::as_str)
                .filter(|value| !value.is_empty())
                .map(|value| (name.clone(), value.to_string()))
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn key_row(name: &str, value: &str, row: &lead::Model) -> person_key::ActiveModel {
    person_key::ActiveModel {
        name: Set(name.into()),
        value: Set(value.into()),
        lead_id: Set(row.id.clone()),
        received_at: Set(row.received_at),
    }
}

fn window_start(received_at: DateTime<Utc>, rule: &DuplicateRule) -> DateTime<Utc> {
    received_at - chrono::Duration::from_std(rule.window).unwrap_or(chrono::Duration::MAX)
}
