//! From a parsed body to normalised fields, attribution and validation errors.
//!
//! Strings are trimmed, email lower-cased, phone reduced to digits. Nothing
//! is dropped silently: anything that cannot be a field value is an error,
//! and the raw body is kept elsewhere, so this can be re-derived at any time.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::{BodyError, FieldError};
use crate::config::SourceSettings;

/// Attribution keys read from the body (top level or an `attribution` object).
pub const ATTRIBUTION_KEYS: [&str; 11] = [
    "landing_page",
    "referrer",
    "utm_source",
    "utm_medium",
    "utm_campaign",
    "utm_term",
    "utm_content",
    "consent_text",
    "policy_version",
    "trustedform_cert_url",
    "jornaya_leadid",
];

/// Body keys that steer intake and are never lead fields.
const CONTROL_KEYS: [&str; 4] = ["source", "submission_id", "test", "attribution"];
const MAX_FIELD_CHARS: usize = 1024;
const MAX_FIELD_NAME_CHARS: usize = 64;
const MAX_FIELDS: usize = 100;
const PHONE_DIGITS: std::ops::RangeInclusive<usize> = 7..=15;

/// What intake knows about a request besides its body.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    pub referer: Option<String>,
    pub user_agent: Option<String>,
    pub client_ip: Option<String>,
    pub received_at: DateTime<Utc>,
    /// `X-Test-Lead: 1`.
    pub test_header: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    pub fields: Map<String, Value>,
    pub attribution: Map<String, Value>,
    pub external_id: Option<String>,
    /// A body `submission_id`: the client's dedupe key.
    pub submission_id: Option<String>,
    pub is_test: bool,
    pub errors: Vec<FieldError>,
}

/// As [`normalize`], for a body that may not have parsed: an unparsable
/// body gives the empty normalisation with a `body` error.
pub fn normalize_parsed(
    parsed: &Result<Map<String, Value>, BodyError>,
    source: &SourceSettings,
    meta: &RequestMeta,
) -> Normalized {
    match parsed {
        Ok(body) => normalize(body, source, meta),
        Err(error) => Normalized {
            errors: vec![FieldError::new("body", error.to_string())],
            ..normalize(&Map::new(), source, meta)
        },
    }
}

/// Normalises and validates a parsed body for `source`.
pub fn normalize(
    body: &Map<String, Value>,
    source: &SourceSettings,
    meta: &RequestMeta,
) -> Normalized {
    let external_key = source.external_id.as_deref();
    let raw_fields: Vec<(&str, &Value)> = match &source.fields {
        Some(mapping) => mapping
            .iter()
            .filter_map(|(name, key)| body.get(key).map(|value| (name.as_str(), value)))
            .collect(),
        None => body
            .iter()
            .filter(|(key, _)| {
                !CONTROL_KEYS.contains(&key.as_str())
                    && !ATTRIBUTION_KEYS.contains(&key.as_str())
                    && Some(key.as_str()) != external_key
            })
            .map(|(key, value)| (key.as_str(), value))
            .collect(),
    };
    let (fields, errors) = check_fields(raw_fields, &source.required);

    Normalized {
        fields,
        attribution: attribution(body, meta),
        external_id: external_key.and_then(|key| key_text(body.get(key))),
        submission_id: key_text(body.get("submission_id")),
        is_test: meta.test_header || body.get("test").is_some_and(is_truthy),
        errors,
    }
}

