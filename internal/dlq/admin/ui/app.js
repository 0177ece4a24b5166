// kfpipe admin console. Plain JS, no build step. Every value from the API
// goes into the page with textContent, never as HTML.
"use strict";

const TOKEN_KEY = "kfpipe-admin-token";
const $ = (id) => document.getElementById(id);

let nextCursor = "";

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

class APIError extends Error {
  constructor(status, body) {
    super((body && body.error) || ("HTTP " + status));
    this.status = status;
    this.field = body && body.field;
  }
}

async function api(method, path, body) {
  const opts = { method, headers: { "Authorization": "Bearer " + token() } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  if (resp.status === 401) {
    logout("Token rejected: log in again.");
    throw new APIError(401, { error: "unauthorized" });
  }
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (!resp.ok) throw new APIError(resp.status, data);
  return data;
}

function say(msg, isError) {
  const s = $("status");
  s.textContent = msg;
  s.className = isError ? "error" : "";
}

function fail(err) {
  const where = err.field ? " (" + err.field + ")" : "";
  say(err.message + where, true);
}

function cell(tr, text) {
  const td = document.createElement("td");
  td.textContent = text == null ? "" : String(text);
  tr.appendChild(td);
  return td;
}

function button(label, cls, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.className = cls;
  b.addEventListener("click", onClick);
  return b;
}

// askReason opens the reason dialog and resolves with the text, or null
// when cancelled.
function askReason(title, warning) {
  return new Promise((resolve) => {
    const dlg = $("reason-dialog");
    $("reason-title").textContent = title;
    $("reason-warning").textContent = warning || "";
    $("reason-text").value = "";
    const done = (value) => {
      $("reason-form").removeEventListener("submit", onSubmit);
      $("reason-cancel").removeEventListener("click", onCancel);
      dlg.close();
      resolve(value);
    };
    const onSubmit = (ev) => {
      ev.preventDefault();
      const v = $("reason-text").value.trim();
      if (v) done(v);
    };
    const onCancel = () => done(null);
    $("reason-form").addEventListener("submit", onSubmit);
    $("reason-cancel").addEventListener("click", onCancel);
    dlg.showModal();
    $("reason-text").focus();
  });
}

async function loadStats() {
  const st = await api("GET", "/admin/dlq/stats");
  $("stats-summary").textContent =
    `total ${st.total} · due ${st.due} (now ${st.due_now}) · review ${st.review} · retried ${st.retried}`;
  const tb = $("stats").querySelector("tbody");
  tb.replaceChildren();
  const dl = $("reasons");
  dl.replaceChildren();
  Object.keys(st.by_reason).sort().forEach((r) => {
    const tr = document.createElement("tr");
    tr.dataset.reason = r;
    cell(tr, r);
    cell(tr, st.by_reason[r]);
    tb.appendChild(tr);
    const o = document.createElement("option");
    o.value = r;
    dl.appendChild(o);
  });
}

function filter() {
  const f = {};
  const user = $("f-user").value.trim();
  const reason = $("f-reason").value.trim();
  const review = $("f-review").value;
  if (user) f.user = user;
  if (reason) f.reason = reason;
  if (review) f.review = review === "true";
  return f;
}

function filterQuery(f) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(f)) q.set(k, String(v));
  return q;
}

async function loadMessages(append) {
  const q = filterQuery(filter());
  q.set("limit", "50");
  if (append && nextCursor) q.set("cursor", nextCursor);
  const page = await api("GET", "/admin/dlq/messages?" + q.toString());
  const tb = $("messages").querySelector("tbody");
  if (!append) tb.replaceChildren();
  page.messages.forEach((m) => {
    const tr = document.createElement("tr");
    tr.dataset.id = m.id;
    cell(tr, m.id);
    cell(tr, m.user);
    cell(tr, m.reason);
    cell(tr, m.state);
    cell(tr, m.preview || "");
    cell(tr, m.failure_time ? new Date(m.failure_time).toLocaleString() : "");
    cell(tr, m.retry_count);
    const td = cell(tr, "");
    td.appendChild(button("Details", "detail-btn", () => showDetail(m.id, tr).catch(fail)));
    td.appendChild(button("Retry", "retry-btn", () => retryOne(m.id).catch(fail)));
    tb.appendChild(tr);
  });
  nextCursor = page.next_cursor;
  $("more").hidden = !nextCursor;
  say(`${tb.children.length} message(s) shown`);
}

