//! What views show of configuration that may hold secrets (SPEC section 9:
//! secrets never appear in attempt views): a `${VAR}` reference is shown
//! as written, a literal value of a sensitive header or URL query
//! parameter (`authorization`, `…key…`, `…token…`, `…secret…`,
//! `…password…`) as `[redacted]`. Stored rows keep what retries need.

use serde_json::Value;

/// Name parts that mark a header or query parameter as a secret.
const SENSITIVE_WORDS: [&str; 6] = [
    "authorization",
    "key",
    "token",
    "secret",
    "password",
    "signature",
];
pub const REDACTED: &str = "[redacted]";

fn is_sensitive(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SENSITIVE_WORDS.iter().any(|word| name.contains(word))
}

/// A header value as shown: its `${VAR}` reference, or redacted when the
/// header is sensitive.
pub fn header_value(name: &str, written: &str) -> String {
    if written.contains("${") || !is_sensitive(name) {
        written.to_string()
    } else {
        REDACTED.to_string()
    }
}

/// A URL as shown: a password in it and sensitive query parameters'
/// literal values redacted.
pub fn url(url: &str) -> String {
    let url = &without_password(url);
    let Some((base, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let shown: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => format!("{name}={}", header_value(name, value)),
            None => pair.to_string(),
        })
        .collect();
    let mut out = format!("{base}?{}", shown.join("&"));
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// `smtp://user:secret@host:587` as `smtp://user:[redacted]@host:587`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((credentials, host)) if credentials.contains(':') && !credentials.contains("${") => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:{REDACTED}@{host}{path}")
        }
        _ => url.to_string(),
    }
}

/// A buyer's frozen configuration (an attempt's `snapshot`) as shown:
/// literal secrets in its headers and URLs redacted.
pub fn snapshot(snapshot: &Value) -> Value {
    let mut shown = snapshot.clone();
    if let Some(headers) = shown.get_mut("headers").and_then(Value::as_object_mut) {
        for (name, value) in headers.iter_mut() {
            if let Some(text) = value.as_str() {
                *value = Value::String(header_value(name, text));
            }
        }
    }
    for call in ["ping", "post"] {
        if let Some(Value::String(written)) = shown.get_mut(call).and_then(|c| c.get_mut("url")) {
            *written = url(written);
        }
    }
    shown
}

/// An attempt's `request` (`{url, method, headers, body}`) as shown.
pub fn request(request: &Value) -> Value {
    let mut shown = request.clone();
    if let Some(Value::String(written)) = shown.get_mut("url") {
        *written = url(written);
    }
    if let Some(headers) = shown.get_mut("headers").and_then(Value::as_object_mut) {
        for (name, value) in headers.iter_mut() {
            if let Some(text) = value.as_str() {
                if text != REDACTED && name != "Idempotency-Key" {
                    *value = Value::String(header_value(name, text));
                }
            }
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_show_and_literal_secrets_do_not() {
        assert_eq!(
            header_value("Authorization", "Bearer ${TOKEN}"),
            "Bearer ${TOKEN}"
        );
        assert_eq!(header_value("X-Api-Key", "abc123"), REDACTED);
        assert_eq!(
            header_value("Accept", "application/json"),
            "application/json"
        );
        assert_eq!(
            url("smtp://leads:hunter2@mail.example.com:587?tls=required"),
            "smtp://leads:[redacted]@mail.example.com:587?tls=required"
        );
        assert_eq!(url("smtp://127.0.0.1:25"), "smtp://127.0.0.1:25");
        assert_eq!(
            url("https://b.example/post?key=abc&campaign=7&api_token=${T}#x"),
            "https://b.example/post?key=[redacted]&campaign=7&api_token=${T}#x"
        );
        let shown = snapshot(&json!({
            "headers": {"X-Api-Key": "literal-secret", "X-Source": "web"},
            "post": {"url": "https://b.example/p?secret=s3"},
        }));
        assert_eq!(shown["headers"]["X-Api-Key"], REDACTED);
        assert_eq!(shown["headers"]["X-Source"], "web");
        assert_eq!(
            shown["post"]["url"],
            "https://b.example/p?secret=[redacted]"
        );
    }
}
