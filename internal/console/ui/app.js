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

// lastAction is the button the operator pressed last (outside the reason
// dialog): say() answers next to it too, not only at the page's top.
let lastAction = null;
document.addEventListener("click", (ev) => {
  const b = ev.target.closest && ev.target.closest("button");
  if (b && !b.closest("dialog")) lastAction = b;
}, true);

function say(msg, isError) {
  const s = $("status");
  s.textContent = msg;
  s.className = isError ? "error" : "";
  if (lastAction && lastAction.isConnected && !$("app").hidden) {
    let fb = lastAction.nextElementSibling;
    if (!fb || !fb.classList.contains("feedback")) {
      fb = document.createElement("span");
      fb.className = "feedback";
      fb.setAttribute("role", "status");
      lastAction.after(fb);
    }
    fb.textContent = msg;
    fb.classList.toggle("error", !!isError);
  }
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
function askReason(title, warning, plan) {
  return new Promise((resolve) => {
    const dlg = $("reason-dialog");
    $("reason-title").textContent = title;
    $("reason-warning").textContent = warning || "";
    $("reason-plan").replaceChildren(...(plan ? [plan] : []));
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

// paceText says what the dry run's time is made of: the batch's own rate,
// or the DLQ's per-user pacing when a user's letters take longer than that.
function paceText(dry) {
  const p = dry.pace;
  if (!p || p.slowest_seconds <= dry.rate_seconds) {
    return ` at ${dry.rate} a second`;
  }
  return `: retries go back at most ${p.allow} of a user's every ${duration(p.window_seconds)}, ` +
    `and ${p.slowest_user} has ${p.slowest_letters} letters` +
    (p.paced_users > 1 ? ` (${p.paced_users} users are paced)` : "");
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
    // The last label ends at the chart's edge (text-anchor end), so it is
    // never cut off whatever the locale's time format.
    const anchor = i === 0 ? "start" : (i === n ? "end" : "middle");
    const t = svgEl("text", { x: pad + i * bw, y: H + 14, "font-size": 10, fill: "#5a6172", "text-anchor": anchor });
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
  $("ov-actors").textContent = o.consumers_error ? "?" : String(o.actors);
  $("ov-breakers").textContent = o.consumers_error ? "?" : String(o.open_breakers);
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
    const days = a.days || [];
    const sum = (k) => days.reduce((n, d) => n + d[k], 0);
    const stats = cell(tr, days.length
      ? `${days.map((d) => d.customer_messages).join(" · ")} (${sum("customer_messages")} / ${sum("customers")} / ${sum("sessions")})`
      : "not collected yet");
    stats.className = "stats";
    stats.title = days.map((d) => `${d.day.slice(0, 10)}: ${d.customer_messages} messages, ${d.customers} customers, ${d.sessions} sessions, ${d.handed_on} handed on`).join("\n");
    ab.appendChild(tr);
  });
  if (!o.accounts.length && !o.accounts_error) {
    const tr = document.createElement("tr");
    cell(tr, "no account has reported yet (kf-producer publishes every 10 s)").colSpan = 6;
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
    const age = p.commit_age_seconds == null ? "" :
      (p.commit_age_at_least ? "≥ " : "") + duration(p.commit_age_seconds) + (p.lag === 0 ? " (idle)" : "");
    const ac = cell(tr, age);
    if (p.lag > 0 && p.commit_age_seconds >= 60) ac.className = "state-warning";
    pb.appendChild(tr);
  });

  $("ov-consumers-error").textContent = o.consumers_error || "";
  const cb = $("consumers").querySelector("tbody");
  cb.replaceChildren();
  o.consumers.forEach((c) => {
    const tr = document.createElement("tr");
    cell(tr, c.node);
    cell(tr, c.partitions);
    cell(tr, c.actors);
    const br = cell(tr, c.open_breakers);
    if (c.open_breakers > 0) br.className = "state-warning";
    const rep = cell(tr, ago(c.reported, now) + (c.stale ? " (stale)" : ""));
    if (c.stale) rep.className = "state-stale";
    cb.appendChild(tr);
  });
  if (!o.consumers.length && !o.consumers_error) {
    const tr = document.createElement("tr");
    cell(tr, "no schedule-consumer has reported (they publish every 10 s)").colSpan = 5;
    cb.appendChild(tr);
  }

  $("ov-inflow-error").textContent = o.inflow_error || "";
  $("ov-inflow").textContent = String(inflowChart(o.inflow));
}

function scheduleOverview() {
  clearInterval(overviewTimer);
  overviewTimer = null;
  if ($("auto-refresh").checked && !$("app").hidden) {
    overviewTimer = setInterval(() => [loadVerdict(), loadOverview(), loadStats()].forEach((p) => p.catch(fail)), 10000);
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
    td.appendChild(button("Retry", "retry-btn write", () => retryOne(m.id).catch(fail)));
    tb.appendChild(tr);
  });
  nextCursor = page.next_cursor;
  $("more").hidden = !nextCursor;
  say(`${tb.children.length} message(s) shown`);
  if ($("groups").open) await loadGroups();
}

