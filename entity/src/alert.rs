//! `alerts`: alerts raised, newest last.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "alerts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub kind: String,
    pub buyer_id: Option<String>,
    pub lead_id: Option<String>,
    #[sea_orm(column_type = "Text")]
    pub message: String,
    pub created_at: DateTimeUtc,
    /// False when `alerts.min_interval` held it back from the webhook and log.
    pub notified: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
