//! `cap_use`: posts reserved against a buyer's hourly, daily or monthly cap
//! in one period. A post reserves its slot with a conditional upsert before
//! it is sent, so caps hold with any number of leads and instances at once.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "cap_use")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub buyer_id: String,
    /// `hour`, `day` or `month` (UTC).
    #[sea_orm(primary_key, auto_increment = false)]
    pub period: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub period_start: DateTimeUtc,
    /// Posts that sold, may have sold (timed out), or are in flight.
    pub used: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
