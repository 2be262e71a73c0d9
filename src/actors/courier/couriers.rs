//! [`Couriers`]: one courier started per notify channel and event sink,
//! and what intake and the status views ask of them all.

use std::sync::Arc;

use actix::prelude::*;

use super::actor::{Courier, Deliver};
use super::shared::{ChannelHealth, Confirmations, CourierEnvironment, DeliveryBoard};
use crate::config::SharedSettings;
use crate::notify::Destination;

/// The couriers, for intake and the status views.
#[derive(Clone, Default)]
pub struct Couriers {
    pub channels: Vec<Addr<Courier>>,
    pub sinks: Vec<Addr<Courier>>,
    pub confirmations: Confirmations,
    pub board: DeliveryBoard,
}

impl Couriers {
    /// Starts one courier per notify channel and event sink.
    pub fn start(shared: &SharedSettings, environment: CourierEnvironment) -> Self {
        let settings = shared.current();
        let channels: Vec<Destination> = settings
            .notify
            .iter()
            .cloned()
            .map(|channel| Destination::Channel(Arc::new(channel)))
            .collect();
        let sinks: Vec<Destination> = settings
            .events
            .iter()
            .cloned()
            .map(|sink| Destination::Sink(Arc::new(sink)))
            .collect();
        let start = |destination: Destination| {
            let environment = environment.clone();
            Supervisor::start(move |_| Courier::new(destination, environment))
        };
        Self {
            channels: channels.into_iter().map(start).collect(),
            sinks: sinks.into_iter().map(start).collect(),
            confirmations: environment.confirmations.clone(),
            board: environment.board.clone(),
        }
    }

    /// Every channel's and sink's health, in configuration order.
    pub fn health(&self, settings: &crate::config::Settings) -> Vec<ChannelHealth> {
        let ids = settings
            .notify
            .iter()
            .map(|channel| channel.id.as_str())
            .chain(settings.events.iter().map(|sink| sink.id.as_str()));
        ids.filter_map(|id| self.board.get(id).map(|health| health.clone()))
            .collect()
    }

    /// Hands stored leads to every notify channel now.
    pub fn deliver(&self, lead_ids: &[String]) {
        if lead_ids.is_empty() {
            return;
        }
        for channel in &self.channels {
            channel.do_send(Deliver {
                lead_ids: lead_ids.to_vec(),
            });
        }
    }
}
