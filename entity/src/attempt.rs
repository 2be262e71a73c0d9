//! `attempts`: every outbound call (ping, post, notify, event) and every skip,
//! written before the call with a snapshot of the configuration it used
//! (`snapshot_id`, a row of `config_snapshots`).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "attempts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub lead_id: String,
    pub buyer_id: String,
    pub kind: String,
    pub outcome: String,
    pub reason: Option<String>,
    pub http_status: Option<i32>,
    pub started_at: DateTimeUtc,
    pub duration_ms: Option<i64>,
    pub retry_of: Option<String>,
    pub request: Json,
    pub response_body: Option<String>,
    /// The configuration the attempt used: a `config_snapshots` row.
    pub snapshot_id: String,
    pub bid: Option<f64>,
    pub ping_id: Option<String>,
    /// The instance that made the call, so recovery can settle its leftovers.
    pub instance_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
