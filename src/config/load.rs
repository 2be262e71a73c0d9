//! Reading `leadrouter.toml`: `${VAR}` interpolation, environment overrides,
//! and a list of every problem found, each with its key path.

use std::path::Path;

use toml::Value;

use super::problem::{ConfigError, Problem};
use super::settings::{BuyerSettings, Settings};
use super::validate;
use crate::domain::ConfigSnapshot;

/// Used when neither `--config` nor `LEADROUTER_CONFIG` names a file.
pub const DEFAULT_CONFIG_PATH: &str = "config/leadrouter.toml";

/// Each override replaces one key, after interpolation (SPEC section 3).
const ENV_OVERRIDES: [(&str, &str, &str); 4] = [
    ("DATABASE_URL", "database", "url"),
    ("LEADROUTER_ADMIN_TOKEN", "server", "admin_token"),
    ("LEADROUTER_LISTEN", "server", "listen"),
    ("LEADROUTER_LOG_FORMAT", "log", "format"),
];

/// Deserialisation is retried after dropping each offending key, so one run
/// reports many problems; this bounds the retries.
const MAX_REPORTED_PROBLEMS: usize = 100;

/// Reads and validates the configuration at `path`, with environment overrides.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let mut settings =
        parse(&text, |name| std::env::var(name).ok()).map_err(|problems| ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        })?;
    settings.source_path = Some(path.to_path_buf());
    Ok(settings)
}

/// A buyer's settings as an attempt's snapshot froze them (for a retry);
/// its `${VAR}` references are resolved from the environment now.
pub fn buyer_from_snapshot(snapshot: &serde_json::Value) -> Result<BuyerSettings, Vec<Problem>> {
    let problem = |message: String| {
        vec![Problem {
            path: "snapshot".into(),
            message,
        }]
    };
    let table = Value::try_from(snapshot).map_err(|error| problem(error.to_string()))?;
    let mut document = toml::Table::new();
    document.insert("buyers".into(), Value::Array(vec![table]));
    let text = toml::to_string(&document).map_err(|error| problem(error.to_string()))?;
    let mut settings = parse(&text, |name| std::env::var(name).ok())?;
    settings
        .buyers
        .pop()
        .ok_or_else(|| problem("no buyer in the snapshot".into()))
}

/// Parses configuration text; `env` looks up environment variables.
pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Settings, Vec<Problem>> {
    let written: Value = toml::from_str::<toml::Table>(text)
        .map(Value::Table)
        .map_err(|error| {
            vec![Problem {
                path: String::new(),
                message: format!("not valid TOML: {}", error.message().trim()),
            }]
        })?;
    let mut problems = Vec::new();
    let mut resolved = written.clone();
    interpolate(&mut resolved, String::new(), &env, &mut problems);
    apply_env_overrides(&mut resolved, &env);
    let settings = deserialize_reporting_all(resolved, &mut problems);
    let Some(mut settings) = settings else {
        return Err(problems);
    };
    attach_buyer_snapshots(&mut settings, &written);
    name_event_sinks(&mut settings);
    problems.extend(validate::check(&settings));
    if problems.is_empty() {
        Ok(settings)
    } else {
        Err(problems)
    }
}

/// An `[[events]]` table without an `id` is named after its URL (a
/// stable hash), so reordering the file moves no sink's history.
fn name_event_sinks(settings: &mut Settings) {
    for sink in &mut settings.events {
        if sink.id.trim().is_empty() {
            sink.id = format!("events-{:08x}", fnv1a(sink.url.expose()) as u32);
        }
    }
}

