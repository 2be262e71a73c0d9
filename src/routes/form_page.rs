//! Answers for plain HTML form posts (no JavaScript): a 303 to the source's
//! `thank_you_url` when accepted, otherwise a small page that says what
//! happened and keeps what the visitor typed.

use actix_web::http::header;
use actix_web::HttpResponse;
use serde_json::{Map, Value};

use crate::config::SourceSettings;
use crate::domain::{Acceptance, Contract};

pub fn answer(
    source: &SourceSettings,
    contract: &Contract,
    entered: &Map<String, Value>,
) -> HttpResponse {
    let stored_and_valid = contract.server_recorded && contract.errors.is_empty();
    if stored_and_valid
        && contract.acceptance == Acceptance::Accepted
        && !source.thank_you_url.is_empty()
    {
        return HttpResponse::SeeOther()
            .insert_header((header::LOCATION, source.thank_you_url.clone()))
            .finish();
    }
    let (status, heading, detail) = if stored_and_valid {
        (
            200,
            "Thank you",
            "We have received your details.".to_string(),
        )
    } else if contract.server_recorded {
        let problems: Vec<String> = contract
            .errors
            .iter()
            .map(|error| {
                format!(
                    "<li>{}: {}</li>",
                    escape(&error.field),
                    escape(&error.message)
                )
            })
            .collect();
        (
            422,
            "Please check your details",
            format!(
                "<p>We kept what you sent, but something needs fixing:</p><ul>{}</ul>",
                problems.join("")
            ),
        )
    } else {
        (
            503,
            "Sorry, please try again",
            "We could not save your details just now.".to_string(),
        )
    };
    let inputs: String = entered
        .iter()
        .filter(|(name, _)| name.as_str() != "source")
        .map(|(name, value)| {
            let value = value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            format!(
                "<label>{name}<input name=\"{name}\" value=\"{value}\"></label>",
                name = escape(name),
                value = escape(&value)
            )
        })
        .collect();
    let form = if stored_and_valid {
        String::new()
    } else {
        format!(
            "<form method=\"post\" action=\"/v1/leads?source={}\">{inputs}<button>Send again</button></form>",
            escape(&source.id)
        )
    };
    let page = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{heading}</title><style>body{{font-family:sans-serif;max-width:30em;margin:2em auto;padding:0 1em}}\
         label{{display:block;margin:.5em 0}}input{{display:block;width:100%}}</style></head>\
         <body><h1>{heading}</h1>{detail}{form}<p><small>Reference: {id}</small></p></body></html>",
        id = escape(&contract.submission_id)
    );
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap_or_default())
        .content_type("text/html; charset=utf-8")
        .body(page)
}

/// HTML-escapes text for element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}
