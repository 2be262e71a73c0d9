//! The INSERT of lead rows that both of intake's writes run: SQLite's
//! statement by statement (`leads`), and PostgreSQL's inside one statement
//! with the intake log and the person keys (`batch_statement`).

use entity::lead;
use sea_orm::sea_query::{InsertStatement, OnConflict};
use sea_orm::{EntityTrait, IntoActiveModel, QueryTrait};

/// The INSERT of lead rows, a row whose id is taken already skipped (a
/// keyed lead's id is derived from its (source, key), so that is also how a
/// key taken already is skipped). It answers the ids it stored.
pub(super) fn new_leads(rows: &[lead::Model]) -> InsertStatement {
    let mut insert =
        lead::Entity::insert_many(rows.iter().cloned().map(IntoActiveModel::into_active_model))
            .on_conflict(OnConflict::column(lead::Column::Id).do_nothing().to_owned())
            .into_query();
    insert.returning_col(lead::Column::Id);
    insert
}
