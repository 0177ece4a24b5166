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

// ---- Overview -------------------------------------------------------

let lastOverview = null; // the previous answer: two give the throughput
let overviewTimer = null;

function ago(iso, now) {
  if (!iso) return "";
  return duration((now - new Date(iso)) / 1000) + " ago";
}

function duration(sec) {
  sec = Math.max(0, Math.round(sec));
  if (sec < 120) return sec + " s";
  if (sec < 7200) return Math.round(sec / 60) + " min";
  return (sec / 3600).toFixed(1) + " h";
}

const reasonColors = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00", "#b82e2e", "#316395"];

const SVG = "http://www.w3.org/2000/svg";
function svgEl(name, attrs) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// inflowChart draws the buckets as stacked bars, one colour per reason.
function inflowChart(inflow) {
  const box = $("inflow-chart");
  box.replaceChildren();
  const reasons = Object.keys(inflow.by_reason).sort();
  const n = reasons.length ? inflow.by_reason[reasons[0]].length : 12;
  const totals = new Array(n).fill(0);
  reasons.forEach((r) => inflow.by_reason[r].forEach((c, i) => { totals[i] += c; }));
  const top = Math.max(1, ...totals);
  const W = 480, H = 160, pad = 24, bw = (W - pad) / n;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H + 18}`, role: "img", "aria-label": "dead letters by reason, last hour" });
  svg.appendChild(svgEl("line", { x1: pad, y1: H, x2: W, y2: H, stroke: "#999" }));
  const label = svgEl("text", { x: 0, y: 10, "font-size": 10, fill: "#5a6172" });
  label.textContent = String(top);
  svg.appendChild(label);
  for (let i = 0; i < n; i++) {
    let y = H;
    reasons.forEach((r, k) => {
      const c = inflow.by_reason[r][i];
      if (!c) return;
      const h = (c / top) * (H - 12);
      y -= h;
      const rect = svgEl("rect", { x: pad + i * bw + 1, y, width: bw - 2, height: h, fill: reasonColors[k % reasonColors.length] });
      const title = svgEl("title", {});
      title.textContent = `${r}: ${c}`;
      rect.appendChild(title);
      svg.appendChild(rect);
    });
  }
  const to = new Date(inflow.to);
  [0, n / 2, n].forEach((i) => {
    const t = svgEl("text", { x: Math.min(pad + i * bw, W - 30), y: H + 14, "font-size": 10, fill: "#5a6172" });
    const at = new Date(to - (n - i) * inflow.step_seconds * 1000);
    t.textContent = at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    svg.appendChild(t);
  });
  box.appendChild(svg);
  const legend = document.createElement("div");
  legend.className = "legend";
  reasons.forEach((r, k) => {
    const item = document.createElement("span");
    item.dataset.reason = r;
    const sw = document.createElement("i");
    sw.style.background = reasonColors[k % reasonColors.length];
    item.appendChild(sw);
    item.appendChild(document.createTextNode(`${r} ${inflow.by_reason[r].reduce((a, b) => a + b, 0)}`));
    legend.appendChild(item);
  });
  if (!reasons.length) legend.textContent = "no dead letters in the last hour";
  box.appendChild(legend);
  return totals.reduce((a, b) => a + b, 0);
}

async function loadOverview() {
  const o = await api("GET", "/admin/overview");
  const now = new Date(o.time);
  $("ov-time").textContent = "as of " + now.toLocaleTimeString();
  $("ov-lag").textContent = o.lag_error ? "?" : String(o.lag_total);
  $("ov-review").textContent = String(o.dlq.review);
  $("ov-due").textContent = String(o.dlq.due_now);
  $("ov-blocked").textContent = o.blocked_users + (o.blocked_users_capped ? "+" : "");
  if (lastOverview && !o.lag_error && !lastOverview.lag_error) {
    const dt = (now - new Date(lastOverview.time)) / 1000;
    if (dt > 0) {
      const rin = (o.end_total - lastOverview.end_total) / dt;
      const rout = (o.committed_total - lastOverview.committed_total) / dt;
      $("ov-rate").textContent = `${Math.max(0, rin).toFixed(1)} / ${Math.max(0, rout).toFixed(1)}`;
    }
  }
  lastOverview = o;

  $("ov-accounts-error").textContent = o.accounts_error || "";
  const ab = $("accounts").querySelector("tbody");
  ab.replaceChildren();
  o.accounts.forEach((a) => {
    const tr = document.createElement("tr");
    tr.dataset.kf = a.open_kfid;
    cell(tr, a.open_kfid);
    const st = cell(tr, a.state);
    st.className = "state-" + a.state;
    cell(tr, a.last_success ? ago(a.last_success, now) : "none since start");
    cell(tr, a.oldest_waiting ? ago(a.oldest_waiting, now) : "nothing waits");
    cell(tr, a.horizon_left_seconds == null ? "" : duration(a.horizon_left_seconds));
    ab.appendChild(tr);
  });
  if (!o.accounts.length && !o.accounts_error) {
    const tr = document.createElement("tr");
    cell(tr, "no account has reported yet (kf-producer publishes every 10 s)").colSpan = 5;
    ab.appendChild(tr);
  }

  $("ov-lag-error").textContent = o.lag_error || "";
  const pb = $("partitions").querySelector("tbody");
  pb.replaceChildren();
  o.partitions.forEach((p) => {
    const tr = document.createElement("tr");
    tr.dataset.partition = p.partition;
    cell(tr, p.partition);
    cell(tr, p.end_offset);
    cell(tr, p.committed_offset < 0 ? "none" : p.committed_offset);
    cell(tr, p.lag);
    pb.appendChild(tr);
  });

  $("ov-inflow-error").textContent = o.inflow_error || "";
  $("ov-inflow").textContent = String(inflowChart(o.inflow));
}

function scheduleOverview() {
  clearInterval(overviewTimer);
  overviewTimer = null;
  if ($("auto-refresh").checked && !$("app").hidden) {
    overviewTimer = setInterval(() => Promise.all([loadOverview(), loadStats()]).catch(fail), 10000);
  }
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
  await Promise.all([loadOverview(), loadStats(), loadMessages(false), loadBlocked()]);
  scheduleOverview();
}

function logout(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(overviewTimer);
  overviewTimer = null;
  lastOverview = null;
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
  $("refresh-overview").addEventListener("click", () => loadOverview().catch(fail));
  $("auto-refresh").addEventListener("change", scheduleOverview);
  $("refresh-blocked").addEventListener("click", () => loadBlocked().catch(fail));
  $("batch-retry").addEventListener("click", () => batch("retry").catch(fail));
  $("purge").addEventListener("click", () => batch("purge").catch(fail));
  $("export-csv").addEventListener("click", (ev) => exportCSV(ev).catch(fail));
  $("detail-close").addEventListener("click", () => { $("detail").hidden = true; });
  if (token()) start().catch((err) => { if (err.status !== 401) fail(err); });
});