async function loadGroups() {
  const g = await api("GET", "/admin/dlq/groups?" + filterQuery(filter()).toString());
  $("groups-summary").textContent = `${g.total}${g.truncated ? "+" : ""} letter(s) of ${g.users} user(s)` +
    (g.users > g.by_user.length ? ` — the ${g.by_user.length} with the most shown` : "") +
    (g.done ? `; ${g.done} more matched but their message is done already (not counted)` : "");
  const rb = $("groups-reason").querySelector("tbody");
  rb.replaceChildren();
  g.by_reason.forEach((r) => {
    const tr = document.createElement("tr");
    tr.dataset.reason = r.reason;
    const a = cell(tr, "");
    a.appendChild(button(r.reason, "link", () => { $("f-reason").value = r.reason; loadMessages(false).catch(fail); }));
    cell(tr, r.count);
    cell(tr, r.users);
    rb.appendChild(tr);
  });
  const ub = $("groups-user").querySelector("tbody");
  ub.replaceChildren();
  g.by_user.forEach((u) => {
    const tr = document.createElement("tr");
    tr.dataset.user = u.user;
    const a = cell(tr, "");
    a.appendChild(button(u.user, "link", () => { $("f-user").value = u.user; loadMessages(false).catch(fail); }));
    cell(tr, u.count);
    cell(tr, Object.entries(u.reasons).map(([r, n]) => `${r} ${n}`).join(", "));
    ub.appendChild(tr);
  });
}

// auditRows fills a table body with audit entries.
function auditRows(tb, entries, withTarget) {
  entries.forEach((e) => {
    const tr = document.createElement("tr");
    cell(tr, e.time ? new Date(e.time).toLocaleString() : "");
    cell(tr, e.who);
    cell(tr, e.action);
    if (withTarget) cell(tr, e.target);
    cell(tr, e.reason);
    cell(tr, e.result);
    tb.appendChild(tr);
  });
  if (!entries.length) {
    const tr = document.createElement("tr");
    cell(tr, "no entries").colSpan = withTarget ? 6 : 5;
    tb.appendChild(tr);
  }
}

async function showDetail(id, tr) {
  const m = await api("GET", "/admin/dlq/messages/" + encodeURIComponent(id));
  document.querySelectorAll("#messages tr.selected").forEach((r) => r.classList.remove("selected"));
  if (tr) tr.classList.add("selected");
  $("detail-id").textContent = id;
  $("detail-body").textContent = JSON.stringify(m, null, 2);
  $("detail").hidden = false;
  const a = await api("GET", "/admin/audit?limit=50&target=" + encodeURIComponent("dlq:" + id));
  const tb = $("detail-audit").querySelector("tbody");
  tb.replaceChildren();
  auditRows(tb, a.entries, false);
}

async function retryOne(id) {
  const reason = await askReason("Retry message " + id);
  if (reason === null) return;
  await api("POST", "/admin/dlq/retry/" + encodeURIComponent(id), { reason });
  await Promise.all([loadMessages(false), loadStats()]);
  if (!$("detail").hidden && $("detail-id").textContent === id) await showDetail(id, null);
  say("Retry scheduled for " + id);
}

