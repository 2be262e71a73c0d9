//! `Application`: connects the store, runs migrations, starts the actor tree,
//! and binds the HTTP server (port 0 in tests).

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::{dev::Server, web, App, HttpServer};
use anyhow::Context;

use crate::actors::Overseer;
use crate::config::Settings;
use crate::rate_limit::RateLimiter;
use crate::routes::{self, AppState};
use crate::store::Store;

pub struct Application {
    port: u16,
    server: Server,
    store: Store,
    shutdown_grace: std::time::Duration,
}

impl Application {
    /// Connects, migrates, starts the actors and binds `server.listen`.
    /// Must run inside an actix system (`#[actix_web::main]`, `actix_web::test`).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with(settings, |_| {}).await
    }

    /// As [`Application::build`], with extra routes (the demo's form page).
    pub async fn build_with(
        settings: Settings,
        extra_routes: fn(&mut web::ServiceConfig),
    ) -> anyhow::Result<Self> {
        let store = Store::connect(&settings.database)
            .await
            .with_context(|| format!("failed to connect to {}", settings.database.display_url()))?;
        store.migrate().await.context("failed to run migrations")?;

        let listener = TcpListener::bind(&settings.server.listen)
            .with_context(|| format!("failed to listen on {}", settings.server.listen))?;
        let port = listener.local_addr()?.port();

        let instance_id: Arc<str> = crate::domain::new_id().into();
        tracing::info!(%instance_id, "starting the actors");
        let tree = Overseer::start(store.clone(), &settings, instance_id);
        let grace = settings.server.shutdown_grace;
        let state = web::Data::new(AppState {
            settings: Arc::new(settings),
            store: store.clone(),
            tree,
            limiter: RateLimiter::default(),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(extra_routes)
                .configure(routes::configure)
        })
        .listen(listener)?
        .shutdown_timeout(grace.as_secs())
        .run();
        Ok(Self {
            port,
            server,
            store,
            shutdown_grace: grace,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from elsewhere (tests, benchmarks, signal handling).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Serves until the server is stopped (ctrl-c / SIGTERM), then closes
    /// the database pool, waiting up to `server.shutdown_grace` for
    /// queries in flight.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        if actix_web::rt::time::timeout(self.shutdown_grace, self.store.close())
            .await
            .is_err()
        {
            tracing::warn!("database queries still running at shutdown");
        }
        served
    }
}
