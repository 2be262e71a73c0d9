//! [`Destination`]: where deliveries go (a notify channel or an event
//! sink), with what each kind's settings say about its tries.

use std::sync::Arc;

use crate::config::{EventSettings, NotifyRole, NotifySettings, EVENTS};
use crate::domain::{AttemptKind, ConfigSnapshot};
use crate::store::{ConfirmEffect, DeliveryTarget};

/// Where deliveries go: a notify channel, or an event sink.
#[derive(Debug, Clone)]
pub enum Destination {
    Channel(Arc<NotifySettings>),
    Sink(Arc<EventSettings>),
}

impl Destination {
    pub fn id(&self) -> &str {
        match self {
            Self::Channel(channel) => &channel.id,
            Self::Sink(sink) => &sink.id,
        }
    }

    pub fn kind(&self) -> AttemptKind {
        match self {
            Self::Channel(_) => AttemptKind::Notify,
            Self::Sink(_) => AttemptKind::Event,
        }
    }

    /// One target per channel; one per subscribed event of a sink.
    pub fn targets(&self) -> Vec<DeliveryTarget> {
        match self {
            Self::Channel(channel) => vec![DeliveryTarget::notify(&channel.id)],
            Self::Sink(sink) => EVENTS
                .into_iter()
                .filter(|event| sink.on.iter().any(|name| name == event))
                .map(|event| DeliveryTarget::event(&sink.id, event))
                .collect(),
        }
    }

    pub fn timeout(&self) -> std::time::Duration {
        match self {
            Self::Channel(channel) => channel.timeout,
            Self::Sink(sink) => sink.timeout,
        }
    }

    pub fn retry_backoff(&self) -> std::time::Duration {
        match self {
            Self::Channel(channel) => channel.retry_backoff,
            Self::Sink(sink) => sink.retry_backoff,
        }
    }

    pub fn max_concurrency(&self) -> usize {
        match self {
            Self::Channel(channel) => channel.max_concurrency.max(1) as usize,
            Self::Sink(_) => 4,
        }
    }

    /// What a confirmation by this destination does to the lead.
    pub fn confirm_effect(&self) -> ConfirmEffect {
        match self {
            Self::Channel(channel) => ConfirmEffect {
                manager_notified: channel.role == NotifyRole::Manager,
                crm_synced: channel.role == NotifyRole::Crm,
                accepts: channel.required,
            },
            Self::Sink(_) => ConfirmEffect::default(),
        }
    }

    /// The configuration a try used, as its attempt row keeps it (no secret).
    pub fn snapshot(&self) -> ConfigSnapshot {
        ConfigSnapshot::of(match self {
            Self::Channel(channel) => serde_json::json!({
                "id": channel.id,
                "kind": channel.kind.as_str(),
                "role": channel.role.as_str(),
                "required": channel.required,
                "timeout_ms": channel.timeout.as_millis() as u64,
            }),
            Self::Sink(sink) => serde_json::json!({
                "id": sink.id,
                "on": sink.on,
                "timeout_ms": sink.timeout.as_millis() as u64,
            }),
        })
    }
}
