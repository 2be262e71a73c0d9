//! Checks that need the whole configuration: unique ids, feeds with keys,
//! well-formed URLs, accept rules and schedules.

use std::collections::HashSet;
use std::time::Duration;

use super::problem::Problem;
use super::settings::{
    AcceptRule, BuyerSettings, NotifyKind, NotifySettings, Secret, Settings, SourceKind, EVENTS,
};

/// Schedule days, Monday first.
pub const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

pub fn check(settings: &Settings) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut problem = |path: String, message: String| problems.push(Problem { path, message });

    if settings
        .server
        .listen
        .parse::<std::net::SocketAddr>()
        .is_err()
    {
        problem(
            "server.listen".into(),
            "expected an address like 127.0.0.1:8080".into(),
        );
    }
    if settings.server.max_body_bytes == 0 {
        problem("server.max_body_bytes".into(), "must be at least 1".into());
    }
    let url = settings.database.url.expose();
    if !(url.starts_with("sqlite:")
        || url.starts_with("postgres://")
        || url.starts_with("postgresql://"))
    {
        problem(
            "database.url".into(),
            "expected a sqlite: or postgres:// URL".into(),
        );
    }
    if settings.database.max_connections == 0 {
        problem(
            "database.max_connections".into(),
            "must be at least 1".into(),
        );
    }
    if !settings.alerts.webhook_url.is_empty() {
        check_url(
            "alerts.webhook_url",
            &settings.alerts.webhook_url,
            &mut problem,
        );
    }

    let mut source_ids = HashSet::new();
    let mut api_keys = HashSet::new();
    for (index, source) in settings.sources.iter().enumerate() {
        let at = |key: &str| format!("sources[{index}].{key}");
        if source.id.trim().is_empty() {
            problem(at("id"), "must not be empty".into());
        } else if !source_ids.insert(source.id.as_str()) {
            problem(at("id"), format!("duplicate source id {:?}", source.id));
        }
        match (source.payout, source.payout_share) {
            (Some(_), Some(_)) => problem(
                at("payout_share"),
                "set payout or payout_share, not both".into(),
            ),
            (Some(payout), None) if !(payout.is_finite() && payout >= 0.0) => {
                problem(at("payout"), "must be a number ≥ 0".into())
            }
            (None, Some(share)) if !(0.0..=1.0).contains(&share) => {
                problem(at("payout_share"), "must be between 0 and 1".into())
            }
            _ => {}
        }
        match (source.kind, &source.api_key) {
            (SourceKind::Feed, None) => problem(at("api_key"), "a feed needs an api_key".into()),
            (SourceKind::Feed, Some(key)) if key.expose().is_empty() => {
                problem(at("api_key"), "must not be empty".into())
            }
            (SourceKind::Feed, Some(key)) if !api_keys.insert(key.expose()) => problem(
                at("api_key"),
                "the same api_key is used by another feed".into(),
            ),
            (SourceKind::Form, Some(_)) => problem(
                at("api_key"),
                "a form source takes no api_key (use kind = \"feed\")".into(),
            ),
            _ => {}
        }
        if !source.thank_you_url.is_empty() {
            check_url(&at("thank_you_url"), &source.thank_you_url, &mut problem);
        }
        for origin in &source.allowed_origins {
            if source.kind != SourceKind::Form {
                problem(
                    at("allowed_origins"),
                    "only form sources are called from browsers".into(),
                );
            } else if !is_origin(origin) {
                problem(
                    at("allowed_origins"),
                    format!("not an origin (scheme://host[:port], no path): {origin:?}"),
                );
            }
        }
    }

    let mut buyer_ids = HashSet::new();
    for (index, buyer) in settings.buyers.iter().enumerate() {
        let at = |key: &str| format!("buyers[{index}].{key}");
        if buyer.id.trim().is_empty() {
            problem(at("id"), "must not be empty".into());
        } else if !buyer_ids.insert(buyer.id.as_str()) {
            problem(at("id"), format!("duplicate buyer id {:?}", buyer.id));
        }
        check_buyer(buyer, &at, &mut problem);
        let ping_template = buyer
            .ping
            .as_ref()
            .and_then(|ping| ping.body_template.as_deref());
        for field in ping_template.map(template_fields).unwrap_or_default() {
            if settings.routing.pii_fields.iter().any(|pii| pii == field) {
                problem(
                    at("ping.body_template"),
                    format!("names {field:?}, one of routing.pii_fields: pings never carry personal data"),
                );
            }
        }
    }

    // Notify channels and event sinks share attempt rows' `buyer_id` with
    // buyers: one id names one thing.
    let mut delivery_ids: HashSet<&str> = buyer_ids.clone();
    for (index, channel) in settings.notify.iter().enumerate() {
        let at = |key: &str| format!("notify[{index}].{key}");
        if channel.id.trim().is_empty() || channel.id.contains(':') {
            problem(at("id"), "must not be empty or hold ':'".into());
        } else if !delivery_ids.insert(channel.id.as_str()) {
            problem(
                at("id"),
                format!("id {:?} is already a buyer's or channel's", channel.id),
            );
        }
        check_notify_channel(channel, &at, &mut problem);
    }
    for (index, events) in settings.events.iter().enumerate() {
        if events.id.contains(':') {
            problem(format!("events[{index}].id"), "must not hold ':'".into());
        } else if !delivery_ids.insert(events.id.as_str()) {
            problem(
                format!("events[{index}].id"),
                format!(
                    "id {:?} is already a buyer's, channel's or sink's",
                    events.id
                ),
            );
        }
        check_secret_url(&format!("events[{index}].url"), &events.url, &mut problem);
        for name in events
            .on
            .iter()
            .filter(|name| !EVENTS.contains(&name.as_str()))
        {
            problem(
                format!("events[{index}].on"),
                format!("unknown event {name:?}; known: {}", EVENTS.join(", ")),
            );
        }
    }
    let faults = &settings.faults;
    for (table, buyers) in [
        ("buyer_panics", &faults.buyer_panics),
        ("probe_panics", &faults.probe_panics),
    ] {
        for buyer_id in buyers.keys() {
            if !buyer_ids.contains(buyer_id.as_str()) {
                problem(
                    format!("faults.{table}.{buyer_id}"),
                    format!("no buyer has id {buyer_id:?}"),
                );
            }
        }
    }
    if settings.supervision.period.is_zero() {
        problem("supervision.period".into(), "must be longer than 0s".into());
    }
    if settings.routing.lease < Duration::from_secs(1) {
        problem(
            "routing.lease".into(),
            "must be at least 1s (it is renewed every third of it)".into(),
        );
    }
    if let Some(reserve) = settings.routing.reserve_price {
        check_money("routing.reserve_price", reserve, &mut problem);
    }
    if settings.routing.failure_limit == 0 {
        problem("routing.failure_limit".into(), "must be at least 1".into());
    }
    problems
}

