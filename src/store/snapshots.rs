//! The configurations attempts used (`config_snapshots`): each is written
//! once, in the transaction of the first attempt that names it (so no
//! committed attempt names a missing one), and read back by id for a
//! retry, a price, cap slots or a view.

use std::collections::HashMap;

use dashmap::DashSet;
use entity::config_snapshot;
use sea_orm::sea_query::OnConflict;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, Set};
use serde_json::Value;

use crate::domain::ConfigSnapshot;

/// The ids this process knows are stored: each is written at most once
/// per process (and at most once at all: another instance's copy is kept).
#[derive(Debug, Default)]
pub(super) struct StoredSnapshots {
    ids: DashSet<String>,
}

impl StoredSnapshots {
    /// Writes, on `conn` (the transaction of the attempts that name them),
    /// those of `snapshots` not known to be stored, in id order (two
    /// transactions writing the same ones then wait for each other in the
    /// same order, never in a cycle); the ones it wrote, to pass to
    /// [`Self::committed`] once the transaction is.
    pub(super) async fn write_new<'a>(
        &self,
        conn: &impl ConnectionTrait,
        snapshots: impl Iterator<Item = &'a ConfigSnapshot>,
    ) -> Result<Vec<String>, DbErr> {
        let mut new: Vec<&ConfigSnapshot> = snapshots
            .filter(|snapshot| !self.ids.contains(&snapshot.id))
            .collect();
        new.sort_by(|a, b| a.id.cmp(&b.id));
        new.dedup_by(|a, b| a.id == b.id);
        if new.is_empty() {
            return Ok(Vec::new());
        }
        let rows = new.iter().map(|snapshot| config_snapshot::ActiveModel {
            id: Set(snapshot.id.clone()),
            snapshot: Set(Value::clone(&snapshot.value)),
        });
        config_snapshot::Entity::insert_many(rows)
            .on_conflict(
                OnConflict::column(config_snapshot::Column::Id)
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(conn)
            .await?;
        Ok(new
            .into_iter()
            .map(|snapshot| snapshot.id.clone())
            .collect())
    }

    /// Ids whose writing transaction committed.
    pub(super) fn committed(&self, ids: Vec<String>) {
        for id in ids {
            self.ids.insert(id);
        }
    }
}

/// The stored configurations of `ids`, by id (an unknown id is left out).
pub(super) async fn read(
    conn: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = &str>,
) -> Result<HashMap<String, Value>, DbErr> {
    let mut ids: Vec<&str> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = config_snapshot::Entity::find()
        .filter(config_snapshot::Column::Id.is_in(ids))
        .all(conn)
        .await?;
    Ok(rows.into_iter().map(|row| (row.id, row.snapshot)).collect())
}

/// The stored configuration `id` names, if any.
pub(super) async fn read_one(
    conn: &impl ConnectionTrait,
    id: &str,
) -> Result<Option<Value>, DbErr> {
    Ok(read(conn, [id]).await?.remove(id))
}
