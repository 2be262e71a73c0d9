//! The log as a log shipper and a newcomer read it (SPEC section 8): the
//! real binary's stderr, a pipe. `[log] format = "json"` gives one object
//! per line with the lead's and the attempt's spans and no personal data;
//! text to a pipe has no colour and plain values; the demo's first screen
//! is not buried under actix-server's worker lines.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{close_stores, lines_of, wait_until, Backend, TestDatabase};
use crate::on_both_databases;
use crate::process::{Service, ServiceConfig};

on_both_databases!(json_logs_parse_line_by_line_and_hold_no_personal_data);

const EMAIL: &str = "zoe.logtest@example.com";
const PHONE: &str = "+1 (555) 014-2398";
/// The phone's digits, with or without the country code.
const PHONE_DIGITS: &str = "5550142398";
/// What makes the third lead invalid.
const BAD_EMAIL: &str = "zoe.logtest-at-example.com";

/// A buyer that rejects every ping, then one that buys, as TOML.
fn two_buyers(picky: &TestBuyer, acme: &TestBuyer) -> String {
    BuyerConfig::new("picky", 1).toml(&picky.base) + &BuyerConfig::new("acme", 2).toml(&acme.base)
}

/// Starts the service with `log` TOML; a lead of a known person is sold
/// (its first call panics, an injected fault: the actor is restarted and
/// the lead routed again; then a rejected ping, and a sale), a second one
/// of the same person is a duplicate and a third, its email malformed,
/// invalid. Answers the service, once its log tells the sold lead's walk
/// ended, and that lead's id.
async fn sell_a_lead_of_a_known_person(database: &TestDatabase, log: &str) -> (Service, String) {
    let picky = TestBuyer::start(Answer::Reject, accept());
    let acme = TestBuyer::start(accept(), accept());
    let faults = "[faults]\nbuyer_panics = { picky = 1 }\n";
    let extra = format!("{}\n{faults}{log}", two_buyers(&picky, &acme));
    let config = ServiceConfig::write(&database.url, "2s", &extra);
    let service = Service::start(&config).await;
    let app = &service.app;
    let person = json!({"email": EMAIL, "phone": PHONE, "first_name": "Zoe", "state": "CA"});
    let sold = app.submit(person.clone()).await;
    app.wait_for_state(&sold, "sold").await;
    let duplicate = app.submit(person).await;
    app.wait_for_state(&duplicate, "duplicate").await;
    let invalid = app
        .post_form_lead(&json!({"email": BAD_EMAIL, "phone": PHONE}))
        .await;
    assert_eq!(
        invalid.json()["lead_state"],
        "invalid",
        "{}",
        invalid.text()
    );
    assert_eq!(acme.calls("post").len(), 1, "the lead was posted to acme");
    wait_until(
        "the sale's walk end in the log",
        Duration::from_secs(20),
        || {
            let ended = service
                .stderr()
                .lines()
                .any(|line| line.contains("walk ended") && line.contains("sold"));
            async move { ended }
        },
    )
    .await;
    (service, sold)
}

/// No form of the person's email or phone in `log`.
fn assert_no_personal_data(log: &str) {
    for personal in [EMAIL, PHONE, PHONE_DIGITS, BAD_EMAIL, "Zoe"] {
        assert!(!log.contains(personal), "{personal:?} in the log:\n{log}");
    }
}

