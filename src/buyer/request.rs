//! Building one call to a buyer: the default JSON bodies (no PII in pings),
//! `body_template` with values escaped for its content type, the buyer's
//! headers, and `Idempotency-Key: <lead_id>:<buyer_id>:<kind>`. Also the
//! redacted copy of the request that the attempt row keeps.

use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::config::BuyerSettings;
use crate::domain::CallKind;

/// Attribution facts about the visitor's machine, kept out of pings.
const POST_ONLY_ATTRIBUTION: [&str; 2] = ["client_ip", "user_agent"];

/// What the waterfall knows of a lead when offering it to a buyer.
#[derive(Debug, Clone)]
pub struct LeadOffer {
    pub lead_id: String,
    pub source: String,
    pub is_test: bool,
    pub fields: Map<String, Value>,
    pub attribution: Map<String, Value>,
}

impl LeadOffer {
    /// The offer of a stored lead.
    pub fn of(row: &entity::lead::Model) -> Self {
        Self {
            lead_id: row.id.clone(),
            source: row.source_id.clone(),
            is_test: row.is_test,
            fields: row.fields.as_object().cloned().unwrap_or_default(),
            attribution: row.attribution.as_object().cloned().unwrap_or_default(),
        }
    }
}

/// What an accepted ping handed over for the post.
#[derive(Debug, Clone, Default)]
pub struct PingResult {
    pub ping_id: Option<String>,
    pub bid: Option<f64>,
}

/// A request ready to send, and the copy of it that may be stored.
#[derive(Debug, Clone)]
pub struct BuyerRequest {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub content_type: String,
    pub body: String,
    /// `{url, method, headers (redacted), body}` for the attempt row.
    pub shown: Value,
}

pub fn build(
    kind: CallKind,
    buyer: &BuyerSettings,
    lead: &LeadOffer,
    ping: &PingResult,
    pii_fields: &[String],
) -> BuyerRequest {
    let (url, template, content_type) = match kind {
        CallKind::Ping => {
            let ping_settings = buyer.ping.as_ref();
            (
                ping_settings.map(|p| p.url.clone()).unwrap_or_default(),
                ping_settings.and_then(|p| p.body_template.clone()),
                ping_settings.and_then(|p| p.content_type.clone()),
            )
        }
        CallKind::Post => (
            buyer.post.url.clone(),
            buyer.post.body_template.clone(),
            buyer.post.content_type.clone(),
        ),
    };
    let content_type = content_type.unwrap_or_else(|| "application/json".into());
    let body = match &template {
        Some(template) => render(template, &content_type, lead, ping),
        None => default_body(kind, lead, ping, pii_fields),
    };
    // What the file says, `${VAR}` unresolved, for the stored copy.
    let written = &buyer.snapshot.value[kind.as_str()];
    let shown_url = crate::redact::url(written["url"].as_str().unwrap_or(&url));
    let shown_body = match written["body_template"].as_str() {
        Some(template) if template.contains("${") => render(template, &content_type, lead, ping),
        _ => body.clone(),
    };
    let idempotency_key = format!("{}:{}:{}", lead.lead_id, buyer.id, kind.as_str());
    let mut headers = vec![
        ("Content-Type".to_string(), content_type.clone()),
        ("Idempotency-Key".to_string(), idempotency_key.clone()),
    ];
    let mut shown_headers = Map::new();
    shown_headers.insert("Content-Type".into(), content_type.clone().into());
    shown_headers.insert("Idempotency-Key".into(), idempotency_key.into());
    for (name, value) in &buyer.headers {
        headers.push((name.clone(), value.expose().to_string()));
        let written = buyer.snapshot.value["headers"][name]
            .as_str()
            .unwrap_or_default();
        shown_headers.insert(
            name.clone(),
            crate::redact::header_value(name, written).into(),
        );
    }
    let shown =
        json!({"url": shown_url, "method": "POST", "headers": shown_headers, "body": shown_body});
    BuyerRequest {
        url,
        headers,
        content_type,
        body,
        shown,
    }
}

/// The default body's JSON text, serialized from the lead where it is
/// (building a `Value` first copied every field of every call). Keys in
/// alphabetical order, as a `serde_json::Map` writes them.
fn default_body(
    kind: CallKind,
    lead: &LeadOffer,
    ping: &PingResult,
    pii_fields: &[String],
) -> String {
    let written = match kind {
        CallKind::Ping => serde_json::to_string(&PingBody {
            attribution: Without {
                map: &lead.attribution,
                left_out: |name| POST_ONLY_ATTRIBUTION.contains(&name),
            },
            fields: Without {
                map: &lead.fields,
                left_out: |name| pii_fields.iter().any(|pii| pii == name),
            },
            lead_id: &lead.lead_id,
            source: &lead.source,
            test: lead.is_test,
        }),
        CallKind::Post => serde_json::to_string(&PostBody {
            attribution: &lead.attribution,
            bid: ping.bid,
            fields: &lead.fields,
            lead_id: &lead.lead_id,
            ping_id: ping.ping_id.as_deref(),
            source: &lead.source,
            test: lead.is_test,
        }),
    };
    written.expect("a map of JSON values and plain fields always serialize")
}

/// A ping's default body: no PII fields, no visitor's machine facts.
#[derive(Serialize)]
#[serde(bound = "")]
struct PingBody<'a, A: Fn(&str) -> bool, F: Fn(&str) -> bool> {
    attribution: Without<'a, A>,
    fields: Without<'a, F>,
    lead_id: &'a str,
    source: &'a str,
    test: bool,
}

