//! One try of one delivery, from its attempt row to its answer's commit:
//! the message prepared and sent, a confirmation recorded (retried while
//! the claim's lease lasts), a failure retried after a backoff or, after a
//! day, given up with an alert.

use std::rc::Rc;
use std::time::Duration;

use chrono::Utc;

use super::shared::CourierEnvironment;
use crate::alerts::AlertKind;
use crate::domain::{CallOutcome, ConfigSnapshot};
use crate::notify::{self, Destination, SaleFacts, Transport};
use crate::store::{AfterFailure, DeliveryAnswer, DeliveryTarget, HeldDelivery, Store};
use crate::telemetry;

/// Deliveries are tried for this long after the row was made.
pub(super) const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// A backoff never grows past this.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// A claim outlives its try's timeout by this much. A try whose claim is
/// older than half of it when the attempt row is written is not sent (its
/// lease could run out mid-call), and a confirmation's write is retried
/// within it.
pub(super) const LEASE_MARGIN: Duration = Duration::from_secs(15);

/// One try of one delivery, from its attempt row to its answer's commit.
/// Yields whether it was confirmed.
pub(super) struct OneDelivery {
    pub(super) environment: CourierEnvironment,
    pub(super) destination: Destination,
    pub(super) snapshot: ConfigSnapshot,
    pub(super) target: DeliveryTarget,
    pub(super) held: HeldDelivery,
}

impl OneDelivery {
    pub(super) async fn run(self, transport: Rc<Transport>) -> bool {
        let store = &self.environment.store;
        let lead = &self.held.lead;
        let channel = self.destination.id();
        let sale = if self.target.event.as_deref() == Some("lead.sold") {
            sale_facts(store, &lead.id).await
        } else {
            SaleFacts::default()
        };
        let prepared =
            notify::prepare(&self.destination, lead, self.target.event.as_deref(), &sale);
        let shown = match &prepared {
            Ok(prepared) => prepared.shown.clone(),
            Err(error) => serde_json::json!({ "error": error }),
        };
        let attempt_id = match store
            .begin_delivery_attempt(
                &self.target,
                &lead.id,
                shown,
                self.snapshot.clone(),
                &self.environment.instance_id,
            )
            .await
        {
            Ok(id) => {
                telemetry::record_attempt_id(&id);
                id
            }
            Err(error) => {
                // Not sent: the row's lease runs out and it is tried again.
                tracing::warn!(lead_id = %lead.id, channel, %error, "delivery not recorded, so not sent");
                return false;
            }
        };
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::error!(lead_id = %lead.id, channel, %error, "delivery cannot be built");
                return self.failed(&attempt_id, not_sent(error)).await;
            }
        };
        if self.held.claimed_at.elapsed() > LEASE_MARGIN / 2 {
            // Its lease could run out mid-call and another instance send it.
            let late = "the claim was too old to send under; tried again".to_string();
            return self.failed(&attempt_id, not_sent(late)).await;
        }
        let answer = transport.send(prepared, self.destination.timeout()).await;
        // The lead, channel, kind and outcome are the span's.
        telemetry::record_answer(answer.outcome, answer.duration);
        tracing::info!(
            event = %self.target.event.as_deref().unwrap_or_default(),
            status = answer.http_status,
            "delivery tried"
        );
        if answer.outcome == CallOutcome::Accepted {
            self.confirmed(&attempt_id, &answer).await;
            true
        } else {
            self.failed(&attempt_id, answer).await
        }
    }

    /// Records the confirmation, retrying the write while the lease lasts
    /// (after it, the row may be sent again: at least once, never lost).
    async fn confirmed(&self, attempt_id: &str, answer: &DeliveryAnswer) {
        let store = &self.environment.store;
        let lead_id = self.held.lead.id.as_str();
        let effect = self.destination.confirm_effect();
        loop {
            match store
                .confirm_delivery(&self.target, lead_id, attempt_id, answer, effect)
                .await
            {
                Ok(()) => {
                    if effect.accepts {
                        self.environment.confirmations.confirmed(lead_id);
                    }
                    return;
                }
                Err(error)
                    if self.held.claimed_at.elapsed()
                        < self.destination.timeout() + LEASE_MARGIN =>
                {
                    tracing::warn!(lead_id, channel = self.destination.id(), %error, "confirmation not recorded yet; retrying");
                    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => {
                    let message = format!(
                        "{} {} confirmed lead {lead_id} but the confirmation could not be recorded ({error}); it may be sent again",
                        self.target.kind.as_str(),
                        self.target.key()
                    );
                    self.environment
                        .alerts
                        .raise(
                            AlertKind::DeliveryFailed,
                            Some(self.destination.id()),
                            Some(lead_id),
                            &message,
                        )
                        .await;
                    return;
                }
            }
        }
    }

    /// Records a failed try: retried after a backoff, or given up (with an
    /// alert) a day after the row was made. Yields `false` (not confirmed).
    async fn failed(&self, attempt_id: &str, answer: DeliveryAnswer) -> bool {
        let lead_id = self.held.lead.id.as_str();
        let channel = self.destination.id();
        let gave_up = Utc::now() - self.held.created_at
            >= chrono::Duration::from_std(GIVE_UP_AFTER).unwrap_or_default();
        let after = if gave_up {
            AfterFailure::Abandon
        } else {
            AfterFailure::RetryAt(
                Utc::now() + backoff(self.destination.retry_backoff(), self.held.tries),
            )
        };
        if let Err(error) = self
            .environment
            .store
            .delivery_failed(&self.target, &self.held, attempt_id, &answer, after)
            .await
        {
            tracing::warn!(lead_id, channel, %error, "failed delivery not recorded");
        }
        if gave_up {
            let message = format!(
                "{} {} of lead {lead_id} given up after a day of tries: {}",
                self.target.kind.as_str(),
                self.target.key(),
                answer.error.as_deref().unwrap_or("no confirmation")
            );
            self.environment
                .alerts
                .raise(
                    AlertKind::DeliveryFailed,
                    Some(channel),
                    Some(lead_id),
                    &message,
                )
                .await;
        }
        false
    }
}

/// A try that was not sent, as its attempt row records it.
fn not_sent(error: String) -> DeliveryAnswer {
    DeliveryAnswer {
        outcome: CallOutcome::Error,
        http_status: None,
        duration: Duration::ZERO,
        response_body: None,
        error: Some(error),
    }
}

/// `first` doubled for each try after the first, at most an hour.
fn backoff(first: Duration, tries: i32) -> chrono::Duration {
    let doublings = u32::try_from(tries.saturating_sub(1)).unwrap_or(0).min(20);
    let wait = first.saturating_mul(2u32.saturating_pow(doublings));
    chrono::Duration::from_std(std::cmp::min(wait, MAX_BACKOFF)).unwrap_or_default()
}

async fn sale_facts(store: &Store, lead_id: &str) -> SaleFacts {
    match store.sales_of(&[lead_id.to_string()]).await {
        Ok(sales) => sales
            .get(lead_id)
            .map(|sale| SaleFacts {
                buyer_id: Some(sale.buyer_id.clone()),
                price: sale.price,
            })
            .unwrap_or_default(),
        Err(_) => SaleFacts::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_an_hour() {
        let first = Duration::from_secs(30);
        assert_eq!(backoff(first, 1).num_seconds(), 30);
        assert_eq!(backoff(first, 3).num_seconds(), 120);
        assert_eq!(backoff(first, 40).num_seconds(), 3600);
    }
}
