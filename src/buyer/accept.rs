//! Judging a buyer's answer (SPEC section 7): accept rules (`path` with
//! `equals` or `one_of`, `body_contains`, `body_regex`, `status`), and
//! reading the bid, ping id and price out of a JSON answer.

use regex::Regex;
use serde_json::Value;

use crate::config::AcceptRule;

/// What an answer means for the waterfall, before timeouts are considered.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Accepted,
    Rejected,
    /// 5xx, 429, or a 2xx the rule cannot read.
    Error(String),
}

/// An accept rule, compiled once per buyer.
#[derive(Debug, Clone)]
pub enum AcceptCheck {
    Pointer { path: String, allowed: Vec<Value> },
    Contains(String),
    Matches(Regex),
    Status(Vec<u16>),
}

impl AcceptCheck {
    /// The configured rule; without one, `{path = "/accepted", equals = true}`.
    pub fn compile(rule: Option<&AcceptRule>) -> Self {
        let Some(rule) = rule else {
            return Self::Pointer {
                path: "/accepted".into(),
                allowed: vec![Value::Bool(true)],
            };
        };
        if let Some(path) = &rule.path {
            let allowed = rule
                .equals
                .iter()
                .chain(rule.one_of.iter().flatten())
                .map(|value| serde_json::to_value(value).unwrap_or(Value::Null))
                .collect();
            return Self::Pointer {
                path: path.clone(),
                allowed,
            };
        }
        if let Some(text) = &rule.body_contains {
            return Self::Contains(text.clone());
        }
        if let Some(pattern) = &rule.body_regex {
            // check-config rejects bad patterns; should one slip through, nothing is accepted.
            return Regex::new(pattern)
                .map(Self::Matches)
                .unwrap_or_else(|_| Self::Status(Vec::new()));
        }
        Self::Status(rule.status.clone().unwrap_or_default())
    }

    pub fn judge(&self, status: u16, body: &str) -> Verdict {
        if status >= 500 || status == 429 {
            return Verdict::Error(format!("HTTP {status}"));
        }
        if let Self::Status(accepted) = self {
            return if accepted.contains(&status) {
                Verdict::Accepted
            } else {
                Verdict::Rejected
            };
        }
        if !(200..300).contains(&status) {
            return Verdict::Rejected;
        }
        let holds = match self {
            Self::Pointer { path, allowed } => match serde_json::from_str::<Value>(body) {
                Ok(json) => json
                    .pointer(path)
                    .is_some_and(|found| allowed.iter().any(|want| same(found, want))),
                Err(_) => return Verdict::Error("the answer is not JSON".into()),
            },
            Self::Contains(text) => body.contains(text.as_str()),
            Self::Matches(regex) => regex.is_match(body),
            Self::Status(_) => unreachable!("handled above"),
        };
        if holds {
            Verdict::Accepted
        } else {
            Verdict::Rejected
        }
    }
}

/// Equal, treating numbers by value (`22` equals `22.0`).
fn same(found: &Value, want: &Value) -> bool {
    match (found.as_f64(), want.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => found == want,
    }
}

/// A number at `path` in a JSON answer; numeric strings count (`"50.00"`).
/// Only finite numbers: a bid or price of `"NaN"` or `"inf"` is no number.
pub fn number_at(body: &str, path: Option<&str>) -> Option<f64> {
    let json: Value = serde_json::from_str(body).ok()?;
    let number = match json.pointer(path?)? {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => text.trim().parse::<f64>().ok(),
        _ => None,
    }?;
    number.is_finite().then_some(number)
}

/// A string or number at `path` in a JSON answer, as text.
pub fn text_at(body: &str, path: Option<&str>) -> Option<String> {
    let json: Value = serde_json::from_str(body).ok()?;
    match json.pointer(path?)? {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(toml: &str) -> AcceptCheck {
        let rule: AcceptRule = toml::from_str(toml).unwrap();
        AcceptCheck::compile(Some(&rule))
    }

    #[test]
    fn pointer_rules_read_real_buyer_answers() {
        let check = rule(
            r#"path = "/response"
equals = "success""#,
        );
        let yes = r#"{"response":"success","leadAuctionId":123456,"bid":22,"details":"Thank You"}"#;
        let no = r#"{"response":"failure","details":"Quota Reached"}"#;
        assert_eq!(check.judge(200, yes), Verdict::Accepted);
        assert_eq!(check.judge(200, no), Verdict::Rejected);
        assert_eq!(
            check.judge(200, "<html>"),
            Verdict::Error("the answer is not JSON".into())
        );
        assert_eq!(check.judge(503, yes), Verdict::Error("HTTP 503".into()));
        assert_eq!(check.judge(429, yes), Verdict::Error("HTTP 429".into()));
        assert_eq!(check.judge(400, "bad"), Verdict::Rejected);
        let one_of = rule(
            r#"path = "/result"
one_of = ["success", "queued"]"#,
        );
        assert_eq!(
            one_of.judge(200, r#"{"result":"queued"}"#),
            Verdict::Accepted
        );
        assert_eq!(number_at(yes, Some("/bid")), Some(22.0));
        assert_eq!(
            text_at(yes, Some("/leadAuctionId")).as_deref(),
            Some("123456")
        );
        assert_eq!(
            number_at(r#"{"Payout":"50.00"}"#, Some("/Payout")),
            Some(50.0)
        );
        for not_a_price in [
            r#"{"bid":"NaN"}"#,
            r#"{"bid":"inf"}"#,
            r#"{"bid":"-infinity"}"#,
        ] {
            assert_eq!(number_at(not_a_price, Some("/bid")), None, "{not_a_price}");
        }
    }

    #[test]
    fn text_and_status_rules_serve_xml_buyers() {
        let xml = "<response><status>Matched</status><price>9</price></response>";
        assert_eq!(
            rule(r#"body_regex = "<status>Matched</status>""#).judge(200, xml),
            Verdict::Accepted
        );
        assert_eq!(
            rule(r#"body_contains = "Unmatched""#).judge(200, xml),
            Verdict::Rejected
        );
        assert_eq!(rule("status = [201]").judge(201, ""), Verdict::Accepted);
        assert_eq!(rule("status = [201]").judge(200, ""), Verdict::Rejected);
        assert_eq!(
            AcceptCheck::compile(None).judge(200, r#"{"accepted": true}"#),
            Verdict::Accepted
        );
    }
}
