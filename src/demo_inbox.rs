//! The demo's manager inbox: a required notify channel on loopback with a
//! small page listing what it received. Its page can stop it (it then
//! answers 500, as a manager's system that is down would), so a newcomer
//! watches a lead stay `pending`, and start it again to watch it flip to
//! `accepted` when leadrouter retries.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use actix_web::{dev::Server, http::header, web, App, HttpResponse, HttpServer};
use serde_json::Value;

use crate::routes::escape_html as escape;

/// Most deliveries the page lists.
const KEPT: usize = 50;

#[derive(Default)]
struct Inbox {
    stopped: AtomicBool,
    received: Mutex<Vec<Value>>,
}

/// Starts the inbox on `listener`.
pub fn start(listener: TcpListener) -> std::io::Result<Server> {
    let inbox = web::Data::new(Inbox::default());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(inbox.clone())
            .route("/", web::get().to(page))
            .route("/hook", web::post().to(receive))
            .route("/toggle", web::post().to(toggle))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    Ok(server)
}

async fn receive(inbox: web::Data<Inbox>, body: web::Json<Value>) -> HttpResponse {
    if inbox.stopped.load(Ordering::Relaxed) {
        return HttpResponse::InternalServerError().json(serde_json::json!({"ok": false}));
    }
    let mut received = inbox.received.lock().unwrap_or_else(|p| p.into_inner());
    received.insert(0, body.into_inner());
    received.truncate(KEPT);
    HttpResponse::Ok().json(serde_json::json!({"ok": true}))
}

async fn toggle(inbox: web::Data<Inbox>) -> HttpResponse {
    inbox.stopped.fetch_xor(true, Ordering::Relaxed);
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/"))
        .finish()
}

async fn page(inbox: web::Data<Inbox>) -> HttpResponse {
    let stopped = inbox.stopped.load(Ordering::Relaxed);
    let rows: String = inbox
        .received
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|lead| {
            let field = |name: &str| escape(lead["fields"][name].as_str().unwrap_or(""));
            format!(
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(lead["received_at"].as_str().unwrap_or("")),
                escape(lead["lead_id"].as_str().unwrap_or("")),
                field("first_name"),
                field("email"),
                if lead["test"] == true { "test" } else { "" },
            )
        })
        .collect();
    let (state, button) = if stopped {
        (
            "stopped: answering 500, leads stay pending",
            "Start the inbox",
        )
    } else {
        ("running: confirming every lead", "Stop the inbox")
    };
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(format!(
            r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>Manager inbox (demo)</title>
<style>body{{font-family:system-ui,sans-serif;max-width:50em;margin:2em auto;padding:0 1em}}td,th{{padding:.3em .6em;text-align:left;border-bottom:1px solid #ddd}}</style></head>
<body><h1>Manager inbox</h1>
<p>A required notify channel: a lead is <em>accepted</em> once this inbox confirmed it.</p>
<form method="post" action="/toggle"><p>The inbox is <strong id="inbox-state">{state}</strong>. <button>{button}</button></p></form>
<table><thead><tr><th>received</th><th>lead id</th><th>first name</th><th>email</th><th></th></tr></thead><tbody>{rows}</tbody></table>
</body></html>"#
        ))
}
