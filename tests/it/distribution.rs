//! Distribution (SPEC section 7, "Distribution options"): the ping auction
//! against buyers bidding different amounts, buyer schedules read with a
//! fixed clock, and money per source and buyer.

use std::time::Duration;

use chrono::{DateTime, Utc};
use leadrouter::clock::Clock;
use leadrouter::config::{RoutingMode, Settings};
use serde_json::{json, Value};

use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{spawn_app_adjusted, wait_until, Backend};
use crate::on_both_databases;

on_both_databases!(
    a_schedule_skips_a_buyer_outside_its_days_and_hours_across_midnight,
    an_auction_posts_to_the_highest_bidder_first_and_falls_back_in_bid_order,
    a_ping_slower_than_the_auction_window_is_neither_waited_for_nor_posted,
    a_direct_post_buyer_takes_part_at_its_price_and_floors_hold,
    the_report_sums_revenue_payout_and_margin_and_a_return_reverses_them,
);

fn bid(amount: f64) -> Answer {
    Answer::Bid {
        bid: amount,
        delay: Duration::ZERO,
    }
}

/// Settings of an auction: `window`, and the routing reserve price.
fn auction(window: Duration, reserve_price: Option<f64>) -> impl FnOnce(&mut Settings) {
    move |settings: &mut Settings| {
        settings.routing.mode = RoutingMode::Auction;
        settings.routing.auction_window = window;
        settings.routing.reserve_price = reserve_price;
    }
}