/// FNV-1a: a hash that stays the same across builds and platforms.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Replaces `${NAME}` in every string; an unset variable is a problem.
fn interpolate(
    value: &mut Value,
    path: String,
    env: &impl Fn(&str) -> Option<String>,
    problems: &mut Vec<Problem>,
) {
    match value {
        Value::String(text) => match substitute(text, env) {
            Ok(done) => *text = done,
            Err(message) => problems.push(Problem { path, message }),
        },
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                interpolate(item, format!("{path}[{index}]"), env, problems);
            }
        }
        Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                interpolate(item, join(&path, key), env, problems);
            }
        }
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn substitute(text: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "unterminated ${...} reference".to_string())?;
        let name = &after[..end];
        let value = env(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn apply_env_overrides(value: &mut Value, env: &impl Fn(&str) -> Option<String>) {
    let Value::Table(root) = value else { return };
    for (variable, section, key) in ENV_OVERRIDES {
        if let Some(setting) = env(variable) {
            let section = root
                .entry(section)
                .or_insert_with(|| Value::Table(Default::default()));
            if let Value::Table(section) = section {
                section.insert(key.to_string(), Value::String(setting));
            }
        }
    }
}

/// Deserialises, and after each error drops the offending key and tries
/// again, so that every unknown key and bad value is reported in one run.
fn deserialize_reporting_all(mut value: Value, problems: &mut Vec<Problem>) -> Option<Settings> {
    let mut dropped: Vec<String> = Vec::new();
    for _ in 0..MAX_REPORTED_PROBLEMS {
        match serde_path_to_error::deserialize::<_, Settings>(value.clone()) {
            Ok(settings) => return Some(settings),
            Err(error) => {
                let path = error.path().to_string();
                let path = if path == "." { String::new() } else { path };
                let message = error.inner().message().trim().to_string();
                if caused_by_an_earlier_drop(&path, &message, &dropped) {
                    return None;
                }
                problems.push(Problem {
                    path: path.clone(),
                    message,
                });
                if path.is_empty() || !remove_at(&mut value, &path) {
                    return None;
                }
                dropped.push(path);
            }
        }
    }
    None
}

/// A required key we removed ourselves shows up as "missing field": not news.
fn caused_by_an_earlier_drop(path: &str, message: &str, dropped: &[String]) -> bool {
    dropped.iter().any(|gone| {
        let (parent, key) = gone.rsplit_once('.').unwrap_or(("", gone));
        parent == path && message.contains(&format!("missing field `{key}`"))
    })
}

/// Removes the table entry at a path like `buyers[0].ping.timeout`.
fn remove_at(value: &mut Value, path: &str) -> bool {
    let (parent, key) = match path.rsplit_once('.') {
        Some((parent, key)) => (Some(parent), key),
        None => (None, path),
    };
    let mut node = value;
    for segment in parent.into_iter().flat_map(|p| p.split('.')) {
        let (name, indexes) = split_indexes(segment);
        let Some(next) = node.get_mut(name) else {
            return false;
        };
        node = next;
        for index in indexes {
            let Some(next) = node.get_mut(index) else {
                return false;
            };
            node = next;
        }
    }
    match node {
        Value::Table(table) if !key.contains('[') => table.remove(key).is_some(),
        _ => false,
    }
}

/// `buyers[0][1]` → (`buyers`, [0, 1]).
fn split_indexes(segment: &str) -> (&str, Vec<usize>) {
    let mut parts = segment.split('[');
    let name = parts.next().unwrap_or_default();
    let indexes = parts
        .filter_map(|part| part.trim_end_matches(']').parse().ok())
        .collect();
    (name, indexes)
}

/// Stores each buyer's table as written (secrets still `${VAR}`) for snapshots.
fn attach_buyer_snapshots(settings: &mut Settings, written: &Value) {
    let Some(Value::Array(tables)) = written.get("buyers") else {
        return;
    };
    for (buyer, table) in settings.buyers.iter_mut().zip(tables) {
        buyer.snapshot = ConfigSnapshot::of(serde_json::to_value(table).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn problems_of(text: &str) -> Vec<String> {
        parse(text, no_env)
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn an_empty_file_gives_the_documented_defaults() {
        let settings = parse("", no_env).unwrap();
        assert_eq!(settings.server.listen, "127.0.0.1:8080");
        assert_eq!(settings.routing.lease, std::time::Duration::from_secs(120));
        assert_eq!(settings.intake.duplicate_keys, ["email", "phone"]);
    }

    #[test]
    fn every_unknown_key_and_bad_duration_is_listed_with_its_path() {
        let problems = problems_of(
            r#"
            [server]
            listne = "x"
            [database]
            acquire_timeout = "2 parsecs"
            [[buyers]]
            id = "acme"
            colour = "red"
            [buyers.post]
            url = "http://127.0.0.1:1/post"
            timeout = "soon"
            "#,
        );
        let all = problems.join("\n");
        assert!(all.contains("server.listne"), "{all}");
        assert!(all.contains("database.acquire_timeout"), "{all}");
        assert!(all.contains("buyers[0].colour"), "{all}");
        assert!(all.contains("buyers[0].post.timeout"), "{all}");
        assert_eq!(problems.len(), 4, "{all}");
    }

    #[test]
    fn variables_are_interpolated_and_missing_ones_reported() {
        let text = r#"
            [server]
            admin_token = "${TOKEN}"
            [[sources]]
            id = "partner"
            kind = "feed"
            api_key = "${PARTNER_KEY}"
        "#;
        let settings = parse(text, |name| (name == "TOKEN").then(|| "t0k".into())).unwrap_err();
        assert_eq!(
            settings,
            vec![Problem {
                path: "sources[0].api_key".into(),
                message: "environment variable PARTNER_KEY is not set".into()
            }]
        );
        let env = |name: &str| {
            ["TOKEN", "PARTNER_KEY"]
                .contains(&name)
                .then(|| format!("value-of-{name}"))
        };
        let settings = parse(text, env).unwrap();
        assert_eq!(
            settings.sources[0].api_key.as_ref().unwrap().expose(),
            "value-of-PARTNER_KEY"
        );
    }

    #[test]
    fn environment_overrides_replace_the_file() {
        let env = |name: &str| match name {
            "DATABASE_URL" => Some("postgres://u:pw@db/x".to_string()),
            "LEADROUTER_LISTEN" => Some("0.0.0.0:9999".to_string()),
            _ => None,
        };
        let settings = parse("[server]\nlisten = \"127.0.0.1:1\"\n", env).unwrap();
        assert_eq!(settings.server.listen, "0.0.0.0:9999");
        assert_eq!(settings.database.display_url(), "postgres://u:***@db/x");
    }

    #[test]
    fn an_event_sink_without_an_id_is_named_after_its_url() {
        let text = |order: [&str; 2]| {
            order
                .map(|url| format!("[[events]]\nurl = \"{url}\"\non = [\"lead.sold\"]\n"))
                .join("\n")
        };
        let a = "http://127.0.0.1:9200/a";
        let b = "http://127.0.0.1:9200/b";
        let first = parse(&text([a, b]), no_env).unwrap();
        let swapped = parse(&text([b, a]), no_env).unwrap();
        assert!(first.events[0].id.starts_with("events-"));
        assert_ne!(first.events[0].id, first.events[1].id);
        assert_eq!(
            first.events[0].id, swapped.events[1].id,
            "reordering keeps ids"
        );
    }

    #[test]
    fn buyer_snapshots_keep_secret_references_unresolved() {
        let text = r#"
            [[buyers]]
            id = "acme"
            headers = { Authorization = "Bearer ${ACME_TOKEN}" }
            [buyers.post]
            url = "http://127.0.0.1:1/post"
        "#;
        let settings = parse(text, |name| (name == "ACME_TOKEN").then(|| "s3cret".into())).unwrap();
        let buyer = &settings.buyers[0];
        assert_eq!(buyer.headers["Authorization"].expose(), "Bearer s3cret");
        assert_eq!(
            buyer.snapshot.value["headers"]["Authorization"],
            "Bearer ${ACME_TOKEN}"
        );
        assert_eq!(
            format!("{:?}", buyer.headers),
            r#"{"Authorization": [redacted]}"#
        );
    }
}
