//! Buyer APIs for tests: real HTTP servers on loopback ports whose answers
//! a test sets (and changes mid-test), recording every call they get.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::json;

/// How a test buyer answers a ping or a post.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `{"response": "success", ...}` after `delay`.
    Accept { delay: Duration },
    /// HTTP 200 `{"response": "failure"}`.
    Reject,
    /// This HTTP status, with a JSON body.
    Status(u16),
    /// HTTP 200 with a body that is not JSON.
    NotJson,
    /// Never answers.
    Hang,
    /// A custom body, HTTP 200.
    Body(&'static str),
    /// `{"response": "success", "bid": B, "price": B, ...}` after `delay`:
    /// a ping that bids `B`, a post that sells for it.
    Bid { bid: f64, delay: Duration },
    /// Accepts about `accept_rate` of the calls, rejects the rest, each
    /// after a random delay up to `max_delay`.
    Coin {
        accept_rate: f64,
        max_delay: Duration,
    },
}

pub fn accept() -> Answer {
    Answer::Accept {
        delay: Duration::ZERO,
    }
}

/// One request a test buyer received.
#[derive(Debug, Clone)]
pub struct Call {
    pub kind: String,
    pub idempotency_key: String,
    pub authorization: String,
    pub api_key: String,
    pub query: String,
    pub content_type: String,
    pub body: String,
}

#[derive(Clone)]
struct Script {
    ping: Arc<Mutex<Answer>>,
    post: Arc<Mutex<Answer>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

pub struct TestBuyer {
    pub base: String,
    script: Script,
}

impl TestBuyer {
    /// Starts a buyer on a loopback port in the test's actix system.
    pub fn start(ping: Answer, post: Answer) -> Self {
        let script = Script {
            ping: Arc::new(Mutex::new(ping)),
            post: Arc::new(Mutex::new(post)),
            calls: Arc::default(),
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shared = web::Data::new(script.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
                .route("/{kind}", web::post().to(answer))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        actix_web::rt::spawn(server);
        Self { base, script }
    }

    pub fn set_post(&self, answer: Answer) {
        *self.script.post.lock().unwrap() = answer;
    }

    pub fn set_ping(&self, answer: Answer) {
        *self.script.ping.lock().unwrap() = answer;
    }

    /// How many calls of `kind` each lead got (by the body's `lead_id`).
    pub fn calls_per_lead(&self, kind: &str) -> std::collections::HashMap<String, usize> {
        let mut counts = std::collections::HashMap::new();
        for call in self.calls(kind) {
            let body: serde_json::Value = serde_json::from_str(&call.body).unwrap_or_default();
            let lead_id = body["lead_id"].as_str().unwrap_or_default().to_string();
            *counts.entry(lead_id).or_insert(0) += 1;
        }
        counts
    }

    pub fn calls(&self, kind: &str) -> Vec<Call> {
        self.script
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|call| call.kind == kind)
            .cloned()
            .collect()
    }
}

async fn answer(
    request: HttpRequest,
    kind: web::Path<String>,
    body: web::Bytes,
    script: web::Data<Script>,
) -> HttpResponse {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    script.calls.lock().unwrap().push(Call {
        kind: kind.to_string(),
        idempotency_key: header("idempotency-key"),
        authorization: header("authorization"),
        api_key: header("x-api-key"),
        query: request.query_string().to_string(),
        content_type: header("content-type"),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let mut answer = match kind.as_str() {
        "ping" => script.ping.lock().unwrap().clone(),
        _ => script.post.lock().unwrap().clone(),
    };
    if let Answer::Coin {
        accept_rate,
        max_delay,
    } = answer
    {
        let delay = max_delay.mul_f64(fastrand::f64());
        answer = if fastrand::f64() < accept_rate {
            Answer::Accept { delay }
        } else {
            actix_web::rt::time::sleep(delay).await;
            Answer::Reject
        };
    }
    match answer {
        Answer::Accept { delay } => {
            actix_web::rt::time::sleep(delay).await;
            HttpResponse::Ok().json(json!({
                "response": "success", "leadAuctionId": 4242, "bid": 12.5, "price": 15.0, "details": "Thank You"
            }))
        }
        Answer::Reject => {
            HttpResponse::Ok().json(json!({"response": "failure", "details": "Quota Reached"}))
        }
        Answer::Status(status) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
                .json(json!({"response": "error"}))
        }
        Answer::NotJson => HttpResponse::Ok()
            .content_type("text/html")
            .body("<html>thanks</html>"),
        Answer::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Answer::Body(text) => HttpResponse::Ok().body(text),
        Answer::Bid { bid, delay } => {
            actix_web::rt::time::sleep(delay).await;
            HttpResponse::Ok().json(json!({
                "response": "success", "leadAuctionId": format!("auction-{bid}"), "bid": bid, "price": bid
            }))
        }
        Answer::Coin { .. } => unreachable!("decided above"),
    }
}

/// A URL where nothing listens: connecting is refused. Its port is held,
/// while the tests run, by a socket bound but never listening: a port
/// merely freed can be given to the next server any test binds to port 0,
/// which would then answer the refused buyer's calls.
pub fn refusing_url() -> String {
    static HELD: LazyLock<(tokio::net::TcpSocket, String)> = LazyLock::new(|| {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let url = format!("http://{}", socket.local_addr().unwrap());
        (socket, url)
    });
    HELD.1.clone()
}

/// A buyer that reads the request, starts a 200 answer and closes the
/// connection halfway through the body. Counts the requests it got.
pub struct BrokenBuyer {
    pub base: String,
    pub requests: Arc<AtomicUsize>,
}

impl BrokenBuyer {
    pub fn start() -> Self {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut seen = Vec::new();
                let mut buffer = [0u8; 4096];
                while let Ok(read) = stream.read(&mut buffer) {
                    if read == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buffer[..read]);
                    if complete_request(&seen) {
                        break;
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"response\":\"succ",
                );
                let _ = stream.flush();
                drop(stream);
            }
        });
        Self { base, requests }
    }
}