// batch shows the dry run of a batch retry or purge (how many letters,
// which users, how many are done already), asks for the reason, and
// starts the batch; its progress is in the Batches card.
async function batch(kind) {
  const f = filter();
  const empty = Object.keys(f).length === 0;
  if (empty) f.all = true;
  const what = kind === "purge" ? "Purge" : "Retry";
  const path = kind === "purge" ? "/admin/dlq/purge" : "/admin/dlq/batch-retry";
  const dry = await api("POST", path, { filter: f, reason: "console: dry run before " + kind, dry_run: true });
  const skipped = [
    dry.already_done ? `${dry.already_done} already done` : "",
    dry.not_retryable ? `${dry.not_retryable} never retried (invalid_message, handler_rejected)` : "",
    dry.settled ? `${dry.settled} retried already` : "",
    dry.busy ? `${dry.busy} due now` : "",
  ].filter(Boolean).join(", ");
  if (dry.count === 0) {
    say(`${what}: nothing to do — ${dry.selected} letter(s) selected${skipped ? ": " + skipped : ""}`);
    return;
  }
  const plan = document.createElement("div");
  plan.id = "dry-run";
  const p = document.createElement("p");
  p.dataset.count = dry.count;
  // A message has one letter: the count is of messages.
  p.textContent = `${what} ${kind === "purge" ? dry.count : dry.messages} message(s) of ${dry.users} user(s)` +
    (dry.already_done ? `; ${dry.already_done} more selected are done already and will be skipped` : "") +
    (skipped && skipped !== `${dry.already_done} already done` ? ` (skipped: ${skipped})` : "") +
    ` — about ${duration(dry.seconds)}` + paceText(dry) + `, each user's letters in order.` +
    ((dry.blocked || []).length ? ` Warning: ${dry.blocked.length} of these users are blocked by the rate limiter ` +
      `(${dry.blocked.map((b) => b.user).join(", ")}); their letters would be refused again: unblock them first.` : "");
  plan.appendChild(p);
  const t = document.createElement("table");
  t.className = "compact";
  dry.top_users.forEach((u) => {
    const tr = document.createElement("tr");
    cell(tr, u.user);
    cell(tr, u.count);
    t.appendChild(tr);
  });
  plan.appendChild(t);
  const warning = empty ? "No filter is set: this applies to EVERY message in the DLQ." :
    "Applies to every message matching: " + filterQuery(f).toString();
  const reason = await askReason(what + " all matching messages", warning, plan);
  if (reason === null) return;
  const res = await api("POST", path, { filter: f, reason });
  say(res.batch ? `${what}: batch ${res.batch.id} started for ${res.batch.total} letter(s)` : `${what}: nothing to do`);
  batchesRunning = batchesRunning || !!res.batch; // one that ends before the first look still reloads the letters
  await loadBatches();
}

let batchTimer = null;
let batchesRunning = false; // at the last loadBatches

let fleetTimer = null;

// loadFleet lists the running daemons (GET /admin/fleet) and looks again in
// 2 s while the console is open: the list follows etcd's registry.
async function loadFleet() {
  clearTimeout(fleetTimer);
  fleetTimer = null;
  const tb = $("fleet").querySelector("tbody");
  try {
    const f = await api("GET", "/admin/fleet");
    const now = new Date();
    tb.replaceChildren();
    f.members.forEach((m) => {
      const tr = document.createElement("tr");
      tr.dataset.id = m.id;
      tr.dataset.role = m.role;
      if (m.stale) tr.dataset.stale = "true";
      cell(tr, m.role + (m.stale ? " (stale)" : ""));
      cell(tr, m.id);
      cell(tr, m.node);
      cell(tr, m.version);
      cell(tr, ago(m.started_at, now).replace(/ ago$/, ""));
      cell(tr, m.ops_addr);
      let work = "";
      if (m.role === "kf-producer") work = m.worker_id >= 0 ? "worker ID " + m.worker_id : "no worker ID";
      if (m.role === "schedule-consumer") work = `partitions ${m.partitions.length ? m.partitions.join(", ") : "none"}; ${m.actors} actors`;
      if (m.role === "dlq-consumer" && m.admin_addr) work = "admin " + m.admin_addr;
      // The same rule as kfpipectl fleet and health: silent, shown until gone.
      if (m.stale) work = `silent since ${m.last_heard ? ago(m.last_heard, now) : "?"}; was: ` + work;
      cell(tr, work);
      tb.appendChild(tr);
    });
    const roles = Object.entries(f.by_role).map(([r, n]) => `${n} ${r}`).join(", ");
    $("fleet-count").textContent = f.members.length ? `(${roles})` : "(none)";
    $("fleet-note").textContent = "";
  } catch (err) {
    if (err.status !== 503) throw err;
    tb.replaceChildren();
    $("fleet-count").textContent = "";
    $("fleet-note").textContent = err.message;
  } finally {
    if (!$("app").hidden) fleetTimer = setTimeout(() => loadFleet().catch(fail), 2000);
  }
}

