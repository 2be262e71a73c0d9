//! Distribution (SPEC section 7, "Distribution options"): buyer schedules
//! read with a fixed clock.

use chrono::{DateTime, Utc};
use leadrouter::clock::Clock;
use serde_json::{json, Value};

use crate::buyers::{accept, BuyerConfig, TestBuyer};
use crate::helpers::{spawn_app_with_clock, Backend};
use crate::on_both_databases;

on_both_databases!(a_schedule_skips_a_buyer_outside_its_days_and_hours_across_midnight);

fn outcomes(view: &Value) -> Vec<(String, String)> {
    view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| {
            (
                attempt["buyer_id"].as_str().unwrap().to_string(),
                attempt["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn a_schedule_skips_a_buyer_outside_its_days_and_hours_across_midnight(backend: Backend) {
    let weekdays = TestBuyer::start(accept(), accept());
    let office = TestBuyer::start(accept(), accept());
    let nights = TestBuyer::start(accept(), accept());
    let scheduled = |id, priority, schedule: &str, buyer: &TestBuyer| {
        let extra = format!("schedule = {schedule}");
        BuyerConfig {
            extra: &extra,
            ..BuyerConfig::new(id, priority)
        }
        .toml(&buyer.base)
    };
    let toml = scheduled(
        "weekdays",
        1,
        r#"{ timezone = "UTC", days = ["mon", "tue", "wed", "thu", "fri"], hours = "00:00-24:00" }"#,
        &weekdays,
    ) + &scheduled(
        "office",
        2,
        r#"{ timezone = "America/New_York", days = ["mon", "tue", "wed", "thu", "fri"], hours = "08:00-20:00" }"#,
        &office,
    ) + &scheduled(
        "nights",
        3,
        r#"{ timezone = "UTC", days = ["fri"], hours = "22:00-02:00" }"#,
        &nights,
    );
    // Saturday 01:00 UTC: a Saturday for `weekdays`, Friday 20:00 in New
    // York (closed) for `office`, and still Friday's night for `nights`.
    let saturday_night: DateTime<Utc> = "2026-12-05T01:00:00Z".parse().unwrap();
    let app = spawn_app_with_clock(backend, &toml, Clock::Fixed(saturday_night)).await;
    let id = app.submit(json!({"email": "late@example.com"})).await;
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "nights");
    assert_eq!(
        outcomes(&view)[..2],
        [
            ("weekdays".to_string(), "closed_hours".to_string()),
            ("office".to_string(), "closed_hours".to_string()),
        ]
    );
    assert!(weekdays.calls("ping").is_empty() && office.calls("ping").is_empty());
    let buyers = app.admin_get("/v1/buyers").await.json();
    let open: Vec<(Value, Value)> = buyers
        .as_array()
        .unwrap()
        .iter()
        .map(|buyer| (buyer["id"].clone(), buyer["open_now"].clone()))
        .collect();
    assert_eq!(
        open,
        [
            (json!("weekdays"), json!(false)),
            (json!("office"), json!(false)),
            (json!("nights"), json!(true)),
        ]
    );
}