async function showDetail(id, tr) {
  const m = await api("GET", "/admin/dlq/messages/" + encodeURIComponent(id));
  document.querySelectorAll("#messages tr.selected").forEach((r) => r.classList.remove("selected"));
  if (tr) tr.classList.add("selected");
  $("detail-id").textContent = id;
  $("detail-body").textContent = JSON.stringify(m, null, 2);
  $("detail").hidden = false;
}

async function retryOne(id) {
  const reason = await askReason("Retry message " + id);
  if (reason === null) return;
  await api("POST", "/admin/dlq/retry/" + encodeURIComponent(id), { reason });
  await Promise.all([loadMessages(false), loadStats()]);
  if (!$("detail").hidden && $("detail-id").textContent === id) await showDetail(id, null);
  say("Retry scheduled for " + id);
}

async function batch(kind) {
  const f = filter();
  const empty = Object.keys(f).length === 0;
  if (empty) f.all = true;
  const what = kind === "purge" ? "Purge" : "Retry";
  const warning = empty ? "No filter is set: this applies to EVERY message in the DLQ." :
    "Applies to every message matching: " + filterQuery(f).toString();
  const reason = await askReason(what + " all matching messages", warning);
  if (reason === null) return;
  const path = kind === "purge" ? "/admin/dlq/purge" : "/admin/dlq/batch-retry";
  const res = await api("POST", path, { filter: f, reason });
  await Promise.all([loadMessages(false), loadStats()]);
  say(`${what}: ${res.count} message(s)`);
}

async function exportCSV(ev) {
  ev.preventDefault();
  const resp = await fetch("/admin/dlq/export?format=csv&" + filterQuery(filter()).toString(),
    { headers: { "Authorization": "Bearer " + token() } });
  if (!resp.ok) {
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    throw new APIError(resp.status, body);
  }
  const url = URL.createObjectURL(await resp.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = "dlq-export.csv";
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

async function loadBlocked() {
  const page = await api("GET", "/admin/ratelimit/blocked?limit=500");
  const tb = $("blocked").querySelector("tbody");
  tb.replaceChildren();
  page.users.forEach((u) => {
    const tr = document.createElement("tr");
    tr.dataset.user = u.user;
    cell(tr, u.user);
    cell(tr, u.permanent ? "permanent" : new Date(u.blocked_until).toLocaleString());
    const td = cell(tr, "");
    td.appendChild(button("Unblock", "unblock-btn", () => unblock(u.user).catch(fail)));
    tb.appendChild(tr);
  });
}

async function unblock(user) {
  const reason = await askReason("Unblock user " + user);
  if (reason === null) return;
  await api("POST", "/admin/ratelimit/unblock/" + encodeURIComponent(user), { reason });
  await loadBlocked();
  say("Unblocked " + user);
}

async function start() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  await Promise.all([loadStats(), loadMessages(false), loadBlocked()]);
}

function logout(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = msg || "";
}

async function login(ev) {
  ev.preventDefault();
  const t = $("token").value.trim();
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  $("token").value = "";
  try {
    await start();
  } catch (err) {
    if (err.status !== 401) $("login-error").textContent = err.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", () => logout(""));
  $("filter-form").addEventListener("submit", (ev) => { ev.preventDefault(); loadMessages(false).catch(fail); });
  $("more").addEventListener("click", () => loadMessages(true).catch(fail));
  $("refresh-stats").addEventListener("click", () => loadStats().catch(fail));
  $("refresh-blocked").addEventListener("click", () => loadBlocked().catch(fail));
  $("batch-retry").addEventListener("click", () => batch("retry").catch(fail));
  $("purge").addEventListener("click", () => batch("purge").catch(fail));
  $("export-csv").addEventListener("click", (ev) => exportCSV(ev).catch(fail));
  $("detail-close").addEventListener("click", () => { $("detail").hidden = true; });
  if (token()) start().catch((err) => { if (err.status !== 401) fail(err); });
});