async function loadBatches() {
  const page = await api("GET", "/admin/dlq/batches");
  const tb = $("batches").querySelector("tbody");
  tb.replaceChildren();
  let running = false;
  page.batches.forEach((b) => {
    const tr = document.createElement("tr");
    tr.dataset.id = b.id;
    tr.dataset.state = b.state;
    cell(tr, new Date(b.created).toLocaleString());
    cell(tr, b.action);
    cell(tr, b.filter.replace(/^dlq:filter /, ""));
    cell(tr, `${b.who}: ${b.reason}`);
    const pc = cell(tr, "");
    const bar = document.createElement("progress");
    bar.max = Math.max(1, b.total);
    bar.value = b.position;
    pc.appendChild(bar);
    pc.appendChild(document.createTextNode(` ${b.position}/${b.total}`));
    cell(tr, b.acted).className = "acted";
    // A retry counts what is back in the main topic, not only requeued:
    // the DLQ's per-user pacing holds letters past a window for the next.
    const retry = b.action === "retry";
    const requeued = b.position >= b.total;
    cell(tr, retry && requeued ? `${b.delivered}/${b.acted}` + (b.waiting ? `, ${b.waiting} waiting` : "") : (retry ? "" : "n/a")).className = "delivered";
    const due = [];
    if (b.next_retry) due.push(new Date(b.next_retry).toLocaleTimeString());
    if (b.last_retry && b.last_retry !== b.next_retry) due.push("last " + new Date(b.last_retry).toLocaleTimeString());
    cell(tr, due.join(", ")).className = "next-retry";
    cell(tr, b.skipped_done);
    cell(tr, b.gone);
    let state = b.state;
    if (b.state === "running" && retry && requeued) state = `running: ${b.waiting} letter(s) wait for their due time (the DLQ's per-user pacing)`;
    if (b.state === "running" && !b.runner) state = "waiting to be resumed";
    if (b.state === "cancelled") state += " by " + b.cancelled_by;
    const sc = cell(tr, state + (b.error ? " — " + b.error : ""));
    sc.className = "state";
    const td = cell(tr, "");
    if (b.state === "running") {
      running = true;
      td.appendChild(button("Cancel", "cancel-btn write", () => cancelBatch(b.id).catch(fail)));
    }
    tb.appendChild(tr);
  });
  if (!page.batches.length) {
    const tr = document.createElement("tr");
    cell(tr, "no batch yet").colSpan = 12;
    tb.appendChild(tr);
  }
  clearTimeout(batchTimer);
  batchTimer = null;
  const ended = batchesRunning && !running;
  batchesRunning = running;
  if (running && !$("app").hidden) {
    batchTimer = setTimeout(() => loadBatches().catch(fail), 1000);
  } else if (ended) {
    // A batch just ended: the letters it acted on changed.
    await Promise.all([loadStats(), loadMessages(false)]);
  }
}

async function cancelBatch(id) {
  const reason = await askReason("Cancel batch " + id, "Letters it acted on stay retried (or purged); the rest are left as they are.");
  if (reason === null) return;
  await api("POST", "/admin/dlq/batches/" + encodeURIComponent(id) + "/cancel", { reason });
  say("Cancel requested for batch " + id);
  await loadBatches();
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
    td.appendChild(button("Unblock", "unblock-btn write", () => unblock(u.user).catch(fail)));
    tb.appendChild(tr);
  });
}

async function unblock(user) {
  const reason = await askReason("Unblock user " + user);
  if (reason === null) return;
  const ans = await api("POST", "/admin/ratelimit/unblock/" + encodeURIComponent(user), { reason });
  await loadBlocked();
  say("Unblocked " + user + waitingText(user, ans));
}

