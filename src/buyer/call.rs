//! Sending one request with awc and classifying what happened, keeping
//! "the request never left" (safe: `error`) apart from "sent, no answer"
//! (`timeout`, which for a post means the lead's fate is unknown).

use std::time::{Duration, Instant};

use awc::error::{ConnectError, SendRequestError};

use super::accept::{AcceptCheck, Verdict};
use super::request::BuyerRequest;
use crate::domain::{CallKind, CallOutcome};

/// Response bodies kept in the attempt row are cut to this many bytes.
pub const KEPT_RESPONSE_BYTES: usize = 4096;
/// Larger answers are not read (a buyer answer is small).
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Exchange {
    pub outcome: CallOutcome,
    pub http_status: Option<u16>,
    pub body: Option<String>,
    pub duration: Duration,
    /// Why an error or timeout happened, in plain words.
    pub detail: Option<String>,
}

/// Sends `request` within `timeout` (connect + send + answer) and judges it.
pub async fn exchange(
    client: &awc::Client,
    kind: CallKind,
    request: &BuyerRequest,
    timeout: Duration,
    check: &AcceptCheck,
) -> Exchange {
    let started = Instant::now();
    let mut outgoing = client.post(&request.url).timeout(timeout);
    for (name, value) in &request.headers {
        outgoing = outgoing.insert_header((name.as_str(), value.as_str()));
    }
    let ended = |outcome, http_status, body, detail: Option<String>| Exchange {
        outcome,
        http_status,
        body,
        duration: started.elapsed(),
        detail,
    };
    let mut response = match outgoing.send_body(request.body.clone()).await {
        Ok(response) => response,
        Err(error) => {
            let outcome = if never_left(&error) {
                CallOutcome::Error
            } else {
                CallOutcome::Timeout
            };
            return ended(outcome, None, None, Some(error.to_string()));
        }
    };
    let status = response.status().as_u16();
    let declared_length = response
        .headers()
        .get(awc::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    let remaining = timeout.saturating_sub(started.elapsed());
    let body =
        match actix_web::rt::time::timeout(remaining, response.body().limit(MAX_RESPONSE_BYTES))
            .await
        {
            Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(Err(error)) => return broken_answer(kind, status, error.to_string(), &ended),
            Err(_) => {
                return broken_answer(
                    kind,
                    status,
                    "the answer's body did not arrive in time".into(),
                    &ended,
                )
            }
        };
    if declared_length.is_some_and(|length| length > body.len()) {
        return broken_answer(
            kind,
            status,
            "the connection closed before the whole answer arrived".into(),
            &ended,
        );
    }
    let kept = Some(truncate(&body));
    match check.judge(status, &body) {
        Verdict::Accepted => ended(CallOutcome::Accepted, Some(status), kept, None),
        Verdict::Rejected => ended(CallOutcome::Rejected, Some(status), kept, None),
        // A post answered 2xx that cannot be read may have been taken.
        Verdict::Error(detail) if kind == CallKind::Post && (200..300).contains(&status) => {
            ended(CallOutcome::Timeout, Some(status), kept, Some(detail))
        }
        Verdict::Error(detail) => ended(CallOutcome::Error, Some(status), kept, Some(detail)),
    }
}

/// The status line arrived but the body broke off (or could not be read):
/// a ping is simply an error, a post may have been taken (unknown).
fn broken_answer(
    kind: CallKind,
    status: u16,
    detail: String,
    ended: &impl Fn(CallOutcome, Option<u16>, Option<String>, Option<String>) -> Exchange,
) -> Exchange {
    let outcome = match kind {
        CallKind::Ping => CallOutcome::Error,
        CallKind::Post => CallOutcome::Timeout,
    };
    ended(outcome, Some(status), None, Some(detail))
}

/// True when the request cannot have reached the buyer: the connection was
/// never made. (The connector's pool is sized to the buyer's concurrency, so
/// a timeout is never a wait for a pool slot; see CRATE-NOTES.)
fn never_left(error: &SendRequestError) -> bool {
    match error {
        SendRequestError::Url(_) | SendRequestError::Http(_) => true,
        SendRequestError::Connect(ConnectError::Disconnected) => false,
        SendRequestError::Connect(_) => true,
        _ => false,
    }
}

fn truncate(body: &str) -> String {
    if body.len() <= KEPT_RESPONSE_BYTES {
        return body.to_string();
    }
    let mut end = KEPT_RESPONSE_BYTES;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body[..end].to_string()
}
