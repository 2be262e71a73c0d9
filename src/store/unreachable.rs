//! Whether a database error means the database could not be reached
//! (the lead may be spooled, the write tried again), or that it refused
//! the statement.

use sea_orm::DbErr;

/// True when the error says the database could not be reached (no
/// connection, a connection lost or terminated by the server, the pool
/// gave up), rather than that it refused a statement: the lead may go to
/// the spool and be retried.
pub fn is_unreachable(error: &DbErr) -> bool {
    use sea_orm::sqlx::Error as SqlxError;
    use sea_orm::RuntimeErr;
    match error {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => true,
        DbErr::Exec(RuntimeErr::SqlxError(cause)) | DbErr::Query(RuntimeErr::SqlxError(cause)) => {
            matches!(
                cause.as_ref(),
                SqlxError::Io(_)
                    | SqlxError::Tls(_)
                    | SqlxError::Protocol(_)
                    | SqlxError::PoolTimedOut
                    | SqlxError::PoolClosed
                    | SqlxError::WorkerCrashed
            ) || is_lost_session(cause)
        }
        _ => false,
    }
}

/// PostgreSQL ended the session rather than refused the statement: class 08
/// (connection exception) and 57P01–57P03 (the server shutting down or
/// terminating the backend, as `pg_terminate_backend` or a failover does).
fn is_lost_session(cause: &sea_orm::sqlx::Error) -> bool {
    let Some(code) = cause.as_database_error().and_then(|error| error.code()) else {
        return false;
    };
    code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
}