// waitingText: an unblock does not bring the user's dead letters forward;
// the answer counts those still waiting for their scheduled retry.
function waitingText(user, ans) {
  if (!ans || !ans.waiting_letters) return "";
  const until = ans.waiting_until ? ` (the last at ${new Date(ans.waiting_until).toLocaleString()})` : "";
  return `. ${ans.waiting_letters} dead letter(s) of ${user} still wait for their scheduled retry${until}: ` +
    `filter the dead letters by this user and "Retry all matching…" to send them now.`;
}

// ---- Rate limits -----------------------------------------------------

let rlUser = "";

async function lookupUser(user) {
  rlUser = user;
  const enc = encodeURIComponent(user);
  const [st, audit] = await Promise.all([api("GET", "/admin/ratelimit/status/" + enc),
    api("GET", "/admin/audit?limit=50&target=" + encodeURIComponent("user:" + user))]);
  const tb = $("rl-status").querySelector("tbody");
  tb.replaceChildren();
  const row = (k, v) => { const tr = document.createElement("tr"); cell(tr, k); cell(tr, v); tr.dataset.key = k; tb.appendChild(tr); };
  row("User", st.user);
  row("Group", st.group);
  if (st.rule) {
    row("Rule", `at most ${st.rule.max_messages} in any ${st.rule.window_seconds} s; ` +
      `${st.rule.penalty_threshold} refusals block for ${st.rule.block_hours} h`);
  }
  row("Blocked", st.blocked ? (st.permanent ? "permanently" : "until " + new Date(st.blocked_until).toLocaleString()) : "no");
  const bs = st.block_story || { events: [] };
  const cur = bs.current;
  row("Block began", cur ? `${new Date(cur.time).toLocaleString()} — ${cur.kind === "automatic" ? "automatic (rate limiter)" : "by operator " + cur.who}: ${cur.why}` :
    (st.blocked ? "not known: " + (bs.note || "") : "not blocked"));
  row("Whitelisted", bs.whitelisted ? "yes: never limited" : "no");
  row("Blocks remembered", String(bs.events.filter((e) => e.action === "block").length) +
    ` (automatic ${bs.events.filter((e) => e.action === "block" && e.kind === "automatic").length}, by operators ${bs.events.filter((e) => e.action === "block" && e.kind === "operator").length})`);
  row("Dead letters, last hour", Object.entries(st.recent_letters || {}).map(([r, n]) => `${r} ${n}`).join(", ") || "none");
  const bb = $("rl-blocks").querySelector("tbody");
  bb.replaceChildren();
  bs.events.forEach((e) => {
    const tr = document.createElement("tr");
    tr.dataset.kind = e.kind;
    tr.dataset.action = e.action;
    cell(tr, new Date(e.time).toLocaleString());
    cell(tr, e.action);
    cell(tr, e.kind === "automatic" ? "automatic (rate limiter)" : e.who);
    cell(tr, e.why);
    cell(tr, e.letter ? "dead letter " + e.letter : (e.audit_id ? "audit " + e.audit_id : ""));
    bb.appendChild(tr);
  });
  if (!bs.events.length) {
    const tr = document.createElement("tr");
    cell(tr, "no block, unblock or whitelist change kept for this user").colSpan = 5;
    bb.appendChild(tr);
  }
  $("rl-group").value = st.group;
  const ab = $("rl-audit").querySelector("tbody");
  ab.replaceChildren();
  auditRows(ab, audit.entries, false);
  $("rl-result").hidden = false;
}

async function rlWrite(title, method, path, extra) {
  const reason = await askReason(title + " " + rlUser);
  if (reason === null) return;
  const ans = await api(method, path + encodeURIComponent(rlUser), Object.assign({ reason }, extra || {}));
  say(title + " " + rlUser + ": done" + waitingText(rlUser, ans));
  await Promise.all([lookupUser(rlUser), loadBlocked()]);
}

// ---- Audit log -------------------------------------------------------

let auditCursor = "";

