//! `sales`: at most one sale per lead that was not returned (partial unique
//! index on `lead_id` where `returned_at` is null).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "sales")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub lead_id: String,
    pub buyer_id: String,
    pub attempt_id: Option<String>,
    pub price: Option<f64>,
    pub sold_at: DateTimeUtc,
    pub returned_at: Option<DateTimeUtc>,
    pub return_reason: Option<String>,
    /// What the lead's source is paid for this sale.
    pub payout: Option<f64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
