//! `deliveries`: one row per lead and notify channel, or per lead, event
//! sink and event. `state` decides in the database whether it may still be
//! sent (`pending`), was confirmed (`confirmed`, never sent again) or was
//! given up after a day of retries (`abandoned`, left for an operator).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "deliveries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub lead_id: String,
    /// The channel id (notify) or `sink_id:event` (events).
    #[sea_orm(primary_key, auto_increment = false)]
    pub target: String,
    /// `notify` or `event`.
    pub kind: String,
    /// The notify channel's or event sink's id.
    pub channel: String,
    pub event: Option<String>,
    pub state: String,
    pub tries: i32,
    pub next_try_at: DateTimeUtc,
    /// While set and in the future, one instance is sending it.
    pub lease_until: Option<DateTimeUtc>,
    /// Fresh on every claim: a failed try lets the row go only under it.
    pub claim_token: Option<String>,
    pub created_at: DateTimeUtc,
    pub confirmed_at: Option<DateTimeUtc>,
    pub last_error: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
