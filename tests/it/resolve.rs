//! Settling an `unknown` lead by hand (SPEC section 5, `resolve`) on SQLite
//! and PostgreSQL: each resolve that breaks a rule is a 422 naming it and
//! changes nothing in the database; the ones that keep them settle the
//! lead, take the post's bid when no price is named, and are recorded in
//! the lead's attempts; two at once never both win.

use entity::{attempt, cap_use, lead, sale};
use futures_util::future::join_all;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{json, Value};

use crate::buyers::{accept, Answer, BuyerConfig, TestBuyer};
use crate::helpers::{spawn_app_with, Backend, TestApp};
use crate::on_both_databases;

on_both_databases!(
    a_resolve_that_breaks_a_rule_is_refused_and_changes_nothing,
    a_lead_resolved_not_sold_to_a_buyer_it_was_posted_to_is_unsold_with_the_resolve_in_its_history,
    two_resolves_at_once_settle_the_lead_once,
    a_sale_with_no_price_named_bid_or_fixed_is_refused_until_a_price_is_named,
);

/// The buyers of these scenarios: `other` (priority 1) rejects the post,
/// `acme` (2) bids 12.5 and never answers the post (it times out: the lead
/// is `unknown`), `idle` (3) is never reached.
struct Buyers {
    other: TestBuyer,
    acme: TestBuyer,
    idle: TestBuyer,
}

impl Buyers {
    fn start() -> Self {
        Self {
            other: TestBuyer::start(accept(), Answer::Reject),
            acme: TestBuyer::start(accept(), Answer::Hang),
            idle: TestBuyer::start(accept(), accept()),
        }
    }

    fn toml(&self) -> String {
        let acme = BuyerConfig {
            post_timeout: "300ms",
            extra: "daily_cap = 10",
            ..BuyerConfig::new("acme", 2)
        };
        [
            BuyerConfig::new("other", 1).toml(&self.other.base),
            acme.toml(&self.acme.base),
            BuyerConfig::new("idle", 3).toml(&self.idle.base),
        ]
        .concat()
    }
}

/// An app with `Buyers` and `count` leads left `unknown` by acme's post.
async fn unknown_leads(backend: Backend, count: usize) -> (TestApp, Buyers, Vec<String>) {
    let buyers = Buyers::start();
    let app = spawn_app_with(backend, &buyers.toml()).await;
    let mut ids = Vec::new();
    for n in 0..count {
        let id = app
            .submit(json!({"email": format!("unknown{n}@example.com")}))
            .await;
        app.wait_for_state(&id, "unknown").await;
        ids.push(id);
    }
    (app, buyers, ids)
}

async fn resolve(app: &TestApp, id: &str, body: Value) -> crate::helpers::Answer {
    app.admin_send("POST", &format!("/v1/leads/{id}/resolve"), body)
        .await
}

/// Everything a resolve could change, as the database holds it: the lead's
/// row, sales and attempts, and every cap counter.
async fn footprint(app: &TestApp, id: &str) -> String {
    let db = app.store.connection();
    let row = lead::Entity::find_by_id(id).one(db).await.unwrap();
    let sales = sales_of(app, id).await;
    let attempts = attempt::Entity::find()
        .filter(attempt::Column::LeadId.eq(id))
        .order_by_asc(attempt::Column::Id)
        .all(db)
        .await
        .unwrap();
    let caps = cap_use::Entity::find().all(db).await.unwrap();
    format!("{row:?}\n{sales:?}\n{attempts:?}\n{caps:?}")
}

async fn sales_of(app: &TestApp, id: &str) -> Vec<sale::Model> {
    sale::Entity::find()
        .filter(sale::Column::LeadId.eq(id))
        .all(app.store.connection())
        .await
        .unwrap()
}

/// The lead's `resolve` attempts as `(buyer_id, outcome)`.
async fn resolves_of(app: &TestApp, id: &str) -> Vec<(String, String)> {
    let view = app.lead(id).await;
    view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|attempt| attempt["kind"] == "resolve")
        .map(|attempt| {
            let text = |key: &str| attempt[key].as_str().unwrap_or_default().to_string();
            (text("buyer_id"), text("outcome"))
        })
        .collect()
}

