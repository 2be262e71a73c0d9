//! From a parsed body to normalised fields, attribution and validation errors.
//!
//! Nested JSON objects are reached by dotted paths (`address.city`): a
//! source's `[sources.fields]` maps names to them, and without a mapping
//! every value passes through under its flattened dotted name. Arrays of
//! scalars become comma-joined text. Strings are trimmed, email
//! lower-cased, phone reduced to digits. Nothing is dropped silently:
//! anything that cannot be a field value is an error (nesting deeper than
//! 8 levels, more than 200 values, a value longer than
//! `intake.max_field_chars`), and the raw body is kept elsewhere, so this
//! can be re-derived at any time.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::contract::FieldError;
use super::payload::BodyError;
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
/// Attribution and request facts are cut to this length, never refused.
const MAX_ATTRIBUTION_CHARS: usize = 1024;
/// A dotted field name may be this long.
const MAX_FIELD_NAME_CHARS: usize = 128;
/// Values in one lead (after flattening), and levels of nesting.
const MAX_FIELDS: usize = 200;
const MAX_DEPTH: usize = 8;
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
    max_field_chars: usize,
) -> Normalized {
    match parsed {
        Ok(body) => normalize(body, source, meta, max_field_chars),
        Err(error) => Normalized {
            errors: vec![FieldError::new("body", error.to_string())],
            ..normalize(&Map::new(), source, meta, max_field_chars)
        },
    }
}

/// Normalises and validates a parsed body for `source`.
pub fn normalize(
    body: &Map<String, Value>,
    source: &SourceSettings,
    meta: &RequestMeta,
    max_field_chars: usize,
) -> Normalized {
    let external_key = source.external_id.as_deref();
    let (flat, shape_errors) = flatten(body);
    let at_path = |path: &str| body.get(path).or_else(|| flat.get(path).copied());
    let raw_fields: Vec<(&str, &Value)> = match &source.fields {
        Some(mapping) => mapping
            .iter()
            .filter_map(|(name, path)| at_path(path).map(|value| (name.as_str(), value)))
            .collect(),
        None => flat
            .iter()
            .filter(|(path, _)| {
                let top = path.split('.').next().unwrap_or_default();
                !CONTROL_KEYS.contains(&top)
                    && !ATTRIBUTION_KEYS.contains(&path.as_str())
                    && Some(path.as_str()) != external_key
            })
            .map(|(path, value)| (path.as_str(), *value))
            .collect(),
    };
    let (fields, mut errors) = check_fields(raw_fields, &source.required, max_field_chars);
    errors.splice(0..0, shape_errors);

    Normalized {
        fields,
        attribution: attribution(body, meta),
        external_id: external_key.and_then(|key| key_text(at_path(key))),
        submission_id: key_text(body.get("submission_id")),
        is_test: meta.test_header || body.get("test").is_some_and(is_truthy),
        errors,
    }
}

