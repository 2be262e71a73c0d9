//! `form.js` in real headless Chromium (SPEC section 5): the demo form,
//! served from another origin than leadrouter, as a website embeds it: with the
//! manager channel up the form clears and `generate_lead` is pushed once;
//! with it down the data stays, the page says the lead is safe and
//! pending, a retry sends the same `submission_id` (no second lead), and
//! the form completes when the channel confirms; an invalid field shows
//! its error beside it; a page from an origin that is not allowed cannot
//! read the answer. Screenshots go to `target/artifacts/`.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::Value;

use crate::browser::Browser;
use crate::helpers::{spawn_app_adjusted, wait_until, Backend, TestApp};
use crate::inbox::{Reply, TestInbox};

const WAIT: Duration = Duration::from_secs(30);

/// A website on `listener` (a loopback port of its own: its own origin)
/// whose page embeds leadrouter's form helper; returns its origin.
fn start_site(listener: TcpListener, leadrouter: &str) -> String {
    // The demo form, as a website embeds it: everything on leadrouter by
    // its absolute URL.
    let page = leadrouter::demo::DEMO_FORM
        .replace(
            "action=\"/v1/leads",
            &format!("action=\"{leadrouter}/v1/leads"),
        )
        .replace("src=\"/form.js\"", &format!("src=\"{leadrouter}/form.js\""));
    assert!(page.contains(&format!("{leadrouter}/form.js")));
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let server = HttpServer::new(move || {
        let page = page.clone();
        App::new().route(
            "/",
            web::get().to(move || {
                let page = page.clone();
                async move { HttpResponse::Ok().content_type("text/html").body(page) }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    actix_web::rt::spawn(server);
    origin
}

/// Fills the form and clicks its button (twice, as an impatient visitor).
/// The demo form's fields start with sample values; a cleared form shows
/// those again.
async fn fill_and_send(browser: &Browser, first_name: &str, email: &str, phone: &str) {
    browser
        .run(&format!(
            "const form = document.querySelector('form');
             form.first_name.value = '{first_name}';
             form.email.value = '{email}';
             form.phone.value = '{phone}';
             const button = form.querySelector('button');
             button.click(); button.click();
             return true"
        ))
        .await;
}

async fn form_state(browser: &Browser) -> Value {
    browser
        .run("const status = document.querySelector('[data-leadrouter-status]'); return status ? status.dataset.state : null")
        .await
}

async fn wait_for_form_state(browser: &Browser, state: &str) {
    wait_until(&format!("the form to be {state}"), WAIT, || async {
        form_state(browser).await == state
    })
    .await;
}

async fn shown(browser: &Browser, script: &str) -> Value {
    browser.run(&format!("return {script}")).await
}

async fn leads_of(app: &TestApp, email: &str) -> Vec<Value> {
    let page = app.admin_get("/v1/leads?limit=100").await.json();
    page["leads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lead| lead["fields"]["email"] == email)
        .cloned()
        .collect()
}

#[actix_web::test]
async fn form_js_clears_only_accepted_leads_keeps_the_rest_and_pushes_once() {
    let inbox = TestInbox::start(Reply::ok());
    let config = format!(
        "\n[intake]\naccept_wait = \"2s\"\n\n[[notify]]\nid = \"manager\"\nrole = \"manager\"\nurl = \"{}/hook\"\ntimeout = \"2s\"\nrequired = true\nretry_backoff = \"300ms\"\n",
        inbox.base
    );
    // The site's page names leadrouter's URL and leadrouter's settings the
    // site's origin: bind the site's port first.
    let site_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let allowed = format!("http://{}", site_listener.local_addr().unwrap());
    let allowed_origin = allowed.clone();
    let app = spawn_app_adjusted(Backend::Sqlite, &config, move |settings| {
        settings.sources[0].allowed_origins = vec![allowed_origin];
    })
    .await;
    let site = start_site(site_listener, &app.address);
    assert_eq!(site, allowed);
    let browser = Browser::start().await;

    // Accepted: the manager confirms within accept_wait.
    browser.open(&format!("{site}/")).await;
    wait_until("form.js to load", WAIT, || async {
        shown(&browser, "Boolean(window.leadrouterForm)").await == true
    })
    .await;
    fill_and_send(&browser, "Zoe", "zoe@example.com", "555-010-7777").await;
    wait_for_form_state(&browser, "accepted").await;
    let ann = leads_of(&app, "zoe@example.com").await;
    assert_eq!(ann.len(), 1, "two clicks, one lead");
    let ann_id = ann[0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        shown(&browser, "document.querySelector('form').email.value").await,
        "ann@example.com",
        "cleared: back to the page's own value, not what was typed"
    );
    let pushed = shown(&browser, "window.dataLayer").await;
    assert_eq!(
        pushed,
        serde_json::json!([{"event": "generate_lead", "submission_id": ann_id}]),
        "generate_lead exactly once"
    );
    assert_eq!(inbox.confirmed_for(&ann_id).len(), 1);
    browser.screenshot("form-accepted.png").await;

    // Pending: the manager is down; the data stays and the page says so.
    inbox.set_reply(Reply::status(500));
    fill_and_send(&browser, "Bob", "bob@example.com", "555-010-7778").await;
    wait_for_form_state(&browser, "pending").await;
    assert_eq!(
        shown(&browser, "document.querySelector('form').email.value").await,
        "bob@example.com"
    );
    let message = shown(
        &browser,
        "document.querySelector('[data-leadrouter-status]').textContent",
    )
    .await;
    assert!(message.as_str().unwrap().contains("safe"), "{message}");
    assert_eq!(
        shown(&browser, "window.dataLayer.length").await,
        1,
        "no push while pending"
    );
    browser.screenshot("form-pending.png").await;
    let sent_id = shown(
        &browser,
        "document.querySelector('form').submission_id.value",
    )
    .await;

    // A retry sends the same submission_id: still one lead.
    browser
        .run("document.querySelector('form button').click(); return true")
        .await;
    wait_for_form_state(&browser, "pending").await;
    assert_eq!(
        shown(
            &browser,
            "document.querySelector('form').submission_id.value"
        )
        .await,
        sent_id
    );
    let bob = leads_of(&app, "bob@example.com").await;
    assert_eq!(bob.len(), 1, "a retry creates no second lead: {bob:?}");
    let bob_id = bob[0]["id"].as_str().unwrap().to_string();

    // The manager is back: the next try confirms, the page's polling sees
    // it and completes as accepted, pushing once for this lead.
    inbox.set_reply(Reply::ok());
    wait_for_form_state(&browser, "accepted").await;
    let pushed = shown(&browser, "window.dataLayer").await;
    assert_eq!(
        pushed,
        serde_json::json!([
            {"event": "generate_lead", "submission_id": ann_id},
            {"event": "generate_lead", "submission_id": bob_id},
        ])
    );

    // Invalid (the server's judgement; the browser's own checks pass): the
    // error stands next to its field, the data stays.
    fill_and_send(&browser, "Cy", "cy@example.com", "call me").await;
    wait_for_form_state(&browser, "invalid").await;
    let error = shown(
        &browser,
        "(() => { const e = document.querySelector('[data-leadrouter-error-for=phone]'); return e && e.previousElementSibling === document.querySelector('form').phone ? e.textContent : null })()",
    )
    .await;
    assert!(
        error.is_string(),
        "the error is right after the phone input"
    );
    assert_eq!(
        shown(
            &browser,
            "document.querySelector('form').phone.getAttribute('aria-invalid')"
        )
        .await,
        "true"
    );
    assert_eq!(
        shown(&browser, "document.querySelector('form').phone.value").await,
        "call me"
    );
    browser.screenshot("form-invalid.png").await;

    // Another origin, not allowed: its script cannot read the answer.
    let stranger = start_site(TcpListener::bind("127.0.0.1:0").unwrap(), &app.address);
    assert_ne!(stranger, site);
    browser.open(&format!("{stranger}/")).await;
    wait_until("form.js to load on the other site", WAIT, || async {
        shown(&browser, "Boolean(window.leadrouterForm)").await == true
    })
    .await;
    fill_and_send(&browser, "Dee", "dee@example.com", "555-010-7779").await;
    wait_for_form_state(&browser, "failed").await;
    assert_eq!(
        shown(
            &browser,
            "Boolean(document.querySelector('[data-leadrouter-retry]'))"
        )
        .await,
        true
    );
    assert_eq!(
        shown(&browser, "document.querySelector('form').email.value").await,
        "dee@example.com"
    );
    assert_eq!(shown(&browser, "window.dataLayer.length").await, 0);
    browser.screenshot("form-other-origin.png").await;
    browser.session_call("DELETE", "", Value::Null).await;
}
