// The status page: polls /v1/status every two seconds and redraws. Shows
// no personal data; the review queue needs the admin token.
"use strict";

const CIRCUIT_WORDS = { closed: "closed", half_open: "half open", open: "open" };

function latency(value) {
  return value ? value.p50_ms + " / " + value.p95_ms + " ms" : "–";
}

function caps(list) {
  return list && list.length ? list.map(cap => cap.period + " " + cap.used + " / " + cap.limit).join(", ") : "–";
}

function buyerRow(buyer) {
  const cell = (label, ...content) => el("td", { "data-label": label }, ...content);
  return el("tr", { "data-buyer": buyer.id },
    cell("Buyer", el("strong", {}, buyer.name), buyer.enabled ? "" : " (disabled)"),
    cell("Circuit", el("span", { class: "circuit", "data-state": buyer.circuit }, CIRCUIT_WORDS[buyer.circuit] || buyer.circuit)),
    cell("Since", el("time", { datetime: buyer.circuit_changed_at, title: buyer.circuit_changed_at }, ago(buyer.circuit_changed_at))),
    cell("Failures", String(buyer.consecutive_failures)),
    cell("In flight", buyer.in_flight + " / " + buyer.max_concurrency),
    cell("Sold today", String(buyer.sold_today)),
    cell("Caps used", caps(buyer.caps)),
    cell("Open now", buyer.open_now ? "yes" : "closed hours"),
    cell("Accepted", String(buyer.counts.accepted)),
    cell("Rejected", String(buyer.counts.rejected)),
    cell("Errors", String(buyer.counts.error)),
    cell("Timeouts", String(buyer.counts.timeout)),
    cell("Ping p50 / p95", latency(buyer.ping_latency)),
    cell("Post p50 / p95", latency(buyer.post_latency)));
}

function channelRow(channel) {
  const cell = (label, ...content) => el("td", { "data-label": label }, ...content);
  const health = channel.consecutive_failures > 0 ? "failing" : "ok";
  const role = channel.role ? " (" + channel.role + (channel.required ? ", required" : "") + ")" : "";
  return el("tr", { "data-channel": channel.id },
    cell("Channel", el("strong", {}, channel.id), role),
    cell("Kind", channel.kind),
    cell("Health", el("span", { class: "circuit", "data-state": health === "ok" ? "closed" : "open" }, health)),
    cell("Failures", String(channel.consecutive_failures)),
    cell("In flight", String(channel.in_flight)),
    cell("Waiting", String(channel.pending)),
    cell("Given up", String(channel.abandoned)),
    cell("Last confirmed", channel.last_confirmed_at
      ? el("time", { datetime: channel.last_confirmed_at, title: channel.last_confirmed_at }, ago(channel.last_confirmed_at))
      : "never"));
}

function draw(status) {
  document.querySelector("#buyers tbody").replaceChildren(...status.buyers.map(buyerRow));
  document.querySelector("#notify tbody").replaceChildren(...(status.notify || []).map(channelRow));
  const counts = document.getElementById("lead-counts");
  if (status.leads) {
    counts.replaceChildren(...Object.entries(status.leads).map(([state, count]) =>
      el("li", { "data-state": state }, state + ": ", el("strong", {}, String(count)))));
  }
  document.getElementById("review-size").textContent = status.review ? String(status.review.pending) : "–";
  document.getElementById("spool-size").textContent = String(status.spool.pending);
  const routing = status.routing;
  document.getElementById("routing-width").textContent = routing.width < routing.widest
    ? `${routing.width} of ${routing.widest} waterfalls (yielding to intake)`
    : `${routing.width} waterfalls`;
  document.getElementById("database").textContent = status.database;
  for (const figure of ["revenue", "payout", "margin"]) {
    document.getElementById(figure).textContent = status.today ? status.today[figure].toFixed(2) : "–";
  }
  document.getElementById("freshness").textContent = "updated " + new Date().toLocaleTimeString();
}

async function refresh() {
  try {
    draw(await getJson("/v1/status", true));
  } catch (error) {
    document.getElementById("freshness").textContent = "cannot reach the service: " + error.message;
  }
}

async function showReview() {
  const list = document.getElementById("review");
  try {
    const page = await getJson("/v1/review?limit=50", true);
    list.replaceChildren(...page.leads.map(lead => el("li", {},
      el("a", { href: "/status/leads/" + encodeURIComponent(lead.id) }, lead.id),
      " — " + lead.lead_state + " from " + lead.source + ", " + ago(lead.received_at))));
    if (!page.leads.length) list.replaceChildren(el("li", {}, "nothing to review"));
  } catch (error) {
    list.replaceChildren(el("li", {}, error.message));
  }
}

document.getElementById("token-form").addEventListener("submit", event => {
  event.preventDefault();
  setAdminToken(document.getElementById("token").value);
  showReview();
});
if (adminToken()) showReview();
refresh();
setInterval(refresh, 2000);
