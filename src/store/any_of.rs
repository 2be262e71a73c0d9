//! `column IN (…)` over a list of ids or tokens, written so that PostgreSQL
//! sees one statement text whatever the list's length: `column = ANY($1)`,
//! one text array. Written as a list, each length is a statement of its
//! own: parsed and planned again, and a slot in sqlx's cache of 100
//! prepared statements (the routing bench's claim checks came in 521
//! shapes, each new one a Parse and Describe round trip). SQLite, in
//! process and without arrays, keeps the list.

use sea_orm::sea_query::extension::postgres::PgFunc;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, DbBackend};

/// `column` is one of `values`, as `backend` best takes it.
pub(super) fn any_of<'a, C: ColumnTrait>(
    backend: DbBackend,
    column: C,
    values: impl IntoIterator<Item = &'a str>,
) -> Expr {
    match backend {
        DbBackend::Postgres => {
            let values: Vec<String> = values.into_iter().map(str::to_owned).collect();
            Expr::col(column.as_column_ref()).eq(PgFunc::any(Expr::val(values)))
        }
        _ => column.is_in(values),
    }
}

#[cfg(test)]
mod tests {
    use entity::lead;
    use sea_orm::{EntityTrait, QueryFilter, QueryTrait};

    use super::*;

    fn statement(backend: DbBackend, ids: &[&str]) -> String {
        let query =
            lead::Entity::find().filter(any_of(backend, lead::Column::Id, ids.iter().copied()));
        query.build(backend).sql
    }

    #[test]
    fn postgres_sees_one_statement_whatever_the_number_of_values() {
        let one = statement(DbBackend::Postgres, &["a"]);
        assert_eq!(one, statement(DbBackend::Postgres, &["a", "b", "c"]));
        assert!(one.contains(r#""leads"."id" = ANY($1)"#), "{one}");
    }

    #[test]
    fn sqlite_keeps_the_list() {
        let three = statement(DbBackend::Sqlite, &["a", "b", "c"]);
        assert!(three.contains(r#""leads"."id" IN (?, ?, ?)"#), "{three}");
    }
}