/// Every value of a body under its dotted path (`address.city`), in key
/// order; arrays are values (scalars in them are joined later). Problems
/// with the body's shape (too deep, too many values) come back as `body`
/// errors.
fn flatten(
    body: &Map<String, Value>,
) -> (std::collections::BTreeMap<String, &Value>, Vec<FieldError>) {
    fn walk<'a>(
        prefix: &str,
        object: &'a Map<String, Value>,
        depth: usize,
        flat: &mut std::collections::BTreeMap<String, &'a Value>,
        too_deep: &mut bool,
    ) {
        for (key, value) in object {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match value {
                Value::Object(inner) if depth >= MAX_DEPTH => {
                    if !inner.is_empty() {
                        *too_deep = true;
                    }
                }
                Value::Object(inner) => walk(&path, inner, depth + 1, flat, too_deep),
                _ => {
                    flat.insert(path, value);
                }
            }
            if flat.len() > MAX_FIELDS {
                return;
            }
        }
    }
    let mut flat = std::collections::BTreeMap::new();
    let mut too_deep = false;
    walk("", body, 1, &mut flat, &mut too_deep);
    let mut errors = Vec::new();
    if too_deep {
        errors.push(FieldError::new(
            "body",
            format!("nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    (flat, errors)
}

/// Normalises and validates named field values (as `normalize` does for a
/// body, and `PATCH /v1/leads/{id}` for an operator's fix): the accepted
/// fields, and a problem per field that is not acceptable or missing.
pub fn check_fields<'a>(
    raw_fields: impl IntoIterator<Item = (&'a str, &'a Value)>,
    required: &[String],
    max_field_chars: usize,
) -> (Map<String, Value>, Vec<FieldError>) {
    let raw_fields: Vec<(&str, &Value)> = raw_fields.into_iter().collect();
    let mut errors = Vec::new();
    if raw_fields.len() > MAX_FIELDS {
        errors.push(FieldError::new(
            "body",
            format!("more than {MAX_FIELDS} values"),
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
            Ok(Some(text)) if text.chars().count() > max_field_chars => errors.push(
                FieldError::new(name, format!("longer than {max_field_chars} characters")),
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

/// Normalises by the last segment of a dotted name: `contact.email` is an
/// email like `email`.
fn normalize_field(name: &str, text: String) -> Result<String, String> {
    match name.rsplit('.').next().unwrap_or(name) {
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
                Value::String(truncate(&text, MAX_ATTRIBUTION_CHARS)),
            );
        }
    }
    if !attribution.contains_key("referrer") {
        if let Some(referer) = &meta.referer {
            attribution.insert(
                "referrer".into(),
                Value::String(truncate(referer, MAX_ATTRIBUTION_CHARS)),
            );
        }
    }
    let request_facts = [
        ("client_ip", meta.client_ip.clone()),
        (
            "user_agent",
            meta.user_agent
                .as_deref()
                .map(|ua| truncate(ua, MAX_ATTRIBUTION_CHARS)),
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

    const LIMIT: usize = 10_000;

    fn run(body: Value, required: &[&str]) -> Normalized {
        normalize(body.as_object().unwrap(), &source(required), &meta(), LIMIT)
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
    fn bad_values_missing_fields_and_values_over_the_limit_are_errors() {
        let lead = run(
            json!({"email": "nope", "phone": "call me", "junk": [{"a": 1}],
                   "comment": "x".repeat(2500), "long": "x".repeat(LIMIT + 1)}),
            &["email", "zip"],
        );
        let fields: Vec<&str> = lead.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["email", "junk", "long", "phone", "zip"]);
        assert_eq!(lead.fields["comment"].as_str().unwrap().len(), 2500);
    }

    #[test]
    fn nested_objects_are_reached_by_dotted_paths_or_pass_through_flattened() {
        let body = json!({"contact": {"email": "Ann@Example.com", "phones": ["555", "0101"]},
                          "address": {"city": "Austin", "geo": {"state": "TX"}}});
        let flattened = run(body.clone(), &[]);
        assert_eq!(flattened.errors, vec![]);
        assert_eq!(flattened.fields["contact.email"], "ann@example.com");
        assert_eq!(flattened.fields["contact.phones"], "555, 0101");
        assert_eq!(flattened.fields["address.geo.state"], "TX");

        let mut mapped = source(&["email", "state"]);
        mapped.fields = Some(
            [
                ("email", "contact.email"),
                ("state", "address.geo.state"),
                ("city", "address.city"),
            ]
            .map(|(name, path)| (name.to_string(), path.to_string()))
            .into(),
        );
        let lead = normalize(body.as_object().unwrap(), &mapped, &meta(), LIMIT);
        assert_eq!(lead.errors, vec![]);
        assert_eq!(
            lead.fields,
            json!({"email": "ann@example.com", "state": "TX", "city": "Austin"})
                .as_object()
                .unwrap()
                .clone()
        );
    }

    #[test]
    fn too_deep_or_too_many_values_make_the_lead_invalid() {
        let mut deep = json!({"leaf": "x"});
        for _ in 0..8 {
            deep = json!({"level": deep});
        }
        let lead = run(deep, &[]);
        assert_eq!(lead.errors[0].field, "body");
        assert!(
            lead.errors[0].message.contains("deeper than 8"),
            "{:?}",
            lead.errors
        );

        let many: Map<String, Value> = (0..201).map(|n| (format!("k{n}"), json!(n))).collect();
        let lead = run(Value::Object(many), &[]);
        assert!(lead
            .errors
            .iter()
            .any(|e| e.message.contains("more than 200")));
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
        let lead = normalize(body.as_object().unwrap(), &source, &meta(), LIMIT);
        assert_eq!(
            lead.fields,
            json!({"email": "x@y.org"}).as_object().unwrap().clone()
        );
    }
}
