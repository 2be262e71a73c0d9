//! `Overseer`: starts the service's actors under actix supervision and hands
//! out their addresses. (Named so it does not clash with `actix::Supervisor`.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use actix::{Addr, AsyncContext, Supervisor};

use super::buyer::Buyer;
use super::router::Router;
use super::waterfall::{BuyerHandle, RoutingContext};
use super::{Intake, IntakeRules};
use crate::buyer::board::Board;
use crate::config::Settings;
use crate::store::{DuplicateRule, Store};

/// Addresses of the running actors, for the HTTP handlers.
#[derive(Clone)]
pub struct Tree {
    pub intake: Addr<Intake>,
    pub router: Addr<Router>,
    pub buyers: HashMap<String, Addr<Buyer>>,
    /// Each buyer's live status, published by its actor.
    pub board: Board,
}

/// Root of the actor tree: starts each actor under `actix::Supervisor`,
/// which restarts it when it stops; each `restarting` hook logs the restart
/// and resets what was only in memory.
pub struct Overseer;

impl Overseer {
    /// Starts every actor on the current arbiter. `instance_id` names this
    /// process in leases and attempt rows.
    pub fn start(store: Store, settings: &Settings, instance_id: Arc<str>) -> Tree {
        let board = Board::default();
        let pii_fields = Arc::new(settings.routing.pii_fields.clone());
        let mut buyer_settings: Vec<_> = settings.buyers.iter().cloned().map(Arc::new).collect();
        buyer_settings.sort_by_key(|buyer| buyer.priority);
        let sweep_interval = settings.routing.sweep_interval;
        let lease = settings.routing.lease;
        let reserve_price = settings.routing.reserve_price;

        // Filled in by the router's constructor, which runs at once.
        let started_buyers: Rc<RefCell<HashMap<String, Addr<Buyer>>>> = Rc::default();
        let router = {
            let (store, board, buyers) = (store.clone(), board.clone(), started_buyers.clone());
            Supervisor::start(move |ctx: &mut actix::Context<Router>| {
                let handles: Vec<BuyerHandle> = buyer_settings
                    .into_iter()
                    .map(|settings| {
                        let (buyer_store, buyer_board, pii) =
                            (store.clone(), board.clone(), pii_fields.clone());
                        let router = ctx.address().recipient();
                        let for_actor = settings.clone();
                        let addr = Supervisor::start(move |_| {
                            Buyer::new(for_actor, pii, buyer_store, buyer_board, router)
                        });
                        buyers
                            .borrow_mut()
                            .insert(settings.id.clone(), addr.clone());
                        BuyerHandle { settings, addr }
                    })
                    .collect();
                let routing = RoutingContext {
                    store,
                    buyers: handles,
                    lease,
                    reserve_price,
                    instance_id,
                };
                Router::new(Arc::new(routing), sweep_interval)
            })
        };
        let rules = IntakeRules {
            duplicates: DuplicateRule {
                window: settings.intake.duplicate_window,
                keys: settings.intake.duplicate_keys.clone(),
            },
            awaiting_required_notify: settings.notify.iter().any(|channel| channel.required),
        };
        let route_to = router.clone().recipient();
        let intake = Supervisor::start(move |_| Intake::new(store, rules, route_to));
        let buyers = started_buyers.take();
        Tree {
            intake,
            router,
            buyers,
            board,
        }
    }
}