fn check_buyer(
    buyer: &BuyerSettings,
    at: &dyn Fn(&str) -> String,
    problem: &mut impl FnMut(String, String),
) {
    if buyer.post.url.trim().is_empty() {
        problem(at("post.url"), "a buyer needs post.url".into());
    } else {
        check_url(&at("post.url"), &buyer.post.url, problem);
    }
    if let Some(ping) = &buyer.ping {
        check_url(&at("ping.url"), &ping.url, problem);
        if let Some(rule) = &ping.accept {
            check_accept_rule(&at("ping.accept"), rule, problem);
        }
    }
    if let Some(rule) = &buyer.post.accept {
        check_accept_rule(&at("post.accept"), rule, problem);
    }
    for (key, money) in [("price", buyer.price), ("min_bid", buyer.min_bid)] {
        if let Some(money) = money {
            check_money(&at(key), money, problem);
        }
    }
    if buyer.max_concurrency == 0 {
        problem(at("max_concurrency"), "must be at least 1".into());
    }
    let circuit = &buyer.circuit;
    if circuit.failure_threshold == 0 {
        problem(at("circuit.failure_threshold"), "must be at least 1".into());
    }
    if circuit.half_open_probes == 0 {
        problem(at("circuit.half_open_probes"), "must be at least 1".into());
    }
    if circuit.open_for.is_zero() {
        problem(at("circuit.open_for"), "must be longer than 0s".into());
    }
    if circuit.open_for > circuit.max_open_for {
        problem(
            at("circuit.open_for"),
            "must not exceed circuit.max_open_for".into(),
        );
    }
    if let Some(schedule) = &buyer.schedule {
        for day in schedule
            .days
            .iter()
            .filter(|day| !WEEKDAYS.contains(&day.as_str()))
        {
            problem(
                at("schedule.days"),
                format!("unknown day {day:?}; use mon..sun"),
            );
        }
        if parse_hours(&schedule.hours).is_none_or(|(opens, _)| opens >= 24 * 60) {
            problem(at("schedule.hours"), "expected \"HH:MM-HH:MM\"".into());
        }
        if schedule.timezone.parse::<chrono_tz::Tz>().is_err() {
            problem(
                at("schedule.timezone"),
                format!("unknown IANA time zone {:?}", schedule.timezone),
            );
        }
    }
}

/// `"08:00-20:00"` → minutes since midnight of the start and the end.
pub fn parse_hours(text: &str) -> Option<(u32, u32)> {
    let minutes = |hm: &str| {
        let (h, m) = hm.trim().split_once(':')?;
        let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
        (h <= 24 && m < 60 && h * 60 + m <= 24 * 60).then_some(h * 60 + m)
    };
    let (start, end) = text.split_once('-')?;
    Some((minutes(start)?, minutes(end)?))
}

/// Money is a finite number ≥ 0.
fn check_money(path: &str, money: f64, problem: &mut impl FnMut(String, String)) {
    if !(money.is_finite() && money >= 0.0) {
        problem(path.to_string(), "must be a number ≥ 0".into());
    }
}

