// kfpipe admin console: the Health card (GET /admin/verdict) and the
// Kafka card (GET /admin/kafka). Loaded after app.js; uses its helpers
// ($, api, cell, svgEl, duration, fail). Values go in with textContent.
"use strict";

const areaNames = { ingestion: "Ingestion", consumer_lag: "Consumer lag", dlq: "DLQ", redis: "Redis", downstream: "Downstream" };

function boundText(b) {
  const hold = b.for_seconds ? ` for ${duration(b.for_seconds)}` : "";
  if (b.equal) return `${b.alert} (${b.state}): ${b.what}${hold}`;
  if (b.value === 0 && !b.for_seconds) return `${b.alert} (${b.state}): ${b.what}`;
  return `${b.alert} (${b.state}): ${b.what} > ${b.value}${hold}`;
}

// sparkline draws one series (null: not read at the time) with its
// label, the latest value, the range and the times at both ends.
function sparkline(title, points, pick, fmt) {
  const box = document.createElement("figure");
  box.className = "spark";
  box.dataset.series = title;
  const vals = points.map(pick);
  const known = vals.filter((v) => v != null);
  const cap = document.createElement("figcaption");
  const last = known.length ? fmt(known[known.length - 1]) : "–";
  cap.textContent = `${title}: ${last}`;
  box.appendChild(cap);
  const W = 300, H = 60, padL = 34, padB = 14;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H + padB}`, role: "img", "aria-label": title });
  const top = Math.max(1, ...known), n = Math.max(1, points.length - 1);
  const x = (i) => padL + (i / n) * (W - padL - 2);
  const y = (v) => H - (v / top) * (H - 6);
  svg.appendChild(svgEl("line", { x1: padL, y1: H, x2: W, y2: H, stroke: "#bbb" }));
  const tl = svgEl("text", { x: padL - 3, y: 9, "font-size": 9, fill: "#5a6172", "text-anchor": "end" });
  tl.textContent = fmt(top);
  svg.appendChild(tl);
  const zl = svgEl("text", { x: padL - 3, y: H, "font-size": 9, fill: "#5a6172", "text-anchor": "end" });
  zl.textContent = "0";
  svg.appendChild(zl);
  let d = "";
  vals.forEach((v, i) => {
    if (v == null) return;
    d += (d && vals[i - 1] != null ? "L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
  });
  if (d) svg.appendChild(svgEl("path", { d, fill: "none", stroke: "#3366cc", "stroke-width": 1.5 }));
  if (points.length) {
    // The first time at the left, the last at the right edge (anchored
    // at its end: never cut off); one sample has one label.
    const t = (i, anchor) => {
      const e = svgEl("text", { x: anchor === "start" ? padL : W, y: H + padB - 2, "font-size": 9, fill: "#5a6172", "text-anchor": anchor });
      e.textContent = new Date(points[i].time).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
      svg.appendChild(e);
    };
    t(0, "start");
    if (points.length > 1) t(points.length - 1, "end");
  }
  box.appendChild(svg);
  if (!known.length) {
    const p = document.createElement("p");
    p.className = "small";
    p.textContent = "no samples yet (one a minute)";
    box.appendChild(p);
  }
  return box;
}

// sinceText is " since 14:02" (with the day when it is not today), or ""
// when the console could not record when the state began.
function sinceText(since) {
  if (!since) return "";
  const d = new Date(since);
  const today = new Date().toDateString() === d.toDateString();
  return " since " + (today ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : d.toLocaleString());
}

async function loadVerdict() {
  const v = await api("GET", "/admin/verdict?hours=" + encodeURIComponent($("hv-hours").value));
  const st = $("hv-state");
  st.textContent = v.state + sinceText(v.since);
  st.dataset.state = v.state;
  st.className = "verdict v-" + v.state;
  const box = $("hv-areas");
  box.replaceChildren();
  v.areas.forEach((a) => {
    const div = document.createElement("div");
    div.className = "area v-" + a.state;
    div.dataset.area = a.area;
    div.dataset.state = a.state;
    const h = document.createElement("strong");
    h.textContent = `${areaNames[a.area] || a.area}: ${a.state}${sinceText(a.since)}`;
    div.appendChild(h);
    const p = document.createElement("span");
    p.textContent = a.detail + (a.firing.length ? " — past " + a.firing.join(", ") : "");
    div.appendChild(p);
    (a.items || []).forEach((it) => {
      const s = document.createElement("span");
      s.className = "item v-" + it.state;
      s.dataset.item = it.name;
      s.textContent = `${it.name}: ${it.state} (${it.detail})`;
      div.appendChild(s);
    });
    div.title = a.bounds.map(boundText).join("\n");
    box.appendChild(div);
  });
  const pts = v.history.points;
  const rate = (x) => x.toFixed(1) + "/s";
  $("hv-sparks").replaceChildren(
    sparkline("Consumer lag", pts, (p) => p.lag, (x) => String(Math.round(x))),
    sparkline("In (produced)", pts, (p) => p.in_per_second, rate),
    sparkline("Out (committed)", pts, (p) => p.out_per_second, rate),
    sparkline("Dead letters a minute", pts, (p) => p.dlq, (x) => String(Math.round(x))));
  $("hv-error").textContent = v.history_error ? "history: " + v.history_error : "";
  // The overview's in/out tile needs two of its answers; the history has
  // the rate at once.
  const lastRate = pts.filter((p) => p.in_per_second != null).pop();
  if (lastRate && $("ov-rate").textContent === "–") {
    $("ov-rate").textContent = `${lastRate.in_per_second.toFixed(1)} / ${lastRate.out_per_second.toFixed(1)}`;
  }
}

// ---- Kafka ---------------------------------------------------------------

async function loadKafka() {
  let k;
  try {
    k = await api("GET", "/admin/kafka");
  } catch (err) {
    if (err.status !== 503) throw err;
    $("kc-error").textContent = err.message; // no Kafka view: the rest of the console works
    return;
  }
  $("kc-error").textContent = k.error || "";
  $("kc-brokers").textContent = (k.brokers || []).map((b) => `${b.id} ${b.host}:${b.port}`).join(", ") || "–";
  const tb = $("kc-topics").querySelector("tbody");
  tb.replaceChildren();
  (k.topics || []).forEach((t) => {
    (t.partitions || []).forEach((p) => {
      const tr = document.createElement("tr");
      tr.dataset.topic = t.role;
      tr.dataset.partition = p.partition;
      cell(tr, `${t.name} (${t.role})`);
      cell(tr, p.partition);
      cell(tr, p.leader);
      cell(tr, (p.replicas || []).join(","));
      const isr = cell(tr, (p.isr || []).join(","));
      if ((p.isr || []).length < (p.replicas || []).length) isr.className = "state-warning";
      cell(tr, p.end_offset);
      cell(tr, p.committed_offset == null || p.committed_offset < 0 ? "none" : p.committed_offset);
      cell(tr, p.lag == null ? "" : p.lag);
      cell(tr, t.group);
      tb.appendChild(tr);
    });
    if (t.error) {
      const tr = document.createElement("tr");
      cell(tr, `${t.name}: ${t.error}`).colSpan = 9;
      tb.appendChild(tr);
    }
  });
}

let kbCursor = null;

async function browseTopic(more) {
  const q = new URLSearchParams();
  for (const [k, id] of [["user", "kb-user"], ["msgid", "kb-msgid"], ["since", "kb-since"]]) {
    const v = $(id).value.trim();
    if (v) q.set(k, v);
  }
  q.set("limit", "20");
  if (more && kbCursor != null) q.set("before", String(kbCursor));
  const page = await api("GET", "/admin/kafka/records?" + q.toString());
  const tb = $("kb-records").querySelector("tbody");
  if (!more) tb.replaceChildren();
  page.records.forEach((r) => {
    const tr = document.createElement("tr");
    tr.dataset.offset = r.offset;
    cell(tr, new Date(r.time).toLocaleString());
    cell(tr, `${r.partition}/${r.offset}`);
    cell(tr, r.upstream_msgid || "");
    cell(tr, r.msg_type || "");
    cell(tr, r.retry_from_dlq ? `retry ${r.retry_count}` : "");
    cell(tr, r.invalid ? "undecodable: " + r.invalid : r.preview);
    const td = cell(tr, "");
    if (r.message) {
      const d = document.createElement("details");
      const s = document.createElement("summary");
      s.textContent = "decoded";
      const pre = document.createElement("pre");
      pre.textContent = JSON.stringify(r.message, null, 2);
      d.append(s, pre);
      td.appendChild(d);
    }
    tb.appendChild(tr);
  });
  kbCursor = page.next_before;
  $("kb-more").hidden = page.next_before == null;
  $("kb-note").textContent = `${page.topic} partition ${page.partition}: read offsets ${page.from}–${page.to}` +
    (page.note ? " — " + page.note : "") + (page.records.length ? "" : " — no record of this user there");
}

document.addEventListener("DOMContentLoaded", () => {
  $("hv-hours").addEventListener("change", () => loadVerdict().catch(fail));
  $("refresh-kafka").addEventListener("click", () => loadKafka().catch(fail));
  $("kb-form").addEventListener("submit", (ev) => { ev.preventDefault(); browseTopic(false).catch(fail); });
  $("kb-more").addEventListener("click", () => browseTopic(true).catch(fail));
});
