//! `person_keys`: one row per `duplicate_keys` value (an e-mail, a phone),
//! naming the routable lead that owns it. The primary key makes the claim
//! unique, so two submissions of one person can never both own it.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "person_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub name: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub value: String,
    pub lead_id: String,
    /// When the owning lead arrived: after `intake.duplicate_window` a new
    /// lead with this value takes the key over.
    pub received_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
