//! `Overseer`: starts the service's actors under actix supervision and hands
//! out their addresses. (Named so it does not clash with `actix::Supervisor`.)
//!
//! One-for-one: each actor is restarted alone when it stops or panics
//! (see `supervision`), every restart counts toward the restart intensity,
//! and past it the service stops. Waterfalls are temporary: one that dies is
//! not restarted, its lead is released and swept up again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use actix::{Addr, AsyncContext, Supervisor};

use super::buyer::{Buyer, BuyerEnvironment};
use super::drainer::SpoolDrainer;
use super::intake::IntakeTargets;
use super::router::Router;
use super::supervision::RestartLog;
use super::waterfall::{BuyerHandle, RoutingContext};
use super::{Intake, IntakeRules};
use crate::buyer::board::Board;
use crate::config::Settings;
use crate::spool::Spool;
use crate::store::{DuplicateRule, Store};

/// Addresses of the running actors, for the HTTP handlers.
#[derive(Clone)]
pub struct Tree {
    pub intake: Addr<Intake>,
    pub router: Addr<Router>,
    pub buyers: HashMap<String, Addr<Buyer>>,
    /// Each buyer's live status, published by its actor.
    pub board: Board,
    pub spool: Spool,
    /// Set at shutdown: intake refuses leads, waterfalls stop.
    pub draining: Arc<AtomicBool>,
}

/// Root of the actor tree.
pub struct Overseer;

impl Overseer {
    /// Starts every actor on the current arbiter. `instance_id` names this
    /// process in leases and attempt rows.
    pub fn start(
        store: Store,
        spool: Spool,
        settings: &Settings,
        instance_id: Arc<str>,
        restarts: RestartLog,
    ) -> Tree {
        let board = Board::default();
        let draining = Arc::new(AtomicBool::new(false));
        let mut buyer_settings: Vec<_> = settings.buyers.iter().cloned().map(Arc::new).collect();
        buyer_settings.sort_by_key(|buyer| buyer.priority);
        let panics = settings.faults.buyer_panics.clone();
        let sweep_interval = settings.routing.sweep_interval;
        let routing = RoutingContext {
            store: store.clone(),
            buyers: Vec::new(),
            lease: settings.routing.lease,
            reserve_price: settings.routing.reserve_price,
            instance_id,
            draining: draining.clone(),
        };

        // Filled in by the router's constructor, which runs at once.
        let started_buyers: Rc<RefCell<HashMap<String, Addr<Buyer>>>> = Rc::default();
        let router = {
            let environment = (
                Arc::new(settings.routing.pii_fields.clone()),
                store.clone(),
                board.clone(),
                started_buyers.clone(),
                restarts.clone(),
            );
            Supervisor::start(move |ctx: &mut actix::Context<Router>| {
                let (pii_fields, store, board, buyers, restarts) = environment;
                let environment = BuyerEnvironment {
                    pii_fields,
                    store,
                    board,
                    router: ctx.address().recipient(),
                    restarts: restarts.clone(),
                };
                let handles: Vec<BuyerHandle> = buyer_settings
                    .into_iter()
                    .map(|settings| {
                        let (for_actor, environment) = (settings.clone(), environment.clone());
                        let panics = panics.get(&settings.id).copied().unwrap_or(0);
                        let addr =
                            Supervisor::start(move |_| Buyer::new(for_actor, environment, panics));
                        buyers
                            .borrow_mut()
                            .insert(settings.id.clone(), addr.clone());
                        BuyerHandle { settings, addr }
                    })
                    .collect();
                let routing = RoutingContext {
                    buyers: handles,
                    ..routing
                };
                Router::new(Arc::new(routing), sweep_interval, restarts)
            })
        };
        let rules = IntakeRules {
            duplicates: DuplicateRule {
                window: settings.intake.duplicate_window,
                keys: settings.intake.duplicate_keys.clone(),
            },
            awaiting_required_notify: settings.notify.iter().any(|channel| channel.required),
            write_deadline: settings.database.acquire_timeout * 2,
        };
        let targets = IntakeTargets {
            store,
            spool: spool.clone(),
            route_to: router.clone().recipient(),
        };
        let intake = {
            let (targets, rules, restarts) = (targets.clone(), rules.clone(), restarts.clone());
            Supervisor::start(move |_| Intake::new(targets, rules, restarts))
        };
        Supervisor::start(move |_| SpoolDrainer::new(targets, rules, restarts));
        let buyers = started_buyers.take();
        Tree {
            intake,
            router,
            buyers,
            board,
            spool,
            draining,
        }
    }
}
