//! Request bodies: which formats intake reads, and parsing them into a map.

use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    Json,
    Form,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("content type {0:?} is not supported; send application/json or application/x-www-form-urlencoded")]
    Unsupported(String),
    #[error("{0}")]
    Unparsable(String),
}

impl BodyFormat {
    /// The format named by a `Content-Type`; none given is read as JSON.
    pub fn of(content_type: Option<&str>) -> Result<Self, BodyError> {
        let Some(content_type) = content_type else {
            return Ok(Self::Json);
        };
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        let essence = essence.to_ascii_lowercase();
        if essence == "application/json" || essence.ends_with("+json") {
            Ok(Self::Json)
        } else if essence == "application/x-www-form-urlencoded" {
            Ok(Self::Form)
        } else {
            Err(BodyError::Unsupported(content_type.to_string()))
        }
    }
}

/// Parses a body into its top-level keys. Repeated form keys become arrays.
pub fn parse_body(format: BodyFormat, body: &[u8]) -> Result<Map<String, Value>, BodyError> {
    let text = std::str::from_utf8(body)
        .map_err(|error| BodyError::Unparsable(format!("body is not valid UTF-8: {error}")))?;
    match format {
        BodyFormat::Json => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(BodyError::Unparsable("JSON body must be an object".into())),
            Err(error) => Err(BodyError::Unparsable(format!("malformed JSON: {error}"))),
        },
        BodyFormat::Form => {
            let pairs: Vec<(String, String)> = serde_urlencoded::from_str(text)
                .map_err(|error| BodyError::Unparsable(format!("malformed form body: {error}")))?;
            let mut map = Map::new();
            for (key, value) in pairs {
                if value.contains('\u{FFFD}') {
                    return Err(BodyError::Unparsable(format!(
                        "form field {key:?} is not valid UTF-8"
                    )));
                }
                match map.get_mut(&key) {
                    Some(Value::Array(values)) => values.push(Value::String(value)),
                    Some(first) => *first = Value::Array(vec![first.take(), Value::String(value)]),
                    None => {
                        map.insert(key, Value::String(value));
                    }
                }
            }
            Ok(map)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_the_content_type() {
        assert_eq!(
            BodyFormat::of(Some("application/json; charset=utf-8")),
            Ok(BodyFormat::Json)
        );
        assert_eq!(BodyFormat::of(None), Ok(BodyFormat::Json));
        assert_eq!(
            BodyFormat::of(Some("application/x-www-form-urlencoded")),
            Ok(BodyFormat::Form)
        );
        assert!(BodyFormat::of(Some("multipart/form-data; boundary=x")).is_err());
    }

    #[test]
    fn bodies_parse_or_say_why_not() {
        let form = parse_body(BodyFormat::Form, b"a=1&b=x%20y&a=2").unwrap();
        assert_eq!(form["a"], serde_json::json!(["1", "2"]));
        assert_eq!(form["b"], "x y");
        assert!(parse_body(BodyFormat::Json, b"[1]").is_err());
        assert!(parse_body(BodyFormat::Json, b"{\"a\":").is_err());
        assert!(parse_body(BodyFormat::Json, b"{\"a\":\"\xff\"}").is_err());
        assert!(parse_body(BodyFormat::Form, b"a=%FF").is_err());
    }
}
