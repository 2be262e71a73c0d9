//! What `actix::Supervisor` lacks: restart intensity and panic handling.
//!
//! `actix::Supervisor` restarts an actor when it stops, but not when a
//! handler panics (the actor's task just dies), and it restarts forever.
//! [`guarded`] turns a panic in an actor's future into a stop, so its
//! supervisor restarts it; [`RestartLog`] counts restarts as OTP does (at
//! most `supervision.max_restarts` within `supervision.period`) and, past
//! that, escalates: the service stops loudly rather than spin.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::FutureExt;
use tokio::sync::watch;

use crate::config::SupervisionSettings;

/// Every actor restart in this process, for the intensity limit.
#[derive(Clone)]
pub struct RestartLog {
    max_restarts: usize,
    period: Duration,
    recent: Arc<Mutex<VecDeque<Instant>>>,
    escalate: Arc<watch::Sender<Option<String>>>,
}

/// Resolves when supervision gives up; the service then shuts down.
pub struct Escalation(watch::Receiver<Option<String>>);

impl RestartLog {
    pub fn new(settings: &SupervisionSettings) -> (Self, Escalation) {
        let (escalate, escalation) = watch::channel(None);
        let log = Self {
            max_restarts: settings.max_restarts as usize,
            period: settings.period,
            recent: Arc::default(),
            escalate: Arc::new(escalate),
        };
        (log, Escalation(escalation))
    }

    /// Logs a restart of `actor`; past the intensity limit, escalates.
    pub fn restarted(&self, actor: &str) {
        let now = Instant::now();
        let restarts = {
            let mut recent = self
                .recent
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            recent.retain(|at| now.duration_since(*at) < self.period);
            recent.push_back(now);
            recent.len()
        };
        tracing::warn!(
            actor,
            restarts,
            max_restarts = self.max_restarts,
            period = %humantime::format_duration(self.period),
            "actor restarted; its work in flight is recovered from the database"
        );
        if restarts > self.max_restarts {
            let reason = format!(
                "restart intensity exceeded: {restarts} actor restarts within {} (last: {actor}); stopping the service",
                humantime::format_duration(self.period)
            );
            tracing::error!("{reason}");
            self.escalate.send_replace(Some(reason));
        }
    }
}

impl Escalation {
    /// Waits until the restart intensity is exceeded; returns why.
    pub async fn wait(mut self) -> String {
        loop {
            if let Some(reason) = self.0.borrow().clone() {
                return reason;
            }
            if self.0.changed().await.is_err() {
                // Every restart log is gone: nothing can escalate any more.
                return std::future::pending().await;
            }
        }
    }
}

/// Runs `future` in an actor's context; if it panics, logs the panic and
/// stops the actor (its supervisor restarts it) and yields `None`.
pub fn guarded<A, F>(
    actor: &'static str,
    future: F,
) -> impl ActorFuture<A, Output = Option<F::Output>>
where
    A: Actor<Context = Context<A>>,
    F: Future + 'static,
{
    actix::fut::wrap_future::<_, A>(AssertUnwindSafe(future).catch_unwind()).map(
        move |result, _actor, ctx: &mut Context<A>| match result {
            Ok(output) => Some(output),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|text| text.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                tracing::error!(actor, panic = %message, "actor panicked; stopping it for its supervisor to restart");
                ctx.stop();
                None
            }
        },
    )
}
