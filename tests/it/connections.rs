//! How the store connects to PostgreSQL: a server on this machine is
//! reached without TLS unless the URL asks for it (`store::loopback_tls`).

use crate::helpers::{one_value, open_store, Backend, TestDatabase};

#[actix_web::test]
async fn a_server_on_this_machine_is_reached_without_tls_unless_the_url_asks_for_it() {
    let database = TestDatabase::create(Backend::Postgres).await;
    let by_default = open_store(&database.url).await;
    assert!(
        !uses_tls(by_default.connection()).await,
        "a connection to {} negotiated TLS",
        database.url
    );
    // Where the server offers TLS (Debian's packages do), the mode written
    // in the URL is kept.
    if server_offers_tls(by_default.connection()).await {
        let asked = open_store(&format!("{}?sslmode=require", database.url)).await;
        assert!(uses_tls(asked.connection()).await);
    }
    crate::helpers::close_stores().await;
}

/// Whether the connection that runs this statement is encrypted.
async fn uses_tls(db: &sea_orm::DatabaseConnection) -> bool {
    one_value(
        db,
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .await
}

async fn server_offers_tls(db: &sea_orm::DatabaseConnection) -> bool {
    one_value(db, "SELECT current_setting('ssl') = 'on'").await
}