async fn a_resolve_that_breaks_a_rule_is_refused_and_changes_nothing(backend: Backend) {
    let (app, buyers, ids) = unknown_leads(backend, 1).await;
    let id = &ids[0];
    assert_eq!(buyers.other.calls("post").len(), 1);
    assert!(buyers.idle.calls("ping").is_empty());
    let refusals = [
        (
            json!({"buyer_id": "no-such-buyer", "sold": true}),
            "unknown_buyer",
        ),
        (
            json!({"buyer_id": "no-such-buyer", "sold": false}),
            "unknown_buyer",
        ),
        (
            json!({"buyer_id": "idle", "sold": false}),
            "buyer_not_posted",
        ),
        (
            json!({"buyer_id": "other", "sold": true, "price": 5.0}),
            "not_the_unknown_post",
        ),
        (
            json!({"buyer_id": "acme", "sold": true, "price": -1.0}),
            "bad_price",
        ),
        (
            json!({"buyer_id": "acme", "sold": false, "price": 3.0}),
            "bad_price",
        ),
    ];
    let before = footprint(&app, id).await;
    for (body, rule) in refusals {
        let refused = resolve(&app, id, body.clone()).await;
        assert_eq!(refused.status, 422, "{body}: {}", refused.text());
        assert_eq!(refused.json()["error"], rule, "{body}");
        assert!(
            !refused.json()["message"].as_str().unwrap().is_empty(),
            "{body}"
        );
        assert_eq!(footprint(&app, id).await, before, "{body} changed nothing");
    }

    // Sold to the buyer of the unanswered post, no price named: its bid.
    let sold = resolve(&app, id, json!({"buyer_id": "acme", "sold": true})).await;
    assert_eq!(sold.status, 200, "{}", sold.text());
    assert_eq!(sold.json()["lead_state"], "sold");
    assert_eq!(sold.json()["sold_to"], "acme");
    assert_eq!(sold.json()["price"], 12.5, "the bid of acme's ping");
    assert_eq!(
        resolves_of(&app, id).await,
        [("acme".to_string(), "accepted".to_string())]
    );
    let settled = footprint(&app, id).await;
    assert_ne!(settled, before);

    let again = resolve(&app, id, json!({"buyer_id": "acme", "sold": false})).await;
    assert_eq!(again.status, 422, "{}", again.text());
    assert_eq!(again.json()["error"], "not_unknown");
    assert_eq!(footprint(&app, id).await, settled, "changed nothing");
    assert_eq!(
        buyers.acme.calls("post").len(),
        1,
        "resolving sends nothing"
    );
}

async fn a_lead_resolved_not_sold_to_a_buyer_it_was_posted_to_is_unsold_with_the_resolve_in_its_history(
    backend: Backend,
) {
    let (app, _buyers, ids) = unknown_leads(backend, 1).await;
    let id = &ids[0];
    let caps = || async {
        let buyers = app.admin_get("/v1/buyers").await.json();
        let acme = buyers
            .as_array()
            .unwrap()
            .iter()
            .find(|buyer| buyer["id"] == "acme");
        acme.unwrap()["caps"][0]["used"].clone()
    };
    assert_eq!(caps().await, 1, "acme's unanswered post keeps its slot");

    let unsold = resolve(&app, id, json!({"buyer_id": "other", "sold": false})).await;
    assert_eq!(unsold.status, 200, "{}", unsold.text());
    assert_eq!(unsold.json()["lead_state"], "unsold");
    assert_eq!(
        resolves_of(&app, id).await,
        [("other".to_string(), "rejected".to_string())]
    );
    assert_eq!(caps().await, 0, "not sold: acme's post gives its slot back");
    assert!(sales_of(&app, id).await.is_empty());
}

/// Two operators resolve each lead at the same moment, one sold and one
/// not: one wins, the other is refused as `not_unknown`, and the database
/// holds one settlement.
async fn two_resolves_at_once_settle_the_lead_once(backend: Backend) {
    let (app, _buyers, ids) = unknown_leads(backend, 3).await;
    let bodies = [
        json!({"buyer_id": "acme", "sold": true, "price": 7.0}),
        json!({"buyer_id": "acme", "sold": false}),
    ];
    let answers = join_all(
        ids.iter()
            .flat_map(|id| bodies.iter().map(move |body| (id, body.clone())))
            .map(|(id, body)| {
                let app = &app;
                async move {
                    (
                        id.clone(),
                        body["sold"].clone(),
                        resolve(app, id, body).await,
                    )
                }
            }),
    )
    .await;
    for id in &ids {
        let mine: Vec<_> = answers.iter().filter(|(of, ..)| of == id).collect();
        let won: Vec<_> = mine
            .iter()
            .filter(|(.., answer)| answer.status == 200)
            .collect();
        assert_eq!(won.len(), 1, "one resolve wins");
        let lost = mine
            .iter()
            .find(|(.., answer)| answer.status != 200)
            .unwrap();
        assert_eq!(lost.2.status, 422, "{}", lost.2.text());
        assert_eq!(lost.2.json()["error"], "not_unknown");
        let sold = won[0].1 == true;
        let state = if sold { "sold" } else { "unsold" };
        assert_eq!(app.lead(id).await["lead_state"], state);
        assert_eq!(resolves_of(&app, id).await.len(), 1, "one resolve recorded");
        assert_eq!(sales_of(&app, id).await.len(), usize::from(sold));
    }
}

/// A buyer without a ping (no bid) and without a fixed price: a sale
/// resolved without a price has none to take, and is refused.
async fn a_sale_with_no_price_named_bid_or_fixed_is_refused_until_a_price_is_named(
    backend: Backend,
) {
    let buyer = TestBuyer::start(accept(), Answer::Hang);
    let direct = BuyerConfig {
        ping_timeout: None,
        post_timeout: "300ms",
        ..BuyerConfig::new("acme", 1)
    };
    let app = spawn_app_with(backend, &direct.toml(&buyer.base)).await;
    let id = app.submit(json!({"email": "direct@example.com"})).await;
    app.wait_for_state(&id, "unknown").await;
    let before = footprint(&app, &id).await;
    let refused = resolve(&app, &id, json!({"buyer_id": "acme", "sold": true})).await;
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert_eq!(refused.json()["error"], "price_needed");
    assert_eq!(footprint(&app, &id).await, before, "changed nothing");

    let priced = json!({"buyer_id": "acme", "sold": true, "price": 4.0});
    let sold = resolve(&app, &id, priced).await;
    assert_eq!(sold.status, 200, "{}", sold.text());
    assert_eq!(sold.json()["price"], 4.0);
}
