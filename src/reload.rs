//! Configuration reload without a restart (`POST /v1/admin/reload`, SIGHUP).
//!
//! The file the service started from is read and validated again; an
//! invalid file is refused with every problem listed and the running
//! configuration stays. A valid one replaces the settings whole: sources,
//! rate limits, tokens and buyers take effect for new requests and new
//! attempts (buyers added get an actor, changed ones are reconfigured,
//! removed ones leave the directory). Stored attempt snapshots keep the old
//! values. Sections that only a restart can change are reported.

use serde::Serialize;

use crate::actors::router::ApplyBuyers;
use crate::actors::Tree;
use crate::config::{self, Problem, Settings, SharedSettings};

/// What a reload changed.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReloadReport {
    pub reloaded: bool,
    pub buyers_added: Vec<String>,
    pub buyers_removed: Vec<String>,
    pub buyers_changed: Vec<String>,
    /// Sections that changed in the file but take effect only after a restart.
    pub restart_needed: Vec<&'static str>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the service was not started from a configuration file")]
    NoFile,
    #[error("the configuration file is invalid; the running configuration is kept")]
    Invalid(Vec<Problem>),
    #[error("the configuration file cannot be read: {0}")]
    Unreadable(String),
    #[error("the router did not take the new buyers: {0}")]
    Router(String),
}

/// Reads, validates and applies the configuration file.
pub async fn reload(settings: &SharedSettings, tree: &Tree) -> Result<ReloadReport, ReloadError> {
    let running = settings.current();
    let path = running.source_path.clone().ok_or(ReloadError::NoFile)?;
    let fresh = config::load(&path).map_err(|error| match error {
        config::ConfigError::Invalid { problems, .. } => ReloadError::Invalid(problems),
        other => ReloadError::Unreadable(other.to_string()),
    })?;
    let report = compare(&running, &fresh);
    tree.router
        .send(ApplyBuyers {
            buyers: fresh
                .buyers
                .iter()
                .cloned()
                .map(std::sync::Arc::new)
                .collect(),
        })
        .await
        .map_err(|error| ReloadError::Router(error.to_string()))?;
    settings.replace(fresh);
    tracing::info!(
        added = report.buyers_added.join(","),
        removed = report.buyers_removed.join(","),
        changed = report.buyers_changed.join(","),
        restart_needed = report.restart_needed.join(","),
        "configuration reloaded"
    );
    Ok(report)
}

/// Listens for SIGHUP from now on (before the service says it is up, so
/// an early SIGHUP reloads instead of killing the process) and reloads on
/// each, logging the outcome. Spawn the returned future.
pub fn reload_on_sighup(
    settings: SharedSettings,
    tree: Tree,
) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let hangups = signal(SignalKind::hangup());
    async move {
        let mut hangups = match hangups {
            Ok(hangups) => hangups,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGHUP; reload with POST /v1/admin/reload");
                return;
            }
        };
        reload_each(&mut hangups, &settings, &tree).await;
    }
}

async fn reload_each(
    hangups: &mut tokio::signal::unix::Signal,
    settings: &SharedSettings,
    tree: &Tree,
) {
    while hangups.recv().await.is_some() {
        match reload(settings, tree).await {
            Ok(_) => {}
            Err(ReloadError::Invalid(problems)) => {
                let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
                tracing::error!(
                    problems = listed.join("; "),
                    "SIGHUP: configuration refused; the running one is kept"
                );
            }
            Err(error) => tracing::error!(%error, "SIGHUP: configuration not reloaded"),
        }
    }
}

fn compare(running: &Settings, fresh: &Settings) -> ReloadReport {
    let ids = |settings: &Settings| -> Vec<String> {
        settings
            .buyers
            .iter()
            .map(|buyer| buyer.id.clone())
            .collect()
    };
    let (before, after) = (ids(running), ids(fresh));
    let changed = fresh
        .buyers
        .iter()
        .filter(|buyer| {
            running
                .buyers
                .iter()
                .any(|old| old.id == buyer.id && old.snapshot != buyer.snapshot)
        })
        .map(|buyer| buyer.id.clone())
        .collect();
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    let mut restart_needed = Vec::new();
    for (section, changed) in [
        (
            "server.listen",
            running.server.listen != fresh.server.listen,
        ),
        (
            "database",
            running.database.url != fresh.database.url
                || differs(
                    &running.database.max_connections,
                    &fresh.database.max_connections,
                )
                || differs(
                    &running.database.acquire_timeout,
                    &fresh.database.acquire_timeout,
                ),
        ),
        ("intake", differs(&running.intake, &fresh.intake)),
        ("routing", differs(&running.routing, &fresh.routing)),
        ("alerts", differs(&running.alerts, &fresh.alerts)),
        (
            "supervision",
            differs(&running.supervision, &fresh.supervision),
        ),
        ("notify", differs(&running.notify, &fresh.notify)),
        ("events", differs(&running.events, &fresh.events)),
        ("log", running.log.format != fresh.log.format),
    ] {
        if changed {
            restart_needed.push(section);
        }
    }
    ReloadReport {
        reloaded: true,
        buyers_added: after
            .iter()
            .filter(|id| !before.contains(id))
            .cloned()
            .collect(),
        buyers_removed: before
            .iter()
            .filter(|id| !after.contains(id))
            .cloned()
            .collect(),
        buyers_changed: changed,
        restart_needed,
    }
}