async function loadAudit(append) {
  const q = new URLSearchParams({ limit: "50" });
  for (const [k, id] of [["who", "a-who"], ["action", "a-action"], ["target", "a-target"]]) {
    const v = $(id).value.trim();
    if (v) q.set(k, v);
  }
  if (append && auditCursor) q.set("cursor", auditCursor);
  const page = await api("GET", "/admin/audit?" + q.toString());
  const tb = $("audit").querySelector("tbody");
  if (!append) tb.replaceChildren();
  auditRows(tb, page.entries, true);
  auditCursor = page.next_cursor;
  $("audit-more").hidden = !auditCursor;
}

async function start() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  const me = await api("GET", "/admin/whoami");
  // Viewers see no write controls (the API refuses their writes anyway).
  document.body.classList.toggle("viewer", me.role !== "operator");
  $("whoami").textContent = `${me.name} (${me.role})`;
  $("nav").hidden = false;
  // Every card loads on its own: one that fails says so and the others,
  // and the 10 s refresh, still run (a failed load used to leave the page
  // without its refresh).
  const loads = await Promise.allSettled([loadVerdict(), loadOverview(), loadKafka(), loadFleet(), loadStats(),
    loadMessages(false), loadBlocked(), loadBatches(), loadAudit(false)]);
  scheduleOverview();
  const failed = loads.find((r) => r.status === "rejected");
  if (failed) throw failed.reason;
}

function logout(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(overviewTimer);
  overviewTimer = null;
  clearTimeout(batchTimer);
  batchTimer = null;
  clearTimeout(fleetTimer);
  fleetTimer = null;
  batchesRunning = false;
  document.body.classList.remove("viewer");
  $("nav").hidden = true;
  $("whoami").textContent = "";
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
  $("groups").addEventListener("toggle", () => { if ($("groups").open) loadGroups().catch(fail); });
  $("refresh-batches").addEventListener("click", () => loadBatches().catch(fail));
  $("rl-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const u = $("rl-user").value.trim();
    if (u) lookupUser(u).catch(fail);
  });
  $("rl-set-group").addEventListener("click", () =>
    rlWrite("Change group of", "PUT", "/admin/ratelimit/group/", { group: $("rl-group").value.trim() }).catch(fail));
  $("rl-block").addEventListener("click", () =>
    rlWrite("Block", "POST", "/admin/ratelimit/block/", { duration: $("rl-block-for").value.trim() }).catch(fail));
  $("rl-unblock").addEventListener("click", () => rlWrite("Unblock", "POST", "/admin/ratelimit/unblock/").catch(fail));
  $("rl-whitelist").addEventListener("click", () => rlWrite("Whitelist", "POST", "/admin/ratelimit/whitelist/").catch(fail));
  $("rl-unwhitelist").addEventListener("click", () =>
    rlWrite("Remove from the whitelist", "DELETE", "/admin/ratelimit/whitelist/").catch(fail));
  $("audit-form").addEventListener("submit", (ev) => { ev.preventDefault(); loadAudit(false).catch(fail); });
  $("audit-more").addEventListener("click", () => loadAudit(true).catch(fail));
  if (token()) start().catch((err) => { if (err.status !== 401) fail(err); });
});

// ---- Customer timeline -------------------------------------------------
// GET /admin/customers/{user}/timeline: "customer X says the bot never
// answered". Letters link to the dead-letter detail, operator actions to
// the audit log.

const outcomeText = {
  answered: "answered", processed: "processed, no reply", dead_letter: "in the DLQ",
  in_progress: "not processed yet", unknown: "unknown (expired)",
  reply_skipped: "reply skipped (human serving, or WeChat's window)",
};