/// The buyers posted to, in the order the posts went out.
fn posts_in_order(view: &Value) -> Vec<(String, String)> {
    view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|attempt| attempt["kind"] == "post")
        .map(|attempt| {
            (
                attempt["buyer_id"].as_str().unwrap().to_string(),
                attempt["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pair(buyer: &str, outcome: &str) -> (String, String) {
    (buyer.to_string(), outcome.to_string())
}

async fn an_auction_posts_to_the_highest_bidder_first_and_falls_back_in_bid_order(
    backend: Backend,
) {
    // Priorities run opposite to the bids: the auction ignores them.
    let low = TestBuyer::start(bid(10.0), bid(10.0));
    let mid = TestBuyer::start(bid(20.0), bid(20.0));
    let high = TestBuyer::start(bid(30.0), Answer::Reject);
    let toml = BuyerConfig::new("low", 1).toml(&low.base)
        + &BuyerConfig::new("mid", 2).toml(&mid.base)
        + &BuyerConfig::new("high", 3).toml(&high.base);
    let app = spawn_app_adjusted(backend, &toml, auction(Duration::from_secs(2), None)).await;
    let id = app.submit(json!({"email": "auction@example.com"})).await;
    let view = app.wait_for_state(&id, "sold").await;

    assert_eq!(view["sold_to"], "mid");
    assert_eq!(view["price"], 20.0);
    assert_eq!(
        posts_in_order(&view),
        [pair("high", "rejected"), pair("mid", "accepted")]
    );
    for buyer in [&low, &mid, &high] {
        assert_eq!(buyer.calls("ping").len(), 1, "every buyer pinged once");
    }
    assert!(low.calls("post").is_empty());
    let post: Value = serde_json::from_str(&mid.calls("post")[0].body).unwrap();
    assert_eq!(post["bid"], 20.0, "its own bid");
    assert_eq!(post["ping_id"], "auction-20", "its own ping id");
}

async fn a_ping_slower_than_the_auction_window_is_neither_waited_for_nor_posted(backend: Backend) {
    let slow = TestBuyer::start(
        Answer::Bid {
            bid: 50.0,
            delay: Duration::from_secs(4),
        },
        bid(50.0),
    );
    let fast = TestBuyer::start(bid(10.0), bid(10.0));
    let toml = BuyerConfig {
        ping_timeout: Some("10s"),
        ..BuyerConfig::new("slow", 1)
    }
    .toml(&slow.base)
        + &BuyerConfig::new("fast", 2).toml(&fast.base);
    let app = spawn_app_adjusted(backend, &toml, auction(Duration::from_millis(300), None)).await;
    let id = app.submit(json!({"email": "window@example.com"})).await;
    let view = app.wait_for_state(&id, "sold").await;
    assert_eq!(view["sold_to"], "fast");
    assert_eq!(posts_in_order(&view), [pair("fast", "accepted")]);
    let slow_ping_answered = |view: &Value| {
        view["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|attempt| attempt["buyer_id"] == "slow" && attempt["outcome"] != "in_flight")
    };
    assert!(
        !slow_ping_answered(&view),
        "sold before the slow ping answered: {view}"
    );

    // The late answer is still recorded, and never posted.
    wait_until(
        "the late ping to be recorded",
        Duration::from_secs(20),
        || async {
            let view = app.lead(&id).await;
            view["attempts"].as_array().unwrap().iter().any(|attempt| {
                attempt["buyer_id"] == "slow"
                    && attempt["kind"] == "ping"
                    && attempt["outcome"] == "accepted"
            })
        },
    )
    .await;
    assert!(slow.calls("post").is_empty());
}

async fn a_direct_post_buyer_takes_part_at_its_price_and_floors_hold(backend: Backend) {
    let top = TestBuyer::start(bid(25.0), Answer::Reject);
    let direct = TestBuyer::start(accept(), Answer::Reject);
    let cheap = TestBuyer::start(bid(5.0), bid(5.0));
    let picky = TestBuyer::start(bid(12.0), bid(12.0));
    let last = TestBuyer::start(bid(10.0), bid(10.0));
    let toml = BuyerConfig::new("top", 1).toml(&top.base)
        + &BuyerConfig {
            ping_timeout: None,
            extra: "price = 20.0",
            ..BuyerConfig::new("direct", 2)
        }
        .toml(&direct.base)
        + &BuyerConfig::new("cheap", 3).toml(&cheap.base)
        + &BuyerConfig {
            extra: "min_bid = 15.0",
            ..BuyerConfig::new("picky", 4)
        }
        .toml(&picky.base)
        + &BuyerConfig::new("last", 5).toml(&last.base);
    let app = spawn_app_adjusted(backend, &toml, auction(Duration::from_secs(2), Some(8.0))).await;
    let id = app.submit(json!({"email": "floors@example.com"})).await;
    let view = app.wait_for_state(&id, "sold").await;

    assert_eq!(
        posts_in_order(&view),
        [
            pair("top", "rejected"),
            pair("direct", "rejected"),
            pair("last", "accepted")
        ]
    );
    let mut below: Vec<(String, String)> = outcomes(&view)
        .into_iter()
        .filter(|(_, outcome)| outcome == "below_min_bid")
        .collect();
    below.sort();
    assert_eq!(
        below,
        [
            pair("cheap", "below_min_bid"),
            pair("picky", "below_min_bid")
        ],
        "under the reserve price and under a buyer's min_bid: never posted"
    );
    assert!(cheap.calls("post").is_empty() && picky.calls("post").is_empty());
    assert!(
        direct.calls("ping").is_empty(),
        "a direct-post buyer is not pinged"
    );
}

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
    let app = spawn_app_adjusted(backend, &toml, |settings| {
        settings.clock = Clock::Fixed(saturday_night)
    })
    .await;
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

/// The report's row for `id`.
fn report_row(report: &Value, id: &str) -> Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no row {id} in {report}"))
}

fn figures(row: &Value) -> [f64; 6] {
    ["leads", "valid", "sold", "revenue", "payout", "margin"].map(|key| row[key].as_f64().unwrap())
}

async fn the_report_sums_revenue_payout_and_margin_and_a_return_reverses_them(backend: Backend) {
    // Every post sells for 15.
    let acme = TestBuyer::start(accept(), accept());
    let app = spawn_app_adjusted(
        backend,
        &BuyerConfig::new("acme", 1).toml(&acme.base),
        |settings| {
            let share = settings
                .sources
                .iter_mut()
                .find(|s| s.id == "website")
                .unwrap();
            share.payout_share = Some(0.5);
            let fixed = settings
                .sources
                .iter_mut()
                .find(|s| s.id == "partner")
                .unwrap();
            fixed.payout = Some(4.0);
        },
    )
    .await;
    let from = Utc::now() - chrono::Duration::seconds(1);
    let web_one = app.submit(json!({"email": "w1@example.com"})).await;
    let web_two = app.submit(json!({"email": "w2@example.com"})).await;
    let invalid = app.post_form_lead(&json!({"email": "not an email"})).await;
    assert_eq!(invalid.status, 422);
    let feed = app
        .post_feed_lead(&json!({"lead_id": "p1", "email": "p1@example.com"}))
        .await;
    let feed = feed.json()["submission_id"].as_str().unwrap().to_string();
    for id in [&web_one, &web_two, &feed] {
        app.wait_for_state(id, "sold").await;
    }
    let report = |by: &'static str| {
        let app = &app;
        async move {
            let to = (Utc::now() + chrono::Duration::seconds(1)).to_rfc3339();
            let path = format!(
                "/v1/report?from={}&to={}&by={by}",
                urlencoded(&from.to_rfc3339()),
                urlencoded(&to)
            );
            let answer = app.admin_get(&path).await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            answer.json()
        }
    };
    let by_source = report("source").await;
    assert_eq!(
        figures(&report_row(&by_source, "website")),
        [3.0, 2.0, 2.0, 30.0, 15.0, 15.0]
    );
    assert_eq!(report_row(&by_source, "website")["sell_through"], 1.0);
    assert_eq!(
        figures(&report_row(&by_source, "partner")),
        [1.0, 1.0, 1.0, 15.0, 4.0, 11.0]
    );
    let by_buyer = report("buyer").await;
    assert_eq!(
        figures(&report_row(&by_buyer, "acme")),
        [3.0, 3.0, 3.0, 45.0, 19.0, 26.0]
    );
    let today = app.admin_get("/v1/status").await.json();
    assert_eq!(today["today"]["revenue"], 45.0, "{today}");
    assert_eq!(today["today"]["margin"], 26.0);
    let public = app
        .send(app.client.get(app.url("/v1/status")), "")
        .await
        .json();
    assert!(
        public["today"].is_null(),
        "business figures need the admin token"
    );

    let returned = app
        .admin_send(
            "POST",
            &format!("/v1/leads/{web_one}/return"),
            json!({"reason": "fake"}),
        )
        .await;
    assert_eq!(returned.status, 200, "{}", returned.text());
    let by_source = report("source").await;
    assert_eq!(
        figures(&report_row(&by_source, "website")),
        [3.0, 2.0, 1.0, 15.0, 7.5, 7.5],
        "the return reversed its revenue and payout"
    );
    let by_buyer = report("buyer").await;
    assert_eq!(
        figures(&report_row(&by_buyer, "acme")),
        [3.0, 3.0, 2.0, 30.0, 11.5, 18.5]
    );
    let bad = app.admin_get("/v1/report?by=country").await;
    assert_eq!(bad.status, 400);
}

fn urlencoded(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
}
