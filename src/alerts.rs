//! Raising an alert: the error log and the `alerts` table. Alert delivery
//! never affects a lead: a failure to keep an alert is only logged.

use crate::store::Store;

/// What an alert is about (`alerts.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertKind {
    CircuitOpened,
    CircuitClosed,
    PostTimeout,
    /// The database was unreachable; leads went to the spool.
    SpoolInUse,
    /// The database was unreachable and the spool could not take a lead.
    IntakeFailed,
}

impl AlertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpened => "circuit_opened",
            Self::CircuitClosed => "circuit_closed",
            Self::PostTimeout => "post_timeout",
            Self::SpoolInUse => "spool_in_use",
            Self::IntakeFailed => "intake_failed",
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
