//! `leadrouter mock-buyer`: a buyer API simulator for trying leadrouter out
//! and for benchmarks. It answers like real ping/post buyers do (see
//! BUYER-CONVENTIONS): HTTP 200 with `accepted: true|false` and, on a ping,
//! `bid` and `ping_id`, on a post `price` (what the example configuration
//! reads), beside the fields such APIs also send (`response`,
//! `leadAuctionId`, `details`); 503 on a simulated failure, or nothing at
//! all when told to hang. `GET /stats` tells how many calls it answered
//! and how long it held them in all: a benchmark's buyer-bound limit
//! comes from the time the buyer really took (its timer rounds its
//! latency up), not from the nominal one.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::{Server, Service};
use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::json;

/// How the simulated buyer behaves.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Share of pings and posts answered "success" (0..=1).
    pub accept_rate: f64,
    pub latency: Duration,
    /// Share of calls answered 503 (0..=1).
    pub fail_rate: f64,
    /// Never answer.
    pub hang: bool,
}

/// Starts the simulator on `listener`; the returned server runs until stopped.
pub fn start(listener: TcpListener, behaviour: Behaviour) -> std::io::Result<Server> {
    let behaviour = web::Data::new(behaviour);
    let auction_ids = web::Data::new(Arc::new(AtomicU64::new(100_000)));
    let answered = web::Data::new(Answered::default());
    let server = HttpServer::new(move || {
        let timed = answered.clone();
        App::new()
            .app_data(behaviour.clone())
            .app_data(auction_ids.clone())
            .app_data(answered.clone())
            .route("/stats", web::get().to(stats))
            .service(
                web::scope("")
                    .wrap_fn(move |request, service| {
                        let arrived = Instant::now();
                        let answer = service.call(request);
                        let answered = timed.clone();
                        async move {
                            let answer = answer.await;
                            answered.record(arrived.elapsed());
                            answer
                        }
                    })
                    .route("/ping", web::post().to(ping))
                    .route("/post", web::post().to(post)),
            )
    })
    .workers(1)
    .listen(listener)?
    .run();
    Ok(server)
}

/// Runs the simulator on `listen` until ctrl-c.
pub async fn run(listen: &str, behaviour: Behaviour) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)?;
    println!(
        "mock buyer on http://{}: POST /ping and /post ({behaviour:?})",
        listener.local_addr()?
    );
    start(listener, behaviour)?.await?;
    Ok(())
}

/// The calls answered (pings and posts) and the time they were held, from
/// the request's head read to the answer handed back.
#[derive(Default)]
struct Answered {
    calls: AtomicU64,
    held_micros: AtomicU64,
}

impl Answered {
    fn record(&self, held: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.held_micros
            .fetch_add(held.as_micros() as u64, Ordering::Relaxed);
    }
}

/// `{"calls": …, "held_ms": …}`: calls answered so far and the total time
/// they were held (ms), so that a reader can take the mean over any span.
async fn stats(answered: web::Data<Answered>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "calls": answered.calls.load(Ordering::Relaxed),
        "held_ms": answered.held_micros.load(Ordering::Relaxed) as f64 / 1000.0,
    }))
}

/// Answers after the latency; `None` when the call is to fail or hang.
async fn settle(behaviour: &Behaviour) -> Option<HttpResponse> {
    if behaviour.hang {
        std::future::pending::<()>().await;
    }
    actix_web::rt::time::sleep(behaviour.latency).await;
    if fastrand::f64() < behaviour.fail_rate {
        return Some(
            HttpResponse::ServiceUnavailable()
                .json(json!({"response": "error", "details": "Service Unavailable"})),
        );
    }
    None
}

async fn ping(
    behaviour: web::Data<Behaviour>,
    auction_ids: web::Data<Arc<AtomicU64>>,
) -> HttpResponse {
    if let Some(failure) = settle(&behaviour).await {
        return failure;
    }
    if fastrand::f64() < behaviour.accept_rate {
        let bid = 5.0 + (fastrand::f64() * 40.0).round();
        let auction_id = auction_ids.fetch_add(1, Ordering::Relaxed);
        HttpResponse::Ok().json(json!({
            "accepted": true,
            "bid": bid,
            "ping_id": format!("P-{auction_id}"),
            "response": "success",
            "leadAuctionId": auction_id,
            "details": "Thank You"
        }))
    } else {
        HttpResponse::Ok().json(json!({
            "accepted": false,
            "response": "failure",
            "details": "Quota Reached"
        }))
    }
}

async fn post(behaviour: web::Data<Behaviour>, body: web::Bytes) -> HttpResponse {
    if let Some(failure) = settle(&behaviour).await {
        return failure;
    }
    let bid = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|lead| lead["bid"].as_f64())
        .unwrap_or(10.0);
    if fastrand::f64() < behaviour.accept_rate {
        HttpResponse::Ok().json(json!({
            "accepted": true,
            "price": bid,
            "response": "success",
            "buyer_lead_id": format!("B-{}", fastrand::u64(..)),
            "details": "Lead Accepted"
        }))
    } else {
        HttpResponse::Ok().json(json!({
            "accepted": false,
            "response": "failure",
            "reason": "Duplicate"
        }))
    }
}
