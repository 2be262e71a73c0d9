//! `column` among the values a subquery picks, the subquery run once.

/// `column` is one of the values a subquery with a `LIMIT` (and a lock
/// clause) `picks`, the subquery run once: `column = ANY(ARRAY(…))` on
/// PostgreSQL, which may run an `IN (…)` subquery again for each row it
/// joins, each run picking a further `LIMIT` of rows (a claim of 5 took
/// 20); `IN (…)` on SQLite, which runs it once.
pub(super) fn among(
    column: sea_orm::sea_query::Expr,
    picks: sea_orm::sea_query::SelectStatement,
    backend: sea_orm::DbBackend,
) -> sea_orm::sea_query::Expr {
    use sea_orm::sea_query::{Expr, ExprTrait, QueryStatementBuilder};
    if backend == sea_orm::DbBackend::Postgres {
        Expr::cust_with_exprs(
            "$1 = ANY(ARRAY($2))",
            [
                column,
                Expr::SubQuery(None, Box::new(picks.into_sub_query_statement())),
            ],
        )
    } else {
        column.in_subquery(picks)
    }
}
