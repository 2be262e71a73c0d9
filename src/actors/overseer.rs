//! `Overseer`: starts the service's actors under actix supervision and hands
//! out their addresses. (Named so it does not clash with `actix::Supervisor`.)

use actix::{Actor, Addr, Context, Supervisor};

use super::{Intake, IntakeRules};
use crate::store::Store;

/// Addresses of the running actors, for the HTTP handlers.
#[derive(Clone)]
pub struct Tree {
    pub intake: Addr<Intake>,
}

/// Root of the actor tree. Each child runs under `actix::Supervisor`, which
/// restarts it when it stops; its `restarting` hook logs the restart and
/// resets what was only in memory.
pub struct Overseer {
    tree: Tree,
}

impl Overseer {
    /// Starts the overseer and its children on the current arbiter.
    pub fn start(store: Store, rules: IntakeRules) -> (Addr<Self>, Tree) {
        let intake = Supervisor::start(move |_| Intake::new(store, rules));
        let tree = Tree { intake };
        let overseer = Self { tree: tree.clone() }.start();
        (overseer, tree)
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }
}

impl Actor for Overseer {
    type Context = Context<Self>;
}