/// A notify channel has what its `kind` needs.
fn check_notify_channel(
    channel: &NotifySettings,
    at: &impl Fn(&str) -> String,
    problem: &mut impl FnMut(String, String),
) {
    if channel.max_concurrency == 0 {
        problem(at("max_concurrency"), "must be at least 1".into());
    }
    let mut require = |key: &str, present: bool| {
        if !present {
            problem(
                at(key),
                format!("required for kind = {:?}", channel.kind.as_str()),
            );
        }
    };
    match channel.kind {
        NotifyKind::Webhook | NotifyKind::Slack => {}
        NotifyKind::Telegram => {
            require("bot_token", channel.bot_token.is_some());
            require("chat_id", channel.chat_id.is_some());
        }
        NotifyKind::Email => {
            require("from", channel.from.is_some());
            require("to", !channel.to.is_empty());
        }
    }
    if channel.kind == NotifyKind::Email {
        let url = channel.url.expose();
        if !(url.starts_with("smtp://") || url.starts_with("smtps://")) {
            problem(at("url"), "not an smtp:// or smtps:// URL".into());
        }
        for (key, address) in channel
            .from
            .iter()
            .map(|from| ("from", from))
            .chain(channel.to.iter().map(|to| ("to", to)))
        {
            if address.parse::<lettre::Address>().is_err() {
                problem(at(key), format!("not an e-mail address: {address:?}"));
            }
        }
    } else {
        check_secret_url(&at("url"), &channel.url, problem);
    }
}

/// Like [`check_url`] for a URL that may hold a secret: the problem does
/// not repeat it.
fn check_secret_url(path: &str, url: &Secret, problem: &mut impl FnMut(String, String)) {
    if !is_http_url(url.expose()) {
        problem(path.to_string(), "not an http(s) URL".into());
    }
}

/// The field names a template substitutes (`{{fields.NAME}}`).
fn template_fields(template: &str) -> Vec<&str> {
    template
        .split("{{")
        .skip(1)
        .filter_map(|rest| rest.split_once("}}"))
        .filter_map(|(name, _)| name.trim().strip_prefix("fields."))
        .collect()
}

/// `https://www.example.com` or `http://127.0.0.1:8080`: what a browser
/// sends as `Origin`.
fn is_origin(origin: &str) -> bool {
    let Some((scheme, host)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !host.is_empty()
        && !host.contains('/')
        && origin.parse::<awc::http::Uri>().is_ok()
}

fn check_url(path: &str, url: &str, problem: &mut impl FnMut(String, String)) {
    if !is_http_url(url) {
        problem(path.to_string(), format!("not an http(s) URL: {url:?}"));
    }
}

fn is_http_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://"))
        && url.parse::<awc::http::Uri>().is_ok()
}

fn check_accept_rule(path: &str, rule: &AcceptRule, problem: &mut impl FnMut(String, String)) {
    let forms = [
        rule.path.is_some(),
        rule.body_contains.is_some(),
        rule.body_regex.is_some(),
        rule.status.is_some(),
    ];
    if forms.iter().filter(|set| **set).count() != 1 {
        problem(
            path.to_string(),
            "give exactly one of path (with equals or one_of), body_contains, body_regex, status"
                .into(),
        );
    }
    if let Some(pointer) = &rule.path {
        if !pointer.starts_with('/') {
            problem(
                format!("{path}.path"),
                "a JSON pointer starts with '/'".into(),
            );
        }
        if rule.equals.is_some() == rule.one_of.is_some() {
            problem(
                path.to_string(),
                "path needs exactly one of equals or one_of".into(),
            );
        }
    }
    if let Some(pattern) = &rule.body_regex {
        if let Err(error) = regex::Regex::new(pattern) {
            problem(
                format!("{path}.body_regex"),
                format!("not a valid regex: {error}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::load::parse;

    fn problems(text: &str) -> String {
        parse(text, |_| None)
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn duplicate_ids_feeds_without_keys_and_buyers_without_post_url_are_rejected() {
        let all = problems(
            r#"
            [[sources]]
            id = "web"
            kind = "form"
            [[sources]]
            id = "web"
            kind = "feed"
            [[buyers]]
            id = "a"
            [buyers.post]
            url = ""
            [[buyers]]
            id = "a"
            [buyers.post]
            url = "http://127.0.0.1:9/post"
            accept = { path = "accepted" }
            "#,
        );
        assert!(all.contains("sources[1].id: duplicate source id"), "{all}");
        assert!(
            all.contains("sources[1].api_key: a feed needs an api_key"),
            "{all}"
        );
        assert!(
            all.contains("buyers[0].post.url: a buyer needs post.url"),
            "{all}"
        );
        assert!(all.contains("buyers[1].id: duplicate buyer id"), "{all}");
        assert!(all.contains("buyers[1].post.accept.path"), "{all}");
    }

    #[test]
    fn a_buyer_missing_its_post_table_is_named() {
        let all = problems("[[buyers]]\nid = \"a\"\n");
        assert!(all.contains("buyers[0]: missing field `post`"), "{all}");
    }
}
