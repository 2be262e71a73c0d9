//! `Application`: connects the store, runs migrations, opens the spool,
//! starts the actor tree, and binds the HTTP server (port 0 in tests); then
//! serves until SIGTERM / ctrl-c (or until supervision gives up) and shuts
//! down gracefully: intake answers 503 `failed` at once, calls in flight get
//! `server.shutdown_grace` to finish, leases still held are released, the
//! pool is closed.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::{dev::Server, web, App, HttpServer};
use anyhow::Context;

use std::sync::atomic::Ordering;

use crate::actors::router::Drain;
use crate::actors::supervision::{Escalation, RestartLog};
use crate::actors::{Overseer, Services, Tree};
use crate::alerts::Alerts;
use crate::config::{Settings, SharedSettings};
use crate::metrics::Metrics;
use crate::rate_limit::RateLimiter;
use crate::routes::{self, AppState};
use crate::spool::Spool;
use crate::store::Store;

pub struct Application {
    port: u16,
    server: Server,
    store: Store,
    tree: Tree,
    escalation: Escalation,
    shutdown_grace: std::time::Duration,
    limiter: Arc<RateLimiter>,
}

/// Why the service stops.
enum StopReason {
    /// Someone stopped the server through its handle (tests, benchmarks).
    Stopped(std::io::Result<()>),
    Signal(&'static str),
    Escalated(String),
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
        let spool = Spool::open(&settings.intake.spool_dir);
        let (restarts, escalation) = RestartLog::new(&settings.supervision);
        let metrics = Metrics::default();
        let services = Services {
            store: store.clone(),
            spool,
            restarts,
            alerts: Alerts::new(store.clone(), &settings.alerts),
            metrics: metrics.clone(),
        };
        let grace = settings.server.shutdown_grace;
        let settings = SharedSettings::new(settings);
        let tree = Overseer::start(&settings, instance_id, services);
        let limiter = Arc::new(RateLimiter::default());
        let state = web::Data::new(AppState {
            settings,
            store: store.clone(),
            tree: tree.clone(),
            limiter: limiter.clone(),
            metrics,
            figures: Default::default(),
        });
        actix_web::rt::spawn(crate::reload::reload_on_sighup(
            state.settings.clone(),
            state.tree.clone(),
        ));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(extra_routes)
                .configure(|config| routes::configure(config, &state.settings))
        })
        .listen(listener)?
        .disable_signals()
        .shutdown_timeout(grace.as_secs().max(1))
        .run();
        Ok(Self {
            port,
            server,
            store,
            tree,
            escalation,
            shutdown_grace: grace,
            limiter,
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

    /// The rate limiter the server's requests go through (tests drive a
    /// flood through it without a request per address).
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    /// Serves until SIGTERM / ctrl-c, an exceeded restart intensity, or a
    /// stop through [`Application::handle`]; then shuts down gracefully.
    /// An escalation ends in an error (the process exits non-zero).
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let handle = self.server.handle();
        let mut server = self.server;
        let reason = tokio::select! {
            served = &mut server => StopReason::Stopped(served),
            signal = shutdown_signal() => StopReason::Signal(signal),
            reason = self.escalation.wait() => StopReason::Escalated(reason),
        };
        // Whatever is still running after the grace gets this long to end.
        let last_call = std::time::Duration::from_secs(1);
        if !matches!(reason, StopReason::Stopped(_)) {
            let grace = self.shutdown_grace;
            tracing::info!(grace = %humantime::format_duration(grace), "shutting down: refusing new leads, letting calls in flight finish");
            self.tree.draining.store(true, Ordering::Relaxed);
            if let Err(error) = self.tree.router.send(Drain { grace }).await {
                tracing::error!(%error, "router unavailable at shutdown; leases run out instead");
            }
            // The server future runs the stop command: poll both.
            let stopped = futures_util::future::join(handle.stop(true), server);
            if actix_web::rt::time::timeout(last_call, stopped)
                .await
                .is_err()
            {
                tracing::warn!("HTTP requests still open at shutdown");
            }
        }
        let close_within = match reason {
            StopReason::Stopped(_) => self.shutdown_grace,
            _ => last_call,
        };
        if actix_web::rt::time::timeout(close_within, self.store.close())
            .await
            .is_err()
        {
            tracing::warn!("database queries still running at shutdown");
        }
        self.tree.routing_thread.stop();
        match reason {
            StopReason::Stopped(served) => Ok(served?),
            StopReason::Signal(signal) => {
                tracing::info!(signal, "stopped");
                Ok(())
            }
            StopReason::Escalated(reason) => Err(anyhow::anyhow!(reason)),
        }
    }
}

/// Waits for SIGTERM or ctrl-c (SIGINT); returns which.
async fn shutdown_signal() -> &'static str {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return "SIGINT";
            }
        };
    tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