/// A post's default body: everything the lead has.
#[derive(Serialize)]
struct PostBody<'a> {
    attribution: &'a Map<String, Value>,
    bid: Option<f64>,
    fields: &'a Map<String, Value>,
    lead_id: &'a str,
    ping_id: Option<&'a str>,
    source: &'a str,
    test: bool,
}

/// A map serialized without the entries whose name is `left_out`.
struct Without<'a, L: Fn(&str) -> bool> {
    map: &'a Map<String, Value>,
    left_out: L,
}

impl<L: Fn(&str) -> bool> Serialize for Without<'_, L> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(
            self.map
                .iter()
                .filter(|(name, _)| !(self.left_out)(name.as_str())),
        )
    }
}

/// Substitutes `{{lead_id}}`, `{{ping_id}}`, `{{bid}}`, `{{source}}`,
/// `{{fields.NAME}}` and `{{attribution.NAME}}`, escaped for `content_type`.
/// Unknown names become empty.
pub fn render(template: &str, content_type: &str, lead: &LeadOffer, ping: &PingResult) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let value = lookup(after[..end].trim(), lead, ping).unwrap_or_default();
        out.push_str(&escape(&value, content_type));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

fn lookup(name: &str, lead: &LeadOffer, ping: &PingResult) -> Option<String> {
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    match name {
        "lead_id" => Some(lead.lead_id.clone()),
        "source" => Some(lead.source.clone()),
        "ping_id" => ping.ping_id.clone(),
        "bid" => ping.bid.map(|bid| bid.to_string()),
        _ => {
            if let Some(field) = name.strip_prefix("fields.") {
                lead.fields.get(field).map(text)
            } else if let Some(key) = name.strip_prefix("attribution.") {
                lead.attribution.get(key).map(text)
            } else {
                None
            }
        }
    }
}

/// Escapes a value for the body's content type.
fn escape(value: &str, content_type: &str) -> String {
    let content_type = content_type.to_ascii_lowercase();
    if content_type.contains("json") {
        let quoted = serde_json::to_string(value).unwrap_or_default();
        quoted[1..quoted.len() - 1].to_string()
    } else if content_type.contains("x-www-form-urlencoded") {
        form_urlencoded::byte_serialize(value.as_bytes()).collect()
    } else if content_type.contains("xml") || content_type.contains("html") {
        value
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
            .replace('\'', "&apos;")
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lead() -> LeadOffer {
        LeadOffer {
            lead_id: "L1".into(),
            source: "web".into(),
            is_test: false,
            fields: json!({"email": "a@b.co", "state": "CA", "note": "5 < 6 & \"quoted\""})
                .as_object()
                .unwrap()
                .clone(),
            attribution: json!({"consent_text": "I agree", "client_ip": "10.1.1.1"})
                .as_object()
                .unwrap()
                .clone(),
        }
    }

    #[test]
    fn templates_reach_flattened_nested_fields_by_their_dotted_names() {
        let mut lead = lead();
        lead.fields.insert("address.city".into(), json!("Austin"));
        let body = render(
            "<city>{{fields.address.city}}</city>",
            "application/xml",
            &lead,
            &PingResult::default(),
        );
        assert_eq!(body, "<city>Austin</city>");
    }

    #[test]
    fn templates_escape_values_for_their_content_type() {
        let ping = PingResult {
            ping_id: Some("P9".into()),
            bid: Some(12.5),
        };
        let json_body = render(
            r#"{"id":"{{ping_id}}","n":"{{fields.note}}","x":"{{fields.nope}}"}"#,
            "application/json",
            &lead(),
            &ping,
        );
        let parsed: Value = serde_json::from_str(&json_body).unwrap();
        assert_eq!(parsed["n"], "5 < 6 & \"quoted\"");
        assert_eq!(parsed["id"], "P9");
        assert_eq!(parsed["x"], "");
        assert_eq!(
            render(
                "note={{fields.note}}&bid={{bid}}",
                "application/x-www-form-urlencoded",
                &lead(),
                &ping
            ),
            "note=5+%3C+6+%26+%22quoted%22&bid=12.5"
        );
        assert_eq!(
            render(
                "<n>{{fields.note}}</n><c>{{attribution.consent_text}}</c>",
                "application/xml",
                &lead(),
                &ping
            ),
            "<n>5 &lt; 6 &amp; &quot;quoted&quot;</n><c>I agree</c>"
        );
    }

    #[test]
    fn default_pings_leave_out_personal_data_and_posts_carry_everything() {
        let pii = vec!["email".to_string()];
        let ping = default_body(CallKind::Ping, &lead(), &PingResult::default(), &pii);
        let ping: Value = serde_json::from_str(&ping).unwrap();
        assert_eq!(ping["fields"].get("email"), None);
        assert_eq!(ping["fields"]["state"], "CA");
        assert_eq!(ping["attribution"].get("client_ip"), None);
        let post = default_body(
            CallKind::Post,
            &lead(),
            &PingResult {
                ping_id: Some("P".into()),
                bid: Some(3.0),
            },
            &pii,
        );
        let post: Value = serde_json::from_str(&post).unwrap();
        assert_eq!(post["fields"]["email"], "a@b.co");
        assert_eq!(post["ping_id"], "P");
        assert_eq!(post["bid"], 3.0);
        assert_eq!(post["attribution"]["consent_text"], "I agree");
    }
}
