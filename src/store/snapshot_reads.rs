//! The configurations attempts used, read back by id for the rest of the
//! service (a retry, a price, the lead views); the store's own reads and
//! writes of them are `snapshots`.

use std::collections::HashMap;

use sea_orm::DbErr;
use serde_json::Value;

use super::handle::Store;
use super::snapshots::{read, read_one};

impl Store {
    /// The stored configurations of `ids`, by id (an unknown id is left out).
    pub async fn config_snapshots(
        &self,
        ids: impl IntoIterator<Item = &str>,
    ) -> Result<HashMap<String, Value>, DbErr> {
        read(&self.db, ids).await
    }

    /// The stored configuration `id` names, if any.
    pub async fn config_snapshot(&self, id: &str) -> Result<Option<Value>, DbErr> {
        read_one(&self.db, id).await
    }
}
