//! What one delivery says: the JSON webhook body (or the channel's
//! `body_template`), a readable text for Slack, Telegram and e-mail, and a
//! JSON event for a sink; every HTTP one with `Idempotency-Key`. Also the
//! copy of it the attempt row keeps, with no secret in it (a Slack
//! webhook's path, a bot token, an SMTP password).

use entity::lead;
use serde_json::{json, Map, Value};

use super::destination::Destination;
use crate::buyer::request::{render, BuyerRequest, LeadOffer, PingResult};
use crate::config::{NotifyKind, NotifySettings};

/// Attribution worth a line in a text message, in this order.
const TEXT_ATTRIBUTION: [&str; 6] = [
    "landing_page",
    "utm_source",
    "utm_campaign",
    "consent_text",
    "trustedform_cert_url",
    "jornaya_leadid",
];

/// The sale a `lead.sold` event reports.
#[derive(Debug, Clone, Default)]
pub struct SaleFacts {
    pub buyer_id: Option<String>,
    pub price: Option<f64>,
}

/// A message ready to send.
pub enum Outbound {
    Http(BuyerRequest),
    Mail(Box<lettre::Message>),
}

/// A message and the copy of it its attempt row keeps.
pub struct Prepared {
    pub outbound: Outbound,
    /// `{url, method, headers, body}`, secrets left out.
    pub shown: Value,
}

/// The message for `lead` (and, for a sink, `event`).
pub fn prepare(
    destination: &Destination,
    lead: &lead::Model,
    event: Option<&str>,
    sale: &SaleFacts,
) -> Result<Prepared, String> {
    match destination {
        Destination::Channel(channel) => prepare_notify(channel, lead),
        Destination::Sink(sink) => {
            let event = event.unwrap_or_default();
            let mut body = json!({
                "event": event,
                "lead_id": lead.id,
                "source": lead.source_id,
                "test": lead.is_test,
                "at": happened_at(lead, event),
                "lead_state": lead.state,
            });
            if event == "lead.sold" {
                body["buyer_id"] = json!(sale.buyer_id);
                body["price"] = json!(sale.price);
            }
            let key = format!("{}:{event}:event", lead.id);
            Ok(http(
                sink.url.expose(),
                sink.url.expose(),
                key,
                body,
                Vec::new(),
            ))
        }
    }
}

/// When the event happened: the contract's acceptance, else the lead's
/// last change of state (not when this try is sent).
fn happened_at(lead: &lead::Model, event: &str) -> chrono::DateTime<chrono::Utc> {
    match (event, lead.accepted_at) {
        ("lead.accepted", Some(at)) => at,
        _ => lead.updated_at,
    }
}

fn prepare_notify(channel: &NotifySettings, lead: &lead::Model) -> Result<Prepared, String> {
    let key = format!("{}:{}:notify", lead.id, channel.id);
    let url = channel.url.expose();
    match channel.kind {
        NotifyKind::Webhook => {
            let headers: Vec<(String, String, String)> = channel
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.clone(),
                        value.expose().to_string(),
                        crate::redact::REDACTED.to_string(),
                    )
                })
                .collect();
            let shown_url = crate::redact::url(url);
            let Some(template) = &channel.body_template else {
                return Ok(http(url, &shown_url, key, webhook_body(lead), headers));
            };
            let content_type = channel
                .content_type
                .clone()
                .unwrap_or_else(|| "application/json".into());
            let body = render(
                template,
                &content_type,
                &LeadOffer::of(lead),
                &PingResult::default(),
            );
            Ok(request(url, &shown_url, key, content_type, body, headers))
        }
        NotifyKind::Slack => {
            let body = json!({"text": text_of(lead)});
            Ok(http(url, &hide_path(url), key, body, Vec::new()))
        }
        NotifyKind::Telegram => {
            let token = channel
                .bot_token
                .as_ref()
                .map(|t| t.expose())
                .unwrap_or_default();
            let base = url.trim_end_matches('/');
            let body = json!({"chat_id": channel.chat_id, "text": text_of(lead)});
            Ok(http(
                &format!("{base}/bot{token}/sendMessage"),
                &format!("{base}/bot[redacted]/sendMessage"),
                key,
                body,
                Vec::new(),
            ))
        }
        NotifyKind::Email => mail(channel, lead),
    }
}

