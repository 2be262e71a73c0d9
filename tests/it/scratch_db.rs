//! A database of one test's (or one benchmark's) own: a SQLite file in a temp
//! dir, or a fresh PostgreSQL database that is dropped again on drop.
//! Shared by the integration tests and the benchmarks (`#[path]` include).

use sea_orm::{ConnectionTrait, Database};

/// Where PostgreSQL scratch databases are created; override with LEADROUTER_TEST_POSTGRES.
const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A database of a test's own; PostgreSQL databases are dropped on drop.
pub struct TestDatabase {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    postgres_name: Option<String>,
}

impl TestDatabase {
    pub async fn create(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}/leadrouter.db?mode=rwc", dir.path().display());
                Self {
                    url,
                    _dir: Some(dir),
                    postgres_name: None,
                }
            }
            Backend::Postgres => {
                let name = format!("lr_test_{}", uuid_simple());
                let admin = Database::connect(format!("{}/postgres", postgres_base()))
                    .await
                    .expect("PostgreSQL must be running for the postgres tests");
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create test database");
                Self {
                    url: format!("{}/{name}", postgres_base()),
                    _dir: None,
                    postgres_name: Some(name),
                }
            }
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Some(name) = self.postgres_name.take() else {
            return;
        };
        // Drop runs outside any runtime we may block: use a thread of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    if let Ok(admin) =
                        Database::connect(format!("{}/postgres", postgres_base())).await
                    {
                        let _ = admin
                            .execute_unprepared(&format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            ))
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

fn postgres_base() -> String {
    std::env::var("LEADROUTER_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_POSTGRES.to_string())
}

fn uuid_simple() -> String {
    leadrouter::domain::new_id().replace('-', "")
}
