//! Alerts (SPEC section 8): to the error log, to `alerts.webhook_url` (one
//! JSON POST each, with a Slack-compatible `text`), and to the `alerts`
//! table, which `GET /v1/alerts` lists. The same (kind, buyer) alert goes to
//! the log and the webhook at most once per `alerts.min_interval`; the ones
//! held back are still kept, with `notified: false`. Delivery never affects
//! a lead: the webhook is called from a task of its own, and a failure to
//! deliver or keep an alert is only logged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde_json::json;
use tokio::sync::mpsc;

use crate::config::AlertSettings;
use crate::store::Store;

/// How long one webhook delivery may take.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// What an alert is about (`alerts.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlertKind {
    CircuitOpened,
    CircuitClosed,
    PostTimeout,
    /// The database was unreachable; leads went to the spool.
    SpoolInUse,
    /// The database was unreachable and the spool could not take a lead.
    IntakeFailed,
    /// A lead went unsold with no rejection: every buyer failed or was skipped
    /// for its circuit or load.
    AllBuyersFailed,
    /// A lead was set aside for review after repeated routing failures.
    RoutingFailed,
    /// A notify delivery or event was given up after a day of tries.
    DeliveryFailed,
}

impl AlertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpened => "circuit_opened",
            Self::CircuitClosed => "circuit_closed",
            Self::PostTimeout => "post_timeout",
            Self::SpoolInUse => "spool_in_use",
            Self::IntakeFailed => "intake_failed",
            Self::AllBuyersFailed => "all_buyers_failed",
            Self::RoutingFailed => "routing_failed",
            Self::DeliveryFailed => "delivery_failed",
        }
    }
}

/// Raises alerts; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Alerts {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    min_interval: Duration,
    last_notified: DashMap<(AlertKind, Option<String>), Instant>,
    webhook: Option<mpsc::UnboundedSender<serde_json::Value>>,
}

impl Alerts {
    /// Starts the webhook sender (on the current arbiter) when a URL is set.
    pub fn new(store: Store, settings: &AlertSettings) -> Self {
        let webhook = (!settings.webhook_url.trim().is_empty())
            .then(|| start_webhook(settings.webhook_url.clone()));
        Self {
            inner: Arc::new(Inner {
                store,
                min_interval: settings.min_interval,
                last_notified: DashMap::new(),
                webhook,
            }),
        }
    }

    /// Logs and delivers the alert unless the same (kind, buyer) alert was
    /// within `min_interval`, and keeps it in the database either way.
    pub async fn raise(
        &self,
        kind: AlertKind,
        buyer_id: Option<&str>,
        lead_id: Option<&str>,
        message: &str,
    ) {
        let notified = self.due(kind, buyer_id);
        if notified {
            tracing::error!(alert = kind.as_str(), buyer_id, lead_id, "{message}");
            if let Some(webhook) = &self.inner.webhook {
                let body = json!({
                    "text": format!("[leadrouter] {}: {message}", kind.as_str()),
                    "kind": kind.as_str(),
                    "buyer_id": buyer_id,
                    "lead_id": lead_id,
                    "message": message,
                    "at": chrono::Utc::now(),
                });
                let _ = webhook.send(body);
            }
        } else {
            tracing::warn!(
                alert = kind.as_str(),
                buyer_id,
                lead_id,
                "alert held back by alerts.min_interval: {message}"
            );
        }
        if let Err(error) = self
            .inner
            .store
            .record_alert(kind.as_str(), buyer_id, lead_id, message, notified)
            .await
        {
            tracing::error!(%error, alert = kind.as_str(), "could not keep the alert");
        }
    }

    /// True (and remembered) when this (kind, buyer) may be notified now.
    fn due(&self, kind: AlertKind, buyer_id: Option<&str>) -> bool {
        let now = Instant::now();
        let key = (kind, buyer_id.map(str::to_string));
        let mut due = false;
        self.inner
            .last_notified
            .entry(key)
            .and_modify(|last| {
                if now.duration_since(*last) >= self.inner.min_interval {
                    *last = now;
                    due = true;
                }
            })
            .or_insert_with(|| {
                due = true;
                now
            });
        due
    }
}

/// One task posts the alerts in order; a slow or failing webhook delays
/// only other alerts.
fn start_webhook(url: String) -> mpsc::UnboundedSender<serde_json::Value> {
    let (sender, mut alerts) = mpsc::unbounded_channel::<serde_json::Value>();
    actix_web::rt::spawn(async move {
        let client = awc::Client::builder().timeout(WEBHOOK_TIMEOUT).finish();
        while let Some(alert) = alerts.recv().await {
            match client.post(&url).send_json(&alert).await {
                Ok(response) if response.status().is_success() => {}
                Ok(response) => {
                    tracing::warn!(
                        status = response.status().as_u16(),
                        "alert webhook refused an alert"
                    )
                }
                Err(error) => tracing::warn!(%error, "alert webhook unreachable"),
            }
        }
    });
    sender
}