/// Normalises and validates named field values (as `normalize` does for a
/// body, and `PATCH /v1/leads/{id}` for an operator's fix): the accepted
/// fields, and a problem per field that is not acceptable or missing.
pub fn check_fields<'a>(
    raw_fields: impl IntoIterator<Item = (&'a str, &'a Value)>,
    required: &[String],
) -> (Map<String, Value>, Vec<FieldError>) {
    let raw_fields: Vec<(&str, &Value)> = raw_fields.into_iter().collect();
    let mut errors = Vec::new();
    if raw_fields.len() > MAX_FIELDS {
        errors.push(FieldError::new(
            "body",
            format!("more than {MAX_FIELDS} fields"),
        ));
    }

    let mut fields = Map::new();
    for (name, value) in raw_fields.into_iter().take(MAX_FIELDS) {
        let name = without_nul(name);
        let name = name.as_str();
        if name.chars().count() > MAX_FIELD_NAME_CHARS {
            errors.push(FieldError::new(
                truncate(name, MAX_FIELD_NAME_CHARS),
                format!("field name longer than {MAX_FIELD_NAME_CHARS} characters"),
            ));
            continue;
        }
        match scalar_text(value) {
            Ok(None) => {}
            Ok(Some(text)) if text.chars().count() > MAX_FIELD_CHARS => errors.push(
                FieldError::new(name, format!("longer than {MAX_FIELD_CHARS} characters")),
            ),
            Ok(Some(text)) => match normalize_field(name, text) {
                Ok(text) => {
                    fields.insert(name.to_string(), Value::String(text));
                }
                Err(message) => errors.push(FieldError::new(name, message)),
            },
            Err(message) => errors.push(FieldError::new(name, message)),
        }
    }
    for required in required {
        if !fields.contains_key(required) && !errors.iter().any(|e| &e.field == required) {
            errors.push(FieldError::new(required.as_str(), "required"));
        }
    }

    (fields, errors)
}

/// A field value as text: `None` for null or blank, an error for structures.
fn scalar_text(value: &Value) -> Result<Option<String>, String> {
    let text = match value {
        Value::Null => return Ok(None),
        Value::String(text) => text.trim().to_string(),
        Value::Number(number) => number.to_string(),
        Value::Bool(flag) => flag.to_string(),
        Value::Array(items) => {
            let parts: Result<Vec<_>, _> = items.iter().map(scalar_part).collect();
            parts?.into_iter().flatten().collect::<Vec<_>>().join(", ")
        }
        Value::Object(_) => return Err("expected a text value, got an object".into()),
    };
    let text = without_nul(&text);
    Ok((!text.is_empty()).then_some(text))
}

/// NUL characters dropped: PostgreSQL text and jsonb cannot hold them (the
/// raw payload keeps them, as bytes).
fn without_nul(text: &str) -> String {
    text.replace('\0', "")
}

fn scalar_part(value: &Value) -> Result<Option<String>, String> {
    match value {
        Value::Array(_) | Value::Object(_) => Err("expected a text value, got nested data".into()),
        scalar => scalar_text(scalar),
    }
}

fn normalize_field(name: &str, text: String) -> Result<String, String> {
    match name {
        "email" => {
            let email = text.to_lowercase();
            if is_email(&email) {
                Ok(email)
            } else {
                Err("not a valid email address".into())
            }
        }
        "phone" => {
            let digits: String = text.chars().filter(char::is_ascii_digit).collect();
            let plausible = text
                .chars()
                .all(|c| c.is_ascii_digit() || " +-().".contains(c));
            if plausible && PHONE_DIGITS.contains(&digits.len()) {
                Ok(digits)
            } else {
                Err("not a valid phone number".into())
            }
        }
        _ => Ok(text),
    }
}

fn is_email(email: &str) -> bool {
    let Some((local, domain)) = email.rsplit_once('@') else {
        return false;
    };
    let labels: Vec<&str> = domain.split('.').collect();
    email.len() <= 254
        && !local.is_empty()
        && !local.contains('@')
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && labels.len() >= 2
        && labels.iter().all(|label| !label.is_empty())
}

fn attribution(body: &Map<String, Value>, meta: &RequestMeta) -> Map<String, Value> {
    let nested = body.get("attribution").and_then(Value::as_object);
    let mut attribution = Map::new();
    for key in ATTRIBUTION_KEYS {
        let value = body
            .get(key)
            .or_else(|| nested.and_then(|nested| nested.get(key)));
        if let Some(text) = value.and_then(|value| scalar_text(value).ok().flatten()) {
            attribution.insert(
                key.to_string(),
                Value::String(truncate(&text, MAX_FIELD_CHARS)),
            );
        }
    }
    if !attribution.contains_key("referrer") {
        if let Some(referer) = &meta.referer {
            attribution.insert(
                "referrer".into(),
                Value::String(truncate(referer, MAX_FIELD_CHARS)),
            );
        }
    }
    let request_facts = [
        ("client_ip", meta.client_ip.clone()),
        (
            "user_agent",
            meta.user_agent
                .as_deref()
                .map(|ua| truncate(ua, MAX_FIELD_CHARS)),
        ),
        ("received_at", Some(meta.received_at.to_rfc3339())),
    ];
    for (key, value) in request_facts {
        if let Some(value) = value {
            attribution.insert(key.to_string(), Value::String(value));
        }
    }
    attribution
}

