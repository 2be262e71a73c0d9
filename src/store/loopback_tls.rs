//! PostgreSQL on this machine is reached without TLS unless the
//! configuration asks for it. Without an `sslmode`, a client negotiates
//! TLS whenever the server offers it (Debian's and most packages' default
//! configuration does), also over a loopback connection, where it protects
//! nothing: the bytes never leave the machine, and whoever could read them
//! there could read the database's files. It costs both sides CPU on every
//! statement (the database's backends spent about a tenth of their time in
//! OpenSSL in the intake bench), and on a busy machine that CPU is taken
//! from intake's commits.

use std::net::IpAddr;

use sea_orm::sqlx::postgres::{PgConnectOptions, PgSslMode};

/// `options` for `url`, without TLS when the server is on this machine (a
/// loopback address, or `localhost`) and neither the URL (`sslmode=`) nor
/// the environment (`PGSSLMODE`) chooses a mode; any mode chosen is kept.
pub fn plain_on_loopback(url: &str, options: PgConnectOptions) -> PgConnectOptions {
    let chosen =
        url.to_ascii_lowercase().contains("sslmode=") || std::env::var_os("PGSSLMODE").is_some();
    if chosen || !is_loopback(options.get_host()) {
        return options;
    }
    options.ssl_mode(PgSslMode::Disable)
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(url: &str) -> PgSslMode {
        plain_on_loopback(url, url.parse().unwrap()).get_ssl_mode()
    }

    #[test]
    fn a_server_on_this_machine_is_reached_without_tls_unless_the_url_asks_for_it() {
        for url in [
            "postgres://postgres@127.0.0.1:5432/leads",
            "postgres://postgres@localhost/leads",
            "postgres://postgres@[::1]:5432/leads",
        ] {
            assert!(matches!(mode(url), PgSslMode::Disable), "{url}");
        }
        assert!(matches!(
            mode("postgres://postgres@127.0.0.1/leads?sslmode=require"),
            PgSslMode::Require
        ));
        assert!(matches!(
            mode("postgres://postgres@db.internal:5432/leads"),
            PgSslMode::Prefer
        ));
        assert!(matches!(
            mode("postgres://postgres@10.0.0.5/leads"),
            PgSslMode::Prefer
        ));
    }
}
