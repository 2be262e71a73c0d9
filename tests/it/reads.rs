//! Reading leads back: the public status, admin-only views, filters and
//! cursors, and the health endpoints.

use serde_json::{json, Value};

use crate::helpers::{spawn_app, Backend};
use crate::on_both_databases;

on_both_databases!(
    admin_endpoints_refuse_without_the_token,
    the_public_status_is_the_contract_without_personal_data,
    leads_are_listed_with_filters_and_a_cursor,
    health_and_readiness_answer,
);

async fn admin_endpoints_refuse_without_the_token(backend: Backend) {
    let app = spawn_app(backend).await;
    let id = app
        .post_form_lead(&json!({"email": "a@example.com"}))
        .await
        .json()["submission_id"]
        .as_str()
        .unwrap()
        .to_string();
    for path in [
        format!("/v1/leads/{id}"),
        "/v1/leads".into(),
        "/v1/review".into(),
    ] {
        for token in [None, Some("Bearer wrong-token"), Some("test-admin-token")] {
            let mut request = app.client.get(app.url(&path));
            if let Some(token) = token {
                request = request.insert_header(("Authorization", token));
            }
            let answer = app.send(request, Vec::new()).await;
            assert_eq!(answer.status, 401, "{path} with {token:?}");
            assert_eq!(answer.json()["error"], "unauthorized");
        }
        assert_eq!(
            app.admin_get(&path).await.status,
            200,
            "{path} with the token"
        );
    }
}

async fn the_public_status_is_the_contract_without_personal_data(backend: Backend) {
    let app = spawn_app(backend).await;
    let contract = app
        .post_form_lead(
            &json!({"email": "private@example.com", "phone": "5550100000", "first_name": "Priv"}),
        )
        .await
        .json();
    let id = contract["submission_id"].as_str().unwrap();
    let status = app
        .send(
            app.client.get(app.url(&format!("/v1/leads/{id}/status"))),
            Vec::new(),
        )
        .await;
    assert_eq!(status.status, 200);
    let mut public = status.json();
    assert!(public["lead_state"].is_string());
    // The lead may have moved on (routing starts at once); the rest is the same.
    public["lead_state"] = contract["lead_state"].clone();
    assert_eq!(public, contract);
    let text = status.text();
    for personal in ["private", "5550100000", "Priv"] {
        assert!(!text.contains(personal), "{personal} leaked: {text}");
    }
    let missing = app
        .send(
            app.client.get(app.url("/v1/leads/no-such-lead/status")),
            Vec::new(),
        )
        .await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"], "not_found");
}

async fn leads_are_listed_with_filters_and_a_cursor(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let answer = app
            .post_form_lead(&json!({"email": format!("l{n}@example.com")}))
            .await;
        ids.push(answer.json()["submission_id"].clone());
    }
    let invalid =
        app.post_feed_lead(&json!({"email": "broken"})).await.json()["submission_id"].clone();

    let mut seen = Vec::new();
    let mut path = "/v1/leads?source=website&limit=2".to_string();
    loop {
        let page = app.admin_get(&path).await.json();
        let leads = page["leads"].as_array().unwrap();
        assert!(leads.len() <= 2);
        seen.extend(leads.iter().map(|lead| lead["id"].clone()));
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/leads?source=website&limit=2&cursor={cursor}"),
            None => break,
        }
    }
    let newest_first: Vec<Value> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);

    let by_source = app.admin_get("/v1/leads?source=partner").await.json();
    let listed: Vec<&Value> = by_source["leads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lead| &lead["id"])
        .collect();
    assert_eq!(listed, [&invalid]);
    let invalid_only = app.admin_get("/v1/leads?state=invalid").await.json();
    assert_eq!(invalid_only["leads"].as_array().unwrap().len(), 1);
    let bad_state = app.admin_get("/v1/leads?state=lost").await;
    assert_eq!(bad_state.status, 400);
    assert_eq!(bad_state.json()["error"], "bad_request");
}

async fn health_and_readiness_answer(backend: Backend) {
    let app = spawn_app(backend).await;
    for path in ["/healthz", "/readyz"] {
        let answer = app.send(app.client.get(app.url(path)), Vec::new()).await;
        assert_eq!(answer.status, 200, "{path}");
    }
    let unknown = app
        .send(app.client.get(app.url("/v1/nothing-here")), Vec::new())
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"], "not_found");
}
