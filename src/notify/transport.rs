//! Sending a prepared delivery and judging it: over HTTP (awc, through the
//! same exchange as buyer calls) a 2xx confirms (for Telegram only with
//! `"ok": true`); over SMTP (lettre) the server's acceptance of the message
//! confirms. Anything else is a failed try, retried later.

use std::time::{Duration, Instant};

use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::destination::Destination;
use super::message::{Outbound, Prepared};
use crate::buyer::accept::AcceptCheck;
use crate::buyer::call::exchange;
use crate::config::{AcceptRule, NotifyKind, NotifySettings};
use crate::domain::{CallKind, CallOutcome};
use crate::store::DeliveryAnswer;

/// How a destination's messages leave: an HTTP client or an SMTP pool,
/// made once per courier.
pub enum Transport {
    Http {
        client: awc::Client,
        confirms: AcceptCheck,
    },
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
}

impl Transport {
    pub fn for_destination(destination: &Destination) -> Result<Self, String> {
        let timeout = destination.timeout();
        if let Destination::Channel(channel) = destination {
            if channel.kind == NotifyKind::Email {
                return smtp(channel).map(Self::Smtp);
            }
        }
        let connector = awc::Connector::new().limit(destination.max_concurrency());
        let client = awc::Client::builder()
            .connector(connector)
            .timeout(timeout)
            .finish();
        Ok(Self::Http {
            client,
            confirms: confirmation_rule(destination),
        })
    }

    /// Sends within `timeout` and judges the answer.
    pub async fn send(&self, prepared: Prepared, timeout: Duration) -> DeliveryAnswer {
        match (self, prepared.outbound) {
            (Self::Http { client, confirms }, Outbound::Http(request)) => {
                let answer = exchange(client, CallKind::Ping, &request, timeout, confirms).await;
                let status_confirms = matches!(confirms, AcceptCheck::Status(_))
                    && answer
                        .http_status
                        .is_some_and(|status| (200..300).contains(&status));
                // A 2xx confirms even if its body then broke off.
                let confirmed = answer.outcome == CallOutcome::Accepted || status_confirms;
                DeliveryAnswer {
                    // A refusal (4xx) is not a confirmation: tried again.
                    outcome: match answer.outcome {
                        _ if confirmed => CallOutcome::Accepted,
                        CallOutcome::Timeout => CallOutcome::Timeout,
                        _ => CallOutcome::Error,
                    },
                    http_status: answer.http_status,
                    duration: answer.duration,
                    error: match (&answer.detail, answer.http_status) {
                        _ if confirmed => None,
                        (Some(detail), _) => Some(detail.clone()),
                        (None, Some(status)) if !confirmed => {
                            Some(format!("answered HTTP {status}, not a confirmation"))
                        }
                        _ => None,
                    },
                    response_body: answer.body,
                }
            }
            (Self::Smtp(mailer), Outbound::Mail(message)) => {
                let started = Instant::now();
                let sent = actix_web::rt::time::timeout(timeout, mailer.send(*message)).await;
                let (outcome, response_body, error) = match sent {
                    Ok(Ok(response)) => (
                        CallOutcome::Accepted,
                        Some(format!(
                            "{} {}",
                            response.code(),
                            response.message().collect::<Vec<_>>().join(" ")
                        )),
                        None,
                    ),
                    Ok(Err(error)) => (CallOutcome::Error, None, Some(error.to_string())),
                    Err(_) => (
                        CallOutcome::Timeout,
                        None,
                        Some("the mail server did not answer in time".into()),
                    ),
                };
                DeliveryAnswer {
                    outcome,
                    http_status: None,
                    duration: started.elapsed(),
                    response_body,
                    error,
                }
            }
            _ => DeliveryAnswer {
                outcome: CallOutcome::Error,
                http_status: None,
                duration: Duration::ZERO,
                response_body: None,
                error: Some("message and transport do not match".into()),
            },
        }
    }
}

/// Any 2xx confirms, except for Telegram, whose API says `"ok": true`.
fn confirmation_rule(destination: &Destination) -> AcceptCheck {
    let telegram = matches!(destination, Destination::Channel(channel) if channel.kind == NotifyKind::Telegram);
    let rule = if telegram {
        AcceptRule {
            path: Some("/ok".into()),
            equals: Some(toml::Value::Boolean(true)),
            ..AcceptRule::default()
        }
    } else {
        AcceptRule {
            status: Some((200..300).collect()),
            ..AcceptRule::default()
        }
    };
    AcceptCheck::compile(Some(&rule))
}

fn smtp(channel: &NotifySettings) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    AsyncSmtpTransport::<Tokio1Executor>::from_url(channel.url.expose())
        .map(|builder| builder.timeout(Some(channel.timeout)).build())
        .map_err(|error| format!("notify channel {:?}: SMTP URL: {error}", channel.id))
}
