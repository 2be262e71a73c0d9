//! `BuyerDirectory`: the configured buyers with their actors, in priority
//! order (ties keep file order). Shared by the router, the waterfalls and
//! the HTTP handlers; a reload replaces the list whole, and a waterfall
//! keeps the list it started with.

use std::sync::{Arc, RwLock};

use actix::Addr;

use super::buyer::Buyer;
use crate::config::BuyerSettings;

/// A configured buyer and its actor.
#[derive(Clone)]
pub struct BuyerHandle {
    pub settings: Arc<BuyerSettings>,
    pub addr: Addr<Buyer>,
}

#[derive(Clone, Default)]
pub struct BuyerDirectory(Arc<RwLock<Arc<Vec<BuyerHandle>>>>);

impl BuyerDirectory {
    /// The buyers now, by priority.
    pub fn all(&self) -> Arc<Vec<BuyerHandle>> {
        self.0
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    pub fn get(&self, buyer_id: &str) -> Option<BuyerHandle> {
        self.all()
            .iter()
            .find(|buyer| buyer.settings.id == buyer_id)
            .cloned()
    }

    /// Replaces the list; it is sorted by priority here.
    pub fn replace(&self, mut buyers: Vec<BuyerHandle>) {
        buyers.sort_by_key(|buyer| buyer.settings.priority);
        *self.0.write().unwrap_or_else(|poison| poison.into_inner()) = Arc::new(buyers);
    }
}
