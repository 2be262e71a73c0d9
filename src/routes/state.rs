//! [`AppState`]: what every handler shares.

use std::sync::Arc;

use super::figures::FiguresCache;
use crate::actors::Tree;
use crate::config::{Settings, SharedSettings};
use crate::metrics::Metrics;
use crate::rate_limit::RateLimiter;
use crate::store::Store;

/// What handlers share: settings, the store, the actors, the rate limiter.
pub struct AppState {
    /// Replaced whole by a reload; take [`AppState::settings`] per request.
    pub settings: SharedSettings,
    pub store: Store,
    pub tree: Tree,
    pub limiter: Arc<RateLimiter>,
    pub metrics: Metrics,
    /// What `/v1/status` and `/metrics` read, at most once a second.
    pub figures: FiguresCache,
}

impl AppState {
    /// The settings now.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.current()
    }
}
