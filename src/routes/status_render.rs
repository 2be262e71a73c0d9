//! The status page as the server sends it: every buyer's row, every notify
//! channel's and the lead counts already in the HTML (readable with curl or
//! with JavaScript off), in the same markup `status.js` then keeps live.
//! Values come from the JSON the page's script reads, so both agree.

use serde_json::Value;

use super::form_page::escape;

const CIRCUIT_WORDS: [(&str, &str); 3] = [
    ("closed", "closed"),
    ("half_open", "half open"),
    ("open", "open"),
];

/// Fills the page's `<!--buyers-->`, `<!--notify-->` and `<!--leads-->`
/// from `/v1/status`'s answer.
pub fn fill(page: &str, status: &Value) -> String {
    let rows = |key: &str, row: fn(&Value) -> String| -> String {
        status[key]
            .as_array()
            .map(|items| items.iter().map(row).collect())
            .unwrap_or_default()
    };
    let leads: String = status["leads"]
        .as_object()
        .map(|counts| {
            counts
                .iter()
                .map(|(state, count)| {
                    format!(
                        "<li data-state=\"{state}\">{state}: <strong>{count}</strong></li>",
                        state = escape(state)
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    page.replacen("<!--buyers-->", &rows("buyers", buyer_row), 1)
        .replacen("<!--notify-->", &rows("notify", channel_row), 1)
        .replacen("<!--leads-->", &leads, 1)
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => escape(text),
        Value::Null => "–".into(),
        other => escape(&other.to_string()),
    }
}

fn cell(label: &str, content: &str) -> String {
    format!("<td data-label=\"{label}\">{content}</td>")
}

fn latency(value: &Value) -> String {
    if value.is_null() {
        "–".into()
    } else {
        format!("{} / {} ms", text(&value["p50_ms"]), text(&value["p95_ms"]))
    }
}

fn buyer_row(buyer: &Value) -> String {
    let circuit = buyer["circuit"].as_str().unwrap_or_default();
    let words = CIRCUIT_WORDS
        .iter()
        .find(|(state, _)| *state == circuit)
        .map_or(circuit, |(_, words)| words);
    let caps = buyer["caps"]
        .as_array()
        .filter(|caps| !caps.is_empty())
        .map(|caps| {
            caps.iter()
                .map(|cap| {
                    format!(
                        "{} {} / {}",
                        text(&cap["period"]),
                        text(&cap["used"]),
                        text(&cap["limit"])
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| "–".into());
    let counts = &buyer["counts"];
    let cells = [
        cell(
            "Buyer",
            &format!(
                "<strong>{}</strong>{}",
                text(&buyer["name"]),
                if buyer["enabled"] == true {
                    ""
                } else {
                    " (disabled)"
                }
            ),
        ),
        cell(
            "Circuit",
            &format!(
                "<span class=\"circuit\" data-state=\"{}\">{}</span>",
                escape(circuit),
                escape(words)
            ),
        ),
        cell(
            "Since",
            &format!(
                "<time datetime=\"{at}\" title=\"{at}\">{at}</time>",
                at = text(&buyer["circuit_changed_at"])
            ),
        ),
        cell("Failures", &text(&buyer["consecutive_failures"])),
        cell(
            "In flight",
            &format!(
                "{} / {}",
                text(&buyer["in_flight"]),
                text(&buyer["max_concurrency"])
            ),
        ),
        cell("Sold today", &text(&buyer["sold_today"])),
        cell("Caps used", &caps),
        cell(
            "Open now",
            if buyer["open_now"] == true {
                "yes"
            } else {
                "closed hours"
            },
        ),
        cell("Accepted", &text(&counts["accepted"])),
        cell("Rejected", &text(&counts["rejected"])),
        cell("Errors", &text(&counts["error"])),
        cell("Timeouts", &text(&counts["timeout"])),
        cell("Ping p50 / p95", &latency(&buyer["ping_latency"])),
        cell("Post p50 / p95", &latency(&buyer["post_latency"])),
    ];
    format!(
        "<tr data-buyer=\"{}\">{}</tr>",
        text(&buyer["id"]),
        cells.concat()
    )
}

fn channel_row(channel: &Value) -> String {
    let failing = channel["consecutive_failures"].as_u64().unwrap_or(0) > 0;
    let role = match channel["role"].as_str() {
        Some(role) => format!(
            " ({}{})",
            escape(role),
            if channel["required"] == true {
                ", required"
            } else {
                ""
            }
        ),
        None => String::new(),
    };
    let cells = [
        cell(
            "Channel",
            &format!("<strong>{}</strong>{role}", text(&channel["id"])),
        ),
        cell("Kind", &text(&channel["kind"])),
        cell(
            "Health",
            &format!(
                "<span class=\"circuit\" data-state=\"{}\">{}</span>",
                if failing { "open" } else { "closed" },
                if failing { "failing" } else { "ok" }
            ),
        ),
        cell("Failures", &text(&channel["consecutive_failures"])),
        cell("In flight", &text(&channel["in_flight"])),
        cell("Waiting", &text(&channel["pending"])),
        cell("Given up", &text(&channel["abandoned"])),
        cell(
            "Last confirmed",
            &channel["last_confirmed_at"]
                .as_str()
                .map_or("never".to_string(), |at| {
                    format!(
                        "<time datetime=\"{at}\" title=\"{at}\">{at}</time>",
                        at = escape(at)
                    )
                }),
        ),
    ];
    format!(
        "<tr data-channel=\"{}\">{}</tr>",
        text(&channel["id"]),
        cells.concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_are_rendered_and_escaped() {
        let page = "<tbody><!--buyers--></tbody><tbody><!--notify--></tbody><ul><!--leads--></ul>";
        let status = json!({
            "buyers": [{"id": "acme", "name": "<Acme>", "enabled": true, "circuit": "half_open",
                        "circuit_changed_at": "2026-12-01T00:00:00Z", "consecutive_failures": 2,
                        "in_flight": 1, "max_concurrency": 4, "sold_today": 3, "caps": [],
                        "open_now": true, "counts": {"accepted": 1, "rejected": 0, "error": 2, "timeout": 0},
                        "ping_latency": null, "post_latency": {"p50_ms": 5, "p95_ms": 9}}],
            "notify": [{"id": "manager", "kind": "webhook", "role": "manager", "required": true,
                        "consecutive_failures": 0, "in_flight": 0, "pending": 0, "abandoned": 0,
                        "last_confirmed_at": null}],
            "leads": {"sold": 3},
        });
        let html = fill(page, &status);
        assert!(html.contains("<tr data-buyer=\"acme\">"), "{html}");
        assert!(html.contains("&lt;Acme&gt;"), "{html}");
        assert!(
            html.contains("data-state=\"half_open\">half open</span>"),
            "{html}"
        );
        assert!(html.contains("5 / 9 ms"), "{html}");
        assert!(html.contains("<tr data-channel=\"manager\">"), "{html}");
        assert!(html.contains("sold: <strong>3</strong>"), "{html}");
    }
}
