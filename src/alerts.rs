//! Raising an alert: the error log and the `alerts` table. Alert delivery
//! never affects a lead: a failure to keep an alert is only logged.

use crate::store::Store;

/// What an alert is about (`alerts.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertKind {
    CircuitOpened,
    CircuitClosed,
    PostTimeout,
}

impl AlertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpened => "circuit_opened",
            Self::CircuitClosed => "circuit_closed",
            Self::PostTimeout => "post_timeout",
        }
    }
}

/// Logs the alert and keeps it in the database.
pub async fn raise(
    store: &Store,
    kind: AlertKind,
    buyer_id: Option<&str>,
    lead_id: Option<&str>,
    message: &str,
) {
    tracing::error!(alert = kind.as_str(), buyer_id, lead_id, "{message}");
    if let Err(error) = store
        .record_alert(kind.as_str(), buyer_id, lead_id, message)
        .await
    {
        tracing::error!(%error, alert = kind.as_str(), "could not keep the alert");
    }
}
