//! The INSERT of lead rows that both of intake's writes run: SQLite's
//! statement by statement (`leads`), and PostgreSQL's inside one statement
//! with the intake log and the person keys (`batch_statement`).

use entity::lead;
use sea_orm::sea_query::{InsertStatement, OnConflict};
use sea_orm::{EntityTrait, IntoActiveModel, QueryTrait};

/// The INSERT of lead rows, a (source, key) pair taken already skipped:
/// its digest is in the unique index, and a keyed lead's id is derived
/// from the pair, so either constraint may be the one that holds it (no
/// conflict target). It answers the ids it stored.
pub(super) fn new_leads(rows: &[lead::Model]) -> InsertStatement {
    let mut insert =
        lead::Entity::insert_many(rows.iter().cloned().map(IntoActiveModel::into_active_model))
            .on_conflict(OnConflict::new().do_nothing().to_owned())
            .into_query();
    insert.returning_col(lead::Column::Id);
    insert
}
