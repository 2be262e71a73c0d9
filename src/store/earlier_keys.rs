//! Keys of leads stored before keyed ids were derived from (source, key):
//! their ids are random, so a replay of such a key derives an id that is
//! not theirs. Their key digests are kept in a partial index (migration
//! 14); intake looks a batch's keys up there, and gives a row whose key is
//! found the earlier lead's id, so the insert meets that lead. No new lead
//! stores a digest, so a database with none (every database created since)
//! never needs the lookup, and the store knows that once it has migrated.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use entity::lead;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QuerySelect};

/// Whether the database may hold leads stored with random ids and keys.
#[derive(Debug)]
pub(super) struct EarlierKeys {
    possible: AtomicBool,
}

impl Default for EarlierKeys {
    /// Until the store has migrated and looked, assume there are some.
    fn default() -> Self {
        Self {
            possible: AtomicBool::new(true),
        }
    }
}

impl EarlierKeys {
    /// Looks once whether any lead has a stored key digest (after the
    /// migrations: none is ever written again).
    pub(super) async fn look(&self, db: &impl ConnectionTrait) -> Result<(), DbErr> {
        let any = lead::Entity::find()
            .select_only()
            .column(lead::Column::Id)
            .filter(lead::Column::KeyDigest.is_not_null())
            .limit(1)
            .into_tuple::<String>()
            .one(db)
            .await?;
        self.possible.store(any.is_some(), Ordering::Relaxed);
        Ok(())
    }

    /// Gives each of `rows` whose (source, key) belongs to an earlier lead
    /// that lead's id (the whole key compared, not only its digest).
    pub(super) async fn adopt_ids(
        &self,
        db: &impl ConnectionTrait,
        rows: &mut [lead::Model],
    ) -> Result<(), DbErr> {
        if !self.possible.load(Ordering::Relaxed) {
            return Ok(());
        }
        let digests: Vec<String> = rows
            .iter()
            .filter_map(|row| {
                let key = row.idempotency_key.as_deref()?;
                Some(lead::key_digest(&row.source_id, key))
            })
            .collect();
        if digests.is_empty() {
            return Ok(());
        }
        let earlier: HashMap<(String, String), String> = lead::Entity::find()
            .select_only()
            .columns([
                lead::Column::SourceId,
                lead::Column::IdempotencyKey,
                lead::Column::Id,
            ])
            .filter(lead::Column::KeyDigest.is_in(digests))
            .into_tuple::<(String, String, String)>()
            .all(db)
            .await?
            .into_iter()
            .map(|(source, key, id)| ((source, key), id))
            .collect();
        for row in rows {
            let Some(key) = row.idempotency_key.clone() else {
                continue;
            };
            if let Some(id) = earlier.get(&(row.source_id.clone(), key)) {
                row.id = id.clone();
            }
        }
        Ok(())
    }
}
