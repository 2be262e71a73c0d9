//! `Overseer`: starts the service's actors under actix supervision and hands
//! out their addresses. (Named so it does not clash with `actix::Supervisor`.)
//!
//! One-for-one: each actor is restarted alone when it stops or panics
//! (see `supervision`), every restart counts toward the restart intensity,
//! and past it the service stops. Waterfalls are temporary: one that dies is
//! not restarted, its lead is released and swept up again.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use actix::{Addr, Arbiter, ArbiterHandle, AsyncContext, Supervisor};

use super::buyer::{start_buyer, BuyerEnvironment, InjectedPanics};
use super::courier::{CourierEnvironment, Couriers};
use super::directory::{BuyerDirectory, BuyerHandle};
use super::drainer::SpoolDrainer;
use super::intake::IntakeTargets;
use super::router::{widest, Router};
use super::routing_context::RoutingContext;
use super::supervision::RestartLog;
use super::yielding::IntakeDelay;
use super::{Intake, IntakeRules};
use crate::alerts::Alerts;
use crate::buyer::board::Board;
use crate::config::SharedSettings;
use crate::metrics::Metrics;
use crate::spool::Spool;
use crate::store::{FailurePolicy, Store};

/// Addresses of the running actors, for the HTTP handlers.
#[derive(Clone)]
pub struct Tree {
    pub intake: Addr<Intake>,
    pub router: Addr<Router>,
    pub buyers: BuyerDirectory,
    /// Each buyer's live status, published by its actor.
    pub board: Board,
    pub spool: Spool,
    /// Set at shutdown: intake refuses leads, waterfalls stop.
    pub draining: Arc<AtomicBool>,
    /// This process in leases and attempt rows.
    pub instance_id: Arc<str>,
    /// Notify channels (and the event sinks' health on their board).
    pub couriers: Couriers,
    /// The thread the router, the buyers and the walks run on, at a lower
    /// CPU priority than intake's (see `threads`).
    pub routing_thread: ArbiterHandle,
}

/// What the actors share besides the settings.
pub struct Services {
    pub store: Store,
    pub spool: Spool,
    pub restarts: RestartLog,
    pub alerts: Alerts,
    pub metrics: Metrics,
}

/// Root of the actor tree.
pub struct Overseer;

impl Overseer {
    /// Starts the router (and through it the buyers and the walks) on a
    /// routing thread of its own, at a lower CPU priority; intake and the
    /// spool drainer on the store's intake thread; the rest on the current
    /// arbiter. `instance_id` names this process in leases and attempt rows.
    pub fn start(shared: &SharedSettings, instance_id: Arc<str>, services: Services) -> Tree {
        let settings = &*shared.current();
        let Services {
            store,
            spool,
            restarts,
            alerts,
            metrics,
        } = services;
        let board = Board::default();
        let draining = Arc::new(AtomicBool::new(false));
        let buyer_settings: Vec<_> = settings.buyers.iter().cloned().map(Arc::new).collect();
        let faults = settings.faults.clone();
        let sweep_interval = settings.routing.sweep_interval;
        let intake_delay = IntakeDelay::default();
        let routing = RoutingContext {
            store: store.clone(),
            directory: BuyerDirectory::default(),
            lease: settings.routing.lease,
            reserve_price: settings.routing.reserve_price,
            instance_id: instance_id.clone(),
            draining: draining.clone(),
            alerts: alerts.clone(),
            failures: FailurePolicy {
                limit: settings.routing.failure_limit.max(1),
                backoff: settings.routing.failure_backoff,
            },
            clock: settings.clock,
            mode: settings.routing.mode,
            auction_window: settings.routing.auction_window,
            settings: shared.clone(),
        };

        let directory = BuyerDirectory::default();
        let routing = RoutingContext {
            directory: directory.clone(),
            ..routing
        };
        let routing_thread = Arbiter::new().handle();
        routing_thread.spawn_fn(crate::threads::become_routing);
        let router = {
            let (pii_fields, store, board, restarts, alerts) = (
                Arc::new(settings.routing.pii_fields.clone()),
                store.clone(),
                board.clone(),
                restarts.clone(),
                alerts.clone(),
            );
            let metrics = metrics.clone();
            let directory = directory.clone();
            let intake_delay = intake_delay.clone();
            Supervisor::start_in_arbiter(
                &routing_thread,
                move |ctx: &mut actix::Context<Router>| {
                    let environment = BuyerEnvironment {
                        pii_fields,
                        store,
                        board,
                        router: ctx.address().recipient(),
                        restarts: restarts.clone(),
                        alerts,
                        metrics,
                    };
                    // Runs once: a restarted router keeps its buyers.
                    if directory.all().is_empty() {
                        directory.replace(
                            buyer_settings
                                .into_iter()
                                .map(|settings| {
                                    let count =
                                        |table: &std::collections::BTreeMap<String, u32>| {
                                            table.get(&settings.id).copied().unwrap_or(0)
                                        };
                                    let panics = InjectedPanics {
                                        calls: count(&faults.buyer_panics),
                                        probes: count(&faults.probe_panics),
                                    };
                                    BuyerHandle {
                                        addr: start_buyer(
                                            settings.clone(),
                                            environment.clone(),
                                            panics,
                                        ),
                                        settings,
                                    }
                                })
                                .collect(),
                        );
                    }
                    let buyers = directory.all();
                    Router::new(
                        Arc::new(routing),
                        sweep_interval,
                        restarts,
                        environment,
                        intake_delay.clone(),
                        widest(buyers.iter().map(|buyer| &*buyer.settings)),
                        faults.router_panics,
                    )
                },
            )
        };
        let rules = IntakeRules {
            duplicates: settings.duplicate_rule(),
            write_deadline: settings.database.acquire_timeout * 2,
            max_pending: settings.intake.max_pending,
        };
        let couriers = Couriers::start(
            shared,
            CourierEnvironment {
                store: store.clone(),
                instance_id: instance_id.clone(),
                alerts: alerts.clone(),
                restarts: restarts.clone(),
                confirmations: Default::default(),
                board: Default::default(),
            },
        );
        let intake_thread = store.intake_thread();
        let targets = IntakeTargets {
            store,
            spool: spool.clone(),
            route_to: router.clone().recipient(),
            alerts,
            metrics: metrics.clone(),
            couriers: couriers.clone(),
            delay: intake_delay,
        };
        let intake = {
            let (targets, rules, restarts) = (targets.clone(), rules.clone(), restarts.clone());
            Supervisor::start_in_arbiter(&intake_thread, move |_| {
                Intake::new(targets, rules, restarts)
            })
        };
        Supervisor::start_in_arbiter(&intake_thread, move |_| {
            SpoolDrainer::new(targets, rules, restarts)
        });
        Tree {
            intake,
            router,
            buyers: directory,
            board,
            spool,
            draining,
            instance_id,
            couriers,
            routing_thread,
        }
    }
}
