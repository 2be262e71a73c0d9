//! `leadrouter verify-release --url URL --source ID`: release evidence
//! after a deploy (SPEC section 3). Six steps against the live service,
//! each printed as a line with ✓ or ✗:
//!
//! 1. submit a clearly marked test lead (`test: true`, `X-Test-Lead: 1`,
//!    attribution and consent made up for this run) through the endpoint;
//! 2. the stored record: the id answered is the one stored, kept as a test
//!    lead with its raw body;
//! 3. the notify deliveries: every channel confirmed it, and the contract
//!    is `accepted` (within `--wait`);
//! 4. attribution and consent survived: stored as sent, and in every
//!    confirmed notify delivery;
//! 5. a replay with the same key answers the same id, `replayed: true`;
//! 6. nothing was delivered twice: one confirmed try per channel and event.
//!
//! Admin reads use `LEADROUTER_ADMIN_TOKEN`; a feed source takes its key
//! from `--api-key` (or `LEADROUTER_SOURCE_KEY`). Exits non-zero naming the
//! first step that failed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How often the notify step asks again.
const POLL: Duration = Duration::from_millis(250);
/// How long after the replay deliveries are watched for a second try.
const REPLAY_SETTLE: Duration = Duration::from_secs(3);

/// What to check.
pub struct Check {
    pub url: String,
    pub source: String,
    pub admin_token: String,
    pub api_key: Option<String>,
    /// How long step 3 waits for the channels to confirm.
    pub wait: Duration,
}

/// One step's verdict.
type Step = Result<String, String>;

/// Runs the six steps; `Err` names the step that failed.
pub async fn run(check: Check) -> anyhow::Result<()> {
    let run = Run::new(check);
    let names = [
        "submit a test lead",
        "the stored record",
        "notify deliveries",
        "attribution and consent",
        "replay",
        "nothing delivered twice",
    ];
    println!(
        "verify-release against {} (source {:?}), test lead marked {:?}",
        run.check.url, run.check.source, run.marker
    );
    let mut lead_id = String::new();
    for (number, name) in names.into_iter().enumerate() {
        let step = match number {
            0 => run.submit().await.map(|(id, said)| {
                lead_id = id;
                said
            }),
            1 => run.stored(&lead_id).await,
            2 => run.delivered(&lead_id).await,
            3 => run.attribution_kept(&lead_id).await,
            4 => run.replayed(&lead_id).await,
            _ => run.delivered_once(&lead_id).await,
        };
        match step {
            Ok(said) => println!("✓ {}. {name}: {said}", number + 1),
            Err(why) => {
                println!("✗ {}. {name}: {why}", number + 1);
                anyhow::bail!("verify-release failed at step {} ({name})", number + 1);
            }
        }
    }
    println!("verify-release passed: lead {lead_id}");
    Ok(())
}

struct Run {
    check: Check,
    client: awc::Client,
    /// Unique to this run: the key, the campaign and the consent text.
    marker: String,
}

