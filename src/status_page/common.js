// Shared by the status and lead pages: DOM building (text only, never
// HTML from data) and admin-token requests.
"use strict";

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
  }
  return node;
}

function adminToken() {
  return sessionStorage.getItem("leadrouter-admin-token") || "";
}

function setAdminToken(token) {
  sessionStorage.setItem("leadrouter-admin-token", token);
}

async function getJson(path, withToken) {
  const headers = {};
  if (withToken && adminToken()) headers.Authorization = "Bearer " + adminToken();
  const response = await fetch(path, { headers, cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.message || response.statusText);
  return body;
}

function ago(iso) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 90) return seconds + " s ago";
  if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h ago";
  return Math.round(seconds / 86400) + " d ago";
}