fn complete_request(seen: &[u8]) -> bool {
    let text = String::from_utf8_lossy(seen);
    let Some(head_end) = text.find("\r\n\r\n") else {
        return false;
    };
    let length = text[..head_end]
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    seen.len() >= head_end + 4 + length
}

/// A `[[buyers]]` table for a test buyer at `base`.
pub struct BuyerConfig<'a> {
    pub id: &'a str,
    pub priority: i64,
    /// `None`: the buyer takes direct posts.
    pub ping_timeout: Option<&'a str>,
    pub post_timeout: &'a str,
    /// More keys for the `[[buyers]]` table, one per line.
    pub extra: &'a str,
}

impl BuyerConfig<'_> {
    pub fn new(id: &str, priority: i64) -> BuyerConfig<'_> {
        BuyerConfig {
            id,
            priority,
            ping_timeout: Some("2s"),
            post_timeout: "5s",
            extra: "",
        }
    }

    pub fn toml(&self, base: &str) -> String {
        self.toml_with_urls(&format!("{base}/ping"), &format!("{base}/post"))
    }

    pub fn toml_with_urls(&self, ping_url: &str, post_url: &str) -> String {
        let ping = match self.ping_timeout {
            Some(timeout) => format!(
                "[buyers.ping]\nurl = \"{ping_url}\"\ntimeout = \"{timeout}\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nbid_path = \"/bid\"\nping_id_path = \"/leadAuctionId\"\n"
            ),
            None => String::new(),
        };
        format!(
            "\n[[buyers]]\nid = \"{id}\"\npriority = {priority}\n{extra}\n{ping}[buyers.post]\nurl = \"{post_url}\"\ntimeout = \"{post_timeout}\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nprice_path = \"/price\"\n",
            id = self.id,
            priority = self.priority,
            extra = self.extra,
            post_timeout = self.post_timeout,
        )
    }
}

/// The example configuration's first buyer (`config/example.toml`),
/// pointed at `base`: its rules as shipped, to check they read what
/// `leadrouter mock-buyer` answers.
pub fn example_buyer(base: &str) -> leadrouter::config::BuyerSettings {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.toml"))
        .unwrap();
    let overrides = ["DATABASE_URL", "LEADROUTER_LISTEN", "LEADROUTER_LOG_FORMAT"];
    let settings = leadrouter::config::parse(&text, |name| {
        (!overrides.contains(&name)).then(|| format!("test-{name}"))
    })
    .expect("the example configuration is valid");
    let mut buyer = settings.buyers[0].clone();
    if let Some(ping) = buyer.ping.as_mut() {
        ping.url = format!("{base}/ping");
    }
    buyer.post.url = format!("{base}/post");
    buyer
}
