//! `lead_aliases`: an id given to a sender for a spooled lead that drained
//! into a key already stored; it names that stored lead.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "lead_aliases")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub alias_id: String,
    pub lead_id: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