fn key_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(text) if !without_nul(text).trim().is_empty() => {
            Some(without_nul(text).trim().to_string())
        }
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn is_truthy(value: &Value) -> bool {
    match value {
        Value::Bool(flag) => *flag,
        Value::Number(number) => number.as_i64() == Some(1),
        Value::String(text) => matches!(text.trim(), "1" | "true" | "yes" | "on"),
        _ => false,
    }
}

fn truncate(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SourceKind;
    use serde_json::json;

    fn source(required: &[&str]) -> SourceSettings {
        SourceSettings {
            id: "web".into(),
            kind: SourceKind::Form,
            api_key: None,
            external_id: Some("lead_id".into()),
            required: required.iter().map(|s| s.to_string()).collect(),
            thank_you_url: String::new(),
            allowed_origins: Vec::new(),
            rate_limit: None,
            fields: None,
            payout: None,
            payout_share: None,
        }
    }

    fn meta() -> RequestMeta {
        RequestMeta {
            referer: Some("https://ads.example/x".into()),
            user_agent: Some("test-agent".into()),
            client_ip: Some("127.0.0.1".into()),
            received_at: Utc::now(),
            test_header: false,
        }
    }

    fn run(body: Value, required: &[&str]) -> Normalized {
        normalize(body.as_object().unwrap(), &source(required), &meta())
    }

    #[test]
    fn strings_are_trimmed_email_lowered_and_phone_reduced_to_digits() {
        let lead = run(
            json!({"email": "  Ann@Example.COM ", "phone": "+1 (555) 010-9999", "first_name": " Ann ", "age": 41}),
            &["email"],
        );
        assert_eq!(lead.errors, vec![]);
        assert_eq!(lead.fields["email"], "ann@example.com");
        assert_eq!(lead.fields["phone"], "15550109999");
        assert_eq!(lead.fields["first_name"], "Ann");
        assert_eq!(lead.fields["age"], "41");
    }

    #[test]
    fn bad_values_missing_fields_and_nested_junk_are_errors() {
        let lead = run(
            json!({"email": "nope", "phone": "call me", "junk": {"a": 1}, "long": "x".repeat(2000)}),
            &["email", "zip"],
        );
        let fields: Vec<&str> = lead.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["email", "junk", "long", "phone", "zip"]);
    }

    #[test]
    fn attribution_and_control_keys_are_kept_apart_from_fields() {
        let lead = run(
            json!({"email": "a@b.co", "utm_source": "fb", "attribution": {"consent_text": "I agree"},
                   "submission_id": "s-1", "lead_id": 77, "test": true, "source": "web"}),
            &[],
        );
        assert_eq!(lead.fields.keys().collect::<Vec<_>>(), ["email"]);
        assert_eq!(lead.attribution["utm_source"], "fb");
        assert_eq!(lead.attribution["consent_text"], "I agree");
        assert_eq!(lead.attribution["referrer"], "https://ads.example/x");
        assert_eq!(lead.attribution["client_ip"], "127.0.0.1");
        assert_eq!(lead.submission_id.as_deref(), Some("s-1"));
        assert_eq!(lead.external_id.as_deref(), Some("77"));
        assert!(lead.is_test);
    }

    #[test]
    fn a_field_mapping_renames_payload_keys() {
        let mut source = source(&["email"]);
        source.fields = Some([("email".to_string(), "Email_Address".to_string())].into());
        let body = json!({"Email_Address": "X@Y.org", "other": "dropped"});
        let lead = normalize(body.as_object().unwrap(), &source, &meta());
        assert_eq!(
            lead.fields,
            json!({"email": "x@y.org"}).as_object().unwrap().clone()
        );
    }
}
