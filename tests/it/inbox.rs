//! Receivers for tests of notify channels and event sinks: a real HTTP
//! server on a loopback port that takes any path (webhooks, Slack, the
//! Telegram Bot API, event postbacks) and answers as the test says, and a
//! minimal real SMTP server; both record everything they get.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How the inbox answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: &'static str,
    pub delay: Duration,
}

impl Reply {
    pub fn ok() -> Self {
        Self::status(200)
    }

    pub fn status(status: u16) -> Self {
        Self {
            status,
            body: r#"{"ok": true}"#,
            delay: Duration::ZERO,
        }
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// One request the inbox received, and how it answered.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub idempotency_key: String,
    pub body: String,
    pub answered: u16,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

#[derive(Clone, Default)]
struct Shared {
    reply: Arc<Mutex<Option<Reply>>>,
    received: Arc<Mutex<Vec<Received>>>,
}

pub struct TestInbox {
    pub base: String,
    shared: Shared,
}

impl TestInbox {
    pub fn start(reply: Reply) -> Self {
        let shared = Shared {
            reply: Arc::new(Mutex::new(Some(reply))),
            received: Arc::default(),
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let data = web::Data::new(shared.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(receive))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        actix_web::rt::spawn(server);
        Self { base, shared }
    }

    pub fn set_reply(&self, reply: Reply) {
        *self.shared.reply.lock().unwrap() = Some(reply);
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Requests about `lead_id` (the body's `lead_id`) that it answered 2xx.
    pub fn confirmed_for(&self, lead_id: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|call| (200..300).contains(&call.answered))
            .filter(|call| call.json()["lead_id"] == lead_id)
            .collect()
    }
}

async fn receive(
    request: HttpRequest,
    body: web::Bytes,
    shared: web::Data<Shared>,
) -> HttpResponse {
    let reply = shared
        .reply
        .lock()
        .unwrap()
        .clone()
        .unwrap_or_else(Reply::ok);
    actix_web::rt::time::sleep(reply.delay).await;
    shared.received.lock().unwrap().push(Received {
        path: request.path().to_string(),
        idempotency_key: request
            .headers()
            .get("idempotency-key")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        body: String::from_utf8_lossy(&body).into_owned(),
        answered: reply.status,
    });
    HttpResponse::build(actix_web::http::StatusCode::from_u16(reply.status).unwrap())
        .content_type("application/json")
        .body(reply.body)
}

/// One message an SMTP client handed over.
#[derive(Debug, Clone)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

/// A minimal SMTP server (RFC 5321 without extensions): accepts every
/// message and keeps it.
pub struct TestSmtp {
    pub url: String,
    mails: Arc<Mutex<Vec<Mail>>>,
}

impl TestSmtp {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("smtp://{}", listener.local_addr().unwrap());
        let mails: Arc<Mutex<Vec<Mail>>> = Arc::default();
        let kept = mails.clone();
        actix_web::rt::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                actix_web::rt::spawn(smtp_session(socket, kept.clone()));
            }
        });
        Self { url, mails }
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}

async fn smtp_session(socket: tokio::net::TcpStream, mails: Arc<Mutex<Vec<Mail>>>) {
    let (reader, mut writer) = socket.into_split();
    let mut lines = BufReader::new(reader).lines();
    let _ = writer.write_all(b"220 test ESMTP\r\n").await;
    let mut mail = Mail {
        from: String::new(),
        to: Vec::new(),
        data: String::new(),
    };
    while let Ok(Some(line)) = lines.next_line().await {
        let upper = line.to_ascii_uppercase();
        let reply = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            "250 test"
        } else if upper.starts_with("MAIL FROM:") {
            mail.from = line[10..].trim().to_string();
            "250 OK"
        } else if upper.starts_with("RCPT TO:") {
            mail.to.push(line[8..].trim().to_string());
            "250 OK"
        } else if upper == "DATA" {
            let _ = writer.write_all(b"354 go ahead\r\n").await;
            while let Ok(Some(data)) = lines.next_line().await {
                if data == "." {
                    break;
                }
                mail.data.push_str(&data);
                mail.data.push('\n');
            }
            mails.lock().unwrap().push(std::mem::replace(
                &mut mail,
                Mail {
                    from: String::new(),
                    to: Vec::new(),
                    data: String::new(),
                },
            ));
            "250 queued"
        } else if upper == "QUIT" {
            let _ = writer.write_all(b"221 bye\r\n").await;
            return;
        } else {
            "250 OK"
        };
        let _ = writer.write_all(format!("{reply}\r\n").as_bytes()).await;
    }
}