async function loadTimeline() {
  const user = $("cu-user").value.trim();
  if (!user) return;
  const q = new URLSearchParams();
  const msgid = $("cu-msgid").value.trim();
  const win = $("cu-window").value.trim();
  if (msgid) q.set("msgid", msgid);
  if (win) q.set("window", win);
  const tl = await api("GET", "/admin/customers/" + encodeURIComponent(user) + "/timeline?" + q.toString());
  const sum = $("cu-summary");
  sum.textContent = tl.summary;
  sum.dataset.known = String(tl.known);
  sum.className = tl.known ? "" : "state-warning";
  const read = [];
  if (tl.topic) {
    read.push(`main topic ${tl.topic.topic} partition ${tl.topic.partition}, offsets ${tl.topic.from_offset}–${tl.topic.to_offset}` +
      ` since ${new Date(tl.since).toLocaleString()}` + (tl.topic.truncated ? " (truncated: older records not read)" : ""));
  }
  if (tl.archive) {
    read.unshift(`archive: messages sent since ${new Date(tl.archive.truncated ? tl.archive.from : tl.since).toLocaleString()}` +
      (tl.archive.behind_by > 0 ? ` · archive behind by ${tl.archive.behind_by} record(s) on partition ${tl.archive.partition}` : ""));
  }
  if (tl.read) read.push(tl.complete ? "the whole window read" : "NOT the whole window read");
  const missing = Object.entries(tl.sources).filter(([, v]) => v !== "ok").map(([k, v]) => `${k} ${v}`);
  if (missing.length) read.push("not read: " + missing.join(", "));
  $("cu-read").textContent = read.join(" · ");
  const l = tl.limiter;
  $("cu-limiter").textContent = l ? `rate limiter: group ${l.group}, ` + (l.blocked ?
    (l.permanent ? "BLOCKED permanently" : "BLOCKED until " + new Date(l.blocked_until).toLocaleString()) : "not blocked") : "";
  $("cu-notes").textContent = tl.notes.join("; ");

  const tb = $("cu-messages").querySelector("tbody");
  tb.replaceChildren();
  tl.messages.forEach((m) => {
    const tr = document.createElement("tr");
    tr.dataset.msgid = m.upstream_msgid;
    tr.dataset.outcome = m.outcome;
    const first = m.received[0];
    cell(tr, first ? new Date(first.time).toLocaleString() : (m.send_time ? new Date(m.send_time).toLocaleString() : ""));
    cell(tr, (m.preview ? `“${m.preview}” ` : "") + m.upstream_msgid);
    cell(tr, m.received.map((r) => `p${r.partition}@${r.offset}` + (r.retry_from_dlq ? ` (retry ${r.retry_count})` : "") +
      (r.archived ? " (archive)" : "")).join(", ") || "not kept");
    cell(tr, m.limiter);
    cell(tr, m.processed.replace("_", " "));
    cell(tr, m.attempts);
    cell(tr, m.replies.length ? m.replies.length + " sent" : "none");
    const lt = cell(tr, "");
    m.letters.forEach((d) => {
      lt.appendChild(button(`${d.reason}: ${d.state}`, "link letter-btn", () => {
        showDetail(d.id, null).then(() => $("detail").scrollIntoView()).catch(fail);
      }));
    });
    const oc = cell(tr, outcomeText[m.outcome] || m.outcome);
    oc.className = "outcome " + ({ answered: "", processed: "", reply_skipped: "" }[m.outcome] ?? "state-warning");
    cell(tr, m.story).className = "story small";
    tb.appendChild(tr);
  });
  if (!tl.messages.length) {
    const tr = document.createElement("tr");
    cell(tr, tl.known ? "no message kept" : "nothing known about this user").colSpan = 10;
    tb.appendChild(tr);
  }

  const eb = $("cu-events").querySelector("tbody");
  eb.replaceChildren();
  tl.events.forEach((e) => {
    const tr = document.createElement("tr");
    tr.dataset.kind = e.kind;
    cell(tr, new Date(e.time).toLocaleString());
    cell(tr, e.kind.replace("_", " "));
    const w = cell(tr, "");
    if (e.audit_id) {
      w.appendChild(button(e.what, "link audit-btn", () => {
        $("a-target").value = e.what.split(" ").slice(1).join(" ");
        loadAudit(false).then(() => $("audit-card").scrollIntoView()).catch(fail);
      }));
    } else {
      w.textContent = e.what;
    }
    cell(tr, e.who);
    cell(tr, e.reason);
    cell(tr, e.result);
    eb.appendChild(tr);
  });
  if (!tl.events.length) {
    const tr = document.createElement("tr");
    cell(tr, "none").colSpan = 6;
    eb.appendChild(tr);
  }
  $("cu-result").hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("cu-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    $("cu-error").textContent = "";
    loadTimeline().catch((err) => { $("cu-error").textContent = err.message + (err.field ? " (" + err.field + ")" : ""); });
  });
});
