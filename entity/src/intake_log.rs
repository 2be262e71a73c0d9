//! `intake_log`: one row per request that reached intake, committed before
//! the lead row so a failed persist still leaves evidence (and the body).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "intake_log")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The server id the lead was given, whether or not its row was written.
    pub lead_id: String,
    pub source_id: Option<String>,
    pub content_type: String,
    pub remote_ip: Option<String>,
    pub idempotency_key: Option<String>,
    #[sea_orm(column_type = "Blob")]
    pub body: Vec<u8>,
    pub received_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