async fn json_logs_parse_line_by_line_and_hold_no_personal_data(backend: Backend) {
    let database = TestDatabase::create(backend).await;
    let (service, sold) =
        sell_a_lead_of_a_known_person(&database, "[log]\nformat = \"json\"\n").await;
    let log = service.stderr();
    let lines: Vec<Value> = log
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"))
        })
        .collect();
    for line in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(line[key].is_string(), "no {key} in {line}");
        }
    }
    // `Service` sets RUST_LOG=info,... : it, not the default filter (which
    // quiets actix_server), decides.
    assert!(
        lines
            .iter()
            .any(|line| line["target"].as_str().unwrap().starts_with("actix_server")),
        "RUST_LOG filters the JSON log"
    );
    // The lead's span (id and source) holds the attempts' spans (buyer
    // and kind) of its walk.
    let in_lead_span = |line: &&Value| {
        line["spans"].as_array().is_some_and(|spans| {
            spans
                .iter()
                .any(|span| span["name"] == "lead" && span["lead_id"] == sold.as_str())
        })
    };
    let of_the_lead: Vec<&Value> = lines.iter().filter(in_lead_span).collect();
    let lead_span = json!({"name": "lead", "lead_id": sold, "source": "website"});
    assert!(
        of_the_lead.iter().all(|line| line["spans"][0] == lead_span),
        "{of_the_lead:#?}"
    );
    let walk_ends: Vec<&Value> = of_the_lead
        .iter()
        .filter(|line| line["message"] == "walk ended")
        .map(|line| &line["end"])
        .collect();
    assert_eq!(
        walk_ends,
        ["failed", "sold"],
        "the panicked walk, then the sale"
    );
    assert!(
        lines
            .iter()
            .any(|line| line["message"] == "panicked" && line["level"] == "ERROR"),
        "the injected panic is a JSON event"
    );
    let attempts: Vec<(&str, &str, &str)> = of_the_lead
        .iter()
        .filter(|line| line["message"] == "buyer answered")
        .map(|line| {
            let span = &line["span"];
            assert_eq!(span["name"], "attempt", "{line}");
            assert!(span["attempt_id"].is_string(), "{line}");
            assert!(span["latency_ms"].is_u64(), "{line}");
            (
                span["buyer_id"].as_str().unwrap(),
                span["kind"].as_str().unwrap(),
                span["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            ("picky", "ping", "rejected"),
            ("acme", "ping", "accepted"),
            ("acme", "post", "accepted"),
        ]
    );
    assert_no_personal_data(&log);
    assert!(!log.contains('\x1b'), "no terminal codes in JSON");
}

#[actix_web::test]
async fn text_logs_to_a_pipe_have_no_colour_and_plain_values() {
    let database = TestDatabase::create(Backend::Sqlite).await;
    let (service, sold) = sell_a_lead_of_a_known_person(&database, "").await;
    let log = service.stderr();
    assert!(!log.contains('\x1b'), "colour codes in a piped log:\n{log}");
    assert!(
        log.lines()
            .any(|line| line.contains("lead stored") && line.contains("state=received")),
        "{log}"
    );
    let walk_end = log
        .lines()
        .find(|line| line.contains("walk ended") && line.contains("sold"))
        .unwrap();
    assert!(walk_end.contains(&format!("lead_id={sold}")), "{walk_end}");
    assert!(walk_end.contains("end=sold"), "{walk_end}");
    assert!(walk_end.contains("source=website"), "{walk_end}");
    assert!(!log.contains("Some("), "debug text in the log:\n{log}");
    assert_no_personal_data(&log);
    drop(service);
    close_stores().await;
}

/// `leadrouter demo` without `RUST_LOG`: its stderr until the banner's last
/// line, then everything it wrote once killed.
#[test]
fn the_demo_starts_without_a_line_per_server_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_leadrouter"))
        .arg("demo")
        .current_dir(dir.path())
        .env("LEADROUTER_LISTEN", "127.0.0.1:0")
        .env_remove("RUST_LOG")
        .env_remove("LEADROUTER_LOG_FORMAT")
        .env_remove("DATABASE_URL")
        .env_remove("LEADROUTER_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("leadrouter demo starts");
    let banner = lines_of(child.stdout.take().unwrap());
    let log = lines_of(child.stderr.take().unwrap());
    let mut printed = Vec::new();
    loop {
        let line = banner
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no demo banner; printed: {printed:?}"));
        let done = line.trim_start().starts_with("release check:");
        printed.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    // The pipe closed with the process: the reader ends, and so does this.
    let log: Vec<String> =
        std::iter::from_fn(|| log.recv_timeout(Duration::from_secs(10)).ok()).collect();
    assert!(
        log.iter().any(|line| line.contains("starting the actors")),
        "the service's own start is logged: {log:#?}"
    );
    for noise in ["starting 1 workers", "Actix runtime found"] {
        assert!(
            !log.iter().any(|line| line.contains(noise)),
            "{noise:?} in the demo's log: {log:#?}"
        );
    }
}