/// The default webhook body (SPEC section 7).
fn webhook_body(lead: &lead::Model) -> Value {
    json!({
        "lead_id": lead.id,
        "source": lead.source_id,
        "test": lead.is_test,
        "fields": lead.fields,
        "attribution": lead.attribution,
        "received_at": lead.received_at,
        "duplicate_of": lead.duplicate_of,
    })
}

fn http(
    url: &str,
    shown_url: &str,
    key: String,
    body: Value,
    headers: Vec<(String, String, String)>,
) -> Prepared {
    request(
        url,
        shown_url,
        key,
        "application/json".into(),
        body.to_string(),
        headers,
    )
}

/// An HTTP POST; `headers` are (name, value, value as shown).
fn request(
    url: &str,
    shown_url: &str,
    key: String,
    content_type: String,
    body: String,
    headers: Vec<(String, String, String)>,
) -> Prepared {
    let mut shown_headers = Map::new();
    shown_headers.insert("Content-Type".into(), content_type.clone().into());
    shown_headers.insert("Idempotency-Key".into(), key.clone().into());
    let mut sent = vec![
        ("Content-Type".to_string(), content_type.clone()),
        ("Idempotency-Key".to_string(), key),
    ];
    for (name, value, shown) in headers {
        shown_headers.insert(name.clone(), shown.into());
        sent.push((name, value));
    }
    let shown = json!({"url": shown_url, "method": "POST", "headers": shown_headers, "body": body});
    Prepared {
        outbound: Outbound::Http(BuyerRequest {
            url: url.to_string(),
            headers: sent,
            content_type,
            body,
            shown: shown.clone(),
        }),
        shown,
    }
}

fn mail(channel: &NotifySettings, lead: &lead::Model) -> Result<Prepared, String> {
    let subject = format!(
        "{}New lead from {}",
        if lead.is_test { "[TEST] " } else { "" },
        lead.source_id
    );
    let text = text_of(lead);
    let from = channel.from.clone().unwrap_or_default();
    let mut builder = lettre::Message::builder()
        .from(from.parse().map_err(|error| format!("from: {error}"))?)
        .subject(subject.clone())
        .message_id(Some(format!("<{}.{}@leadrouter>", lead.id, channel.id)));
    for to in &channel.to {
        builder = builder.to(to.parse().map_err(|error| format!("to: {error}"))?);
    }
    let message = builder
        .body(text.clone())
        .map_err(|error| format!("e-mail: {error}"))?;
    let shown = json!({
        "url": crate::redact::url(channel.url.expose()),
        "method": "SMTP",
        "headers": {"From": from, "To": channel.to.join(", "), "Subject": subject},
        "body": text,
    });
    Ok(Prepared {
        outbound: Outbound::Mail(Box::new(message)),
        shown,
    })
}

/// A readable message: what came in, every field, where it came from.
fn text_of(lead: &lead::Model) -> String {
    let mut lines = vec![format!(
        "{}New lead from {} (id {})",
        if lead.is_test { "[TEST] " } else { "" },
        lead.source_id,
        lead.id
    )];
    let plain = |value: &Value| match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    if let Some(fields) = lead.fields.as_object() {
        lines.extend(
            fields
                .iter()
                .map(|(name, value)| format!("{name}: {}", plain(value))),
        );
    }
    if let Some(attribution) = lead.attribution.as_object() {
        for name in TEXT_ATTRIBUTION {
            if let Some(value) = attribution.get(name).filter(|value| !value.is_null()) {
                lines.push(format!("{name}: {}", plain(value)));
            }
        }
    }
    if let Some(original) = &lead.duplicate_of {
        lines.push(format!("duplicate of: {original}"));
    }
    lines.push(format!("received: {}", lead.received_at.to_rfc3339()));
    lines.join("\n")
}

/// `https://hooks.slack.com/services/T/B/X` shown as `https://hooks.slack.com/[redacted]`:
/// the path of an incoming webhook is its secret.
fn hide_path(url: &str) -> String {
    match url.parse::<awc::http::Uri>() {
        Ok(uri) => format!(
            "{}://{}/[redacted]",
            uri.scheme_str().unwrap_or("https"),
            uri.authority().map(|a| a.as_str()).unwrap_or_default()
        ),
        Err(_) => crate::redact::REDACTED.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_keep_no_secret() {
        assert_eq!(
            hide_path("https://hooks.slack.com/services/T0/B0/secret"),
            "https://hooks.slack.com/[redacted]"
        );
    }
}