impl Run {
    fn new(check: Check) -> Self {
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(10))
            .finish();
        Self {
            check,
            client,
            marker: format!("verify-release-{}", crate::domain::new_id()),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.check.url.trim_end_matches('/'))
    }

    fn consent(&self) -> String {
        format!("Release check {}: I agree to be contacted.", self.marker)
    }

    fn lead_body(&self) -> Value {
        json!({
            "email": "release-check@example.com",
            "phone": "555-010-0000",
            "first_name": "Release",
            "last_name": "Check",
            "state": "CA",
            "zip": "90001",
            "test": true,
            "landing_page": "https://verify-release.invalid/landing",
            "utm_source": "verify-release",
            "utm_medium": "release",
            "utm_campaign": self.marker,
            "consent_text": self.consent(),
            "policy_version": "verify-release",
        })
    }

    /// Posts the test lead (with this run's key); the answer's status and body.
    async fn post_lead(&self) -> Result<(u16, Value), String> {
        let mut request = self
            .client
            .post(self.url(&format!("/v1/leads?source={}", self.check.source)))
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("Idempotency-Key", self.marker.as_str()))
            .insert_header(("X-Test-Lead", "1"));
        if let Some(key) = &self.check.api_key {
            request = request.insert_header(("X-Api-Key", key.as_str()));
        }
        let mut response = request
            .send_json(&self.lead_body())
            .await
            .map_err(|error| format!("the endpoint did not answer: {error}"))?;
        let status = response.status().as_u16();
        let body = response
            .json::<Value>()
            .await
            .map_err(|error| format!("HTTP {status}, not a JSON contract: {error}"))?;
        Ok((status, body))
    }

    async fn admin_lead(&self, lead_id: &str) -> Result<Value, String> {
        let mut response = self
            .client
            .get(self.url(&format!("/v1/leads/{lead_id}")))
            .insert_header((
                "Authorization",
                format!("Bearer {}", self.check.admin_token),
            ))
            .send()
            .await
            .map_err(|error| format!("admin read failed: {error}"))?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(format!(
                "GET /v1/leads/{lead_id} answered HTTP {status} (is LEADROUTER_ADMIN_TOKEN right?)"
            ));
        }
        response
            .json::<Value>()
            .limit(16 * 1024 * 1024)
            .await
            .map_err(|error| format!("admin read: {error}"))
    }

    async fn submit(&self) -> Result<(String, String), String> {
        let (status, contract) = self.post_lead().await?;
        let id = contract["submission_id"].as_str().unwrap_or_default();
        if !(200..300).contains(&status) || contract["server_recorded"] != true || id.is_empty() {
            return Err(format!("HTTP {status}: {contract}"));
        }
        Ok((
            id.to_string(),
            format!("HTTP {status}, id {id}, {}", contract["acceptance"]),
        ))
    }

    async fn stored(&self, lead_id: &str) -> Step {
        let lead = self.admin_lead(lead_id).await?;
        if lead["id"] != lead_id {
            return Err(format!("stored under another id: {}", lead["id"]));
        }
        if lead["test"] != true {
            return Err("not stored as a test lead".into());
        }
        if !lead["raw"]
            .as_str()
            .unwrap_or_default()
            .contains(&self.marker)
        {
            return Err("the raw body was not kept as sent".into());
        }
        if lead["lead_state"] == "invalid" {
            return Err(format!("stored as invalid: {}", lead["errors"]));
        }
        Ok(format!(
            "lead {lead_id} stored as a test lead, state {}",
            lead["lead_state"]
        ))
    }

    /// The notify channels the service runs (from `/v1/status`).
    async fn channels(&self) -> Result<Vec<String>, String> {
        let mut response = self
            .client
            .get(self.url("/v1/status"))
            .insert_header((
                "Authorization",
                format!("Bearer {}", self.check.admin_token),
            ))
            .send()
            .await
            .map_err(|error| format!("GET /v1/status failed: {error}"))?;
        let status: Value = response
            .json()
            .limit(16 * 1024 * 1024)
            .await
            .map_err(|error| format!("GET /v1/status: {error}"))?;
        Ok(status["notify"]
            .as_array()
            .map(|channels| {
                channels
                    .iter()
                    .filter(|channel| channel["kind"] != "events")
                    .filter_map(|channel| channel["id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Every channel the service runs confirmed the lead, and the contract
    /// is `accepted`, within `--wait`.
    async fn delivered(&self, lead_id: &str) -> Step {
        let expected = self.channels().await?;
        let started = Instant::now();
        loop {
            let lead = self.admin_lead(lead_id).await?;
            let notify = deliveries(&lead, "notify");
            let row_of =
                |channel: &str| notify.iter().find(|row| row["channel"] == channel).copied();
            let unconfirmed: Vec<&String> = expected
                .iter()
                .filter(|channel| row_of(channel).is_none_or(|row| row["state"] != "confirmed"))
                .collect();
            let accepted = lead["contract"]["acceptance"] == "accepted";
            if accepted && unconfirmed.is_empty() {
                return Ok(if expected.is_empty() {
                    "no notify channel configured; the contract is accepted".into()
                } else {
                    format!(
                        "{} channel(s) confirmed ({}); the contract is accepted",
                        expected.len(),
                        expected.join(", ")
                    )
                });
            }
            if started.elapsed() >= self.check.wait {
                let waiting: Vec<String> = unconfirmed
                    .iter()
                    .map(|channel| match row_of(channel) {
                        Some(row) => format!(
                            "{channel} {} after {} tries ({})",
                            row["state"].as_str().unwrap_or_default(),
                            row["tries"],
                            row["last_error"].as_str().unwrap_or("no answer yet")
                        ),
                        None => format!("{channel}: no delivery planned yet"),
                    })
                    .collect();
                return Err(format!(
                    "not confirmed within {}: {}; the contract is {}",
                    humantime::format_duration(self.check.wait),
                    if waiting.is_empty() {
                        "every channel confirmed".to_string()
                    } else {
                        waiting.join("; ")
                    },
                    lead["contract"]["acceptance"]
                ));
            }
            actix_web::rt::time::sleep(POLL).await;
        }
    }

    async fn attribution_kept(&self, lead_id: &str) -> Step {
        let lead = self.admin_lead(lead_id).await?;
        let sent = self.lead_body();
        for key in [
            "utm_source",
            "utm_campaign",
            "consent_text",
            "landing_page",
            "policy_version",
        ] {
            if lead["attribution"][key] != sent[key] {
                return Err(format!(
                    "attribution {key} stored as {}, sent {}",
                    lead["attribution"][key], sent[key]
                ));
            }
        }
        let consent = self.consent();
        let mut checked = 0;
        for attempt in confirmed_tries(&lead, "notify") {
            let body = attempt["request"]["body"].as_str().unwrap_or_default();
            if !body.contains(&consent) {
                return Err(format!(
                    "the consent text did not reach notify channel {}",
                    attempt["buyer_id"]
                ));
            }
            checked += 1;
        }
        Ok(format!(
            "attribution and consent stored as sent, and in {checked} notify delivery(ies)"
        ))
    }

    async fn replayed(&self, lead_id: &str) -> Step {
        let (status, contract) = self.post_lead().await?;
        if status != 200 || contract["replayed"] != true || contract["submission_id"] != lead_id {
            return Err(format!("HTTP {status}: {contract}"));
        }
        Ok(format!(
            "HTTP 200, replayed, same id, {}",
            contract["acceptance"]
        ))
    }

    async fn delivered_once(&self, lead_id: &str) -> Step {
        actix_web::rt::time::sleep(REPLAY_SETTLE).await;
        let lead = self.admin_lead(lead_id).await?;
        let mut per_target: HashMap<String, usize> = HashMap::new();
        for kind in ["notify", "event"] {
            for attempt in confirmed_tries(&lead, kind) {
                let body: Value =
                    serde_json::from_str(attempt["request"]["body"].as_str().unwrap_or_default())
                        .unwrap_or_default();
                let target = format!(
                    "{} {}{}",
                    kind,
                    attempt["buyer_id"].as_str().unwrap_or_default(),
                    body["event"]
                        .as_str()
                        .map(|e| format!(" {e}"))
                        .unwrap_or_default()
                );
                *per_target.entry(target).or_default() += 1;
            }
        }
        let twice: Vec<String> = per_target
            .iter()
            .filter(|(_, count)| **count > 1)
            .map(|(target, count)| format!("{target} × {count}"))
            .collect();
        if !twice.is_empty() {
            return Err(format!("delivered more than once: {}", twice.join(", ")));
        }
        Ok(format!(
            "{} delivery(ies), each exactly once",
            per_target.len()
        ))
    }
}

fn deliveries<'a>(lead: &'a Value, kind: &str) -> Vec<&'a Value> {
    lead["deliveries"]
        .as_array()
        .map(|rows| rows.iter().filter(|row| row["kind"] == kind).collect())
        .unwrap_or_default()
}

fn confirmed_tries<'a>(lead: &'a Value, kind: &str) -> Vec<&'a Value> {
    lead["attempts"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter(|row| row["kind"] == kind && row["outcome"] == "accepted")
                .collect()
        })
        .unwrap_or_default()
}
