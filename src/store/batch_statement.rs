//! Intake's write on PostgreSQL as one statement per run of a batch: the
//! intake log rows, the leads (a key taken already skipped, `ON CONFLICT
//! DO NOTHING`) and the values of the leads it stored (a value owned
//! already skipped), as the data-modifying parts of one `WITH`. The log
//! still commits with its leads (principle 3): the statement runs inside
//! the batch's transaction. It answers how many leads and values it took;
//! the caller settles the rest, in the same transaction. SQLite has no
//! data-modifying `WITH` and no round trips to save.

use std::collections::HashSet;
use std::ops::AddAssign;

use entity::{intake_log, lead, person_key};
use sea_orm::sea_query::{
    Alias, CommonTableExpression, Expr, ExprTrait, IntoIden, Query, SelectStatement, ValueTuple,
    WithClause,
};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, QueryTrait};

use super::lead_insert::new_leads;
use super::person::Key;

/// The ids of the leads one statement (or a batch's) stored, and how many
/// values it claimed.
#[derive(Debug, Default, Clone)]
pub(super) struct Taken {
    pub leads: HashSet<String>,
    pub keys: usize,
}

impl AddAssign for Taken {
    fn add_assign(&mut self, other: Self) {
        self.leads.extend(other.leads);
        self.keys += other.keys;
    }
}

/// Logs and stores `rows` and claims `keys` (each with its lead, sorted by
/// value) for the leads stored, in one statement in `txn`.
pub(super) async fn log_store_and_claim(
    txn: &DatabaseTransaction,
    log_rows: impl IntoIterator<Item = intake_log::ActiveModel>,
    rows: &[lead::Model],
    keys: &[(&Key, &lead::Model)],
) -> Result<Taken, DbErr> {
    let logged = intake_log::Entity::insert_many(log_rows).into_query();
    let stored = new_leads(rows);
    let mut parts = WithClause::new();
    parts
        .cte(part("logged", logged))
        .cte(part("stored", stored));
    let mut counts = Query::select();
    counts.expr_as(
        Expr::cust("ARRAY(SELECT id FROM stored)"),
        Alias::new("leads"),
    );
    if keys.is_empty() {
        counts.expr_as(Expr::val(0i64), Alias::new("keys"));
    } else {
        let mut claimed = Query::insert();
        claimed
            .into_table(person_key::Entity)
            .columns([
                person_key::Column::Name,
                person_key::Column::Value,
                person_key::Column::LeadId,
                person_key::Column::ReceivedAt,
            ])
            .select_from(wanted_of_stored(keys))
            .map_err(|error| DbErr::Custom(error.to_string()))?
            .on_conflict(super::person::value_owned_already())
            .returning_col(person_key::Column::LeadId);
        parts.cte(part("claimed", claimed));
        counts.expr_as(
            Expr::cust("(SELECT COUNT(*) FROM claimed)"),
            Alias::new("keys"),
        );
    }
    let statement = txn.get_database_backend().build(&parts.query(counts));
    let row = txn
        .query_one_raw(statement)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("what intake's statement took".into()))?;
    let stored: Vec<String> = row.try_get("", "leads")?;
    Ok(Taken {
        leads: stored.into_iter().collect(),
        keys: row.try_get::<i64>("", "keys")? as usize,
    })
}

/// A named part of the `WITH`.
fn part(
    name: &str,
    query: impl Into<sea_orm::sea_query::SubQueryStatement>,
) -> CommonTableExpression {
    CommonTableExpression::new()
        .query(query)
        .table_name(Alias::new(name))
        .to_owned()
}

/// The key rows wanted, of the leads `stored` returned, in value order
/// (concurrent writers lock values in the same order).
fn wanted_of_stored(keys: &[(&Key, &lead::Model)]) -> SelectStatement {
    let column = |n: usize| Alias::new(format!("column{n}")).into_iden();
    let tuples = keys.iter().map(|((name, value), row)| {
        ValueTuple::Many(vec![
            name.clone().into(),
            value.clone().into(),
            row.id.clone().into(),
            row.received_at.into(),
        ])
    });
    Query::select()
        .columns([column(1), column(2), column(3), column(4)])
        .from_values(tuples, Alias::new("wanted"))
        .and_where(
            Expr::col(column(3)).in_subquery(
                Query::select()
                    .column(lead::Column::Id)
                    .from(Alias::new("stored"))
                    .to_owned(),
            ),
        )
        .order_by(column(1), sea_orm::Order::Asc)
        .order_by(column(2), sea_orm::Order::Asc)
        .to_owned()
}
