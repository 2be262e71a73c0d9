// The lead timeline: /v1/leads/{id} with the admin token, drawn as the
// reason, the attempts in order (with each snapshot) and the payloads.
"use strict";

function attemptRow(attempt) {
  const cell = (label, ...content) => el("td", { "data-label": label }, ...content);
  const outcome = attempt.outcome + (attempt.reason ? " (" + attempt.reason + ")" : "");
  return el("tr", { "data-attempt": attempt.id },
    cell("Started", el("time", { datetime: attempt.started_at }, new Date(attempt.started_at).toLocaleString())),
    cell("Buyer", attempt.buyer_id),
    cell("Kind", attempt.kind),
    cell("Outcome", outcome),
    cell("HTTP", attempt.http_status === null ? "–" : String(attempt.http_status)),
    cell("Took", attempt.duration_ms === null ? "–" : attempt.duration_ms + " ms"),
    cell("Retry of", attempt.retry_of || "–"),
    cell("Snapshot", el("details", {}, el("summary", {}, "show"), el("pre", {}, JSON.stringify(attempt.snapshot, null, 2)))));
}

async function load() {
  const id = decodeURIComponent(location.pathname.split("/").pop());
  document.getElementById("lead-id").textContent = id;
  try {
    const lead = await getJson("/v1/leads/" + encodeURIComponent(id), true);
    document.getElementById("why").textContent = lead.lead_state + ": " + lead.why;
    const facts = [["Source", lead.source], ["Received", lead.received_at], ["Test lead", lead.test ? "yes" : "no"],
      ["Sold to", lead.sold_to || "–"], ["Price", lead.price ?? "–"], ["Duplicate of", lead.duplicate_of || "–"],
      ["Errors", lead.errors.map(e => e.field + ": " + e.message).join("; ") || "–"]];
    document.getElementById("summary").replaceChildren(...facts.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, String(value))]));
    document.querySelector("#attempts tbody").replaceChildren(...lead.attempts.map(attemptRow));
    document.getElementById("fields").textContent = JSON.stringify(lead.fields, null, 2);
    document.getElementById("attribution").textContent = JSON.stringify(lead.attribution, null, 2);
    document.getElementById("raw").textContent = (lead.raw_content_type || "") + "\n\n" + lead.raw;
    document.getElementById("token-form").hidden = true;
  } catch (error) {
    document.getElementById("why").textContent = error.message;
    // Opened from a link (an alert, a chat message): ask for the token here.
    document.getElementById("token-form").hidden = false;
  }
}

document.getElementById("token-form").addEventListener("submit", event => {
  event.preventDefault();
  setAdminToken(document.getElementById("token").value);
  load();
});

load();
