// fairserve dashboard: polls GET /admin/dashboard with the admin key (an Authorization header, never a URL) and
// draws what it returns. Plain DOM and SVG; nothing is loaded from elsewhere.
"use strict";

const POLL_MS = 1000;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
                "#bcbd22"];
const SVG = "http://www.w3.org/2000/svg";
const W = 760, H = 260, PAD = { left: 56, right: 12, top: 10, bottom: 26 };

let key = null;          // the admin key, in this tab's memory only
let timer = null;
const colorOf = new Map();

const $ = (id) => document.getElementById(id);

function fmt(x, digits = 1) {
  if (x === null || x === undefined || !Number.isFinite(x)) return "–";
  return x.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

function setStatus(text, bad = false) {
  $("status").textContent = text;
  $("status").classList.toggle("bad", bad);
}

function signOut(message) {
  key = null;
  clearTimeout(timer);
  $("board").hidden = true;
  $("forget").hidden = true;
  $("policy").hidden = true;
  $("login").hidden = false;
  $("error").hidden = !message;
  $("error").textContent = message || "";
  setStatus(message ? "refused" : "enter the admin key to see the tenants", Boolean(message));
  $("key").focus();
}

async function poll() {
  clearTimeout(timer);
  if (key === null) return;
  let r;
  try {
    r = await fetch("/admin/dashboard", { headers: { Authorization: "Bearer " + key }, cache: "no-store" });
  } catch (e) {
    setStatus("cannot reach the server (" + e.message + "); retrying", true);
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  if (r.status === 401 || r.status === 403) {
    const body = await r.json().catch(() => ({}));
    const why = body.error && body.error.message ? body.error.message : "HTTP " + r.status;
    signOut("Refused: " + why);
    return;
  }
  if (!r.ok) {
    setStatus("the server answered HTTP " + r.status + "; retrying", true);
  } else {
    render(await r.json());
    setStatus("live · updated " + new Date().toLocaleTimeString());
  }
  timer = setTimeout(poll, POLL_MS);
}

function color(tenant) {
  if (!colorOf.has(tenant)) colorOf.set(tenant, COLORS[colorOf.size % COLORS.length]);
  return colorOf.get(tenant);
}

function cell(row, text, field) {
  const td = document.createElement("td");
  td.textContent = text;
  if (field) td.dataset.field = field;
  row.appendChild(td);
  return td;
}

function render(data) {
  $("login").hidden = true;
  $("error").hidden = true;
  $("board").hidden = false;
  $("forget").hidden = false;
  $("policy").hidden = false;
  $("policy").textContent = "policy: " + data.policy;
  data.tenants.forEach((t) => color(t.name));

  const body = $("tenants").tBodies[0];
  body.replaceChildren(...data.tenants.map((t) => {
    const tr = document.createElement("tr");
    tr.dataset.tenant = t.name;
    const name = cell(tr, "", "name");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = color(t.name);
    name.append(sw, t.name);
    cell(tr, fmt(t.weight, 3), "weight");
    cell(tr, fmt(t.rate), "rate");
    cell(tr, fmt(t.service, 0), "service");
    cell(tr, fmt(t.counter), "counter");
    cell(tr, String(t.queue_length), "queue_length");
    cell(tr, String(t.in_flight), "in_flight");
    return tr;
  }));

  const spread = data.backlogged.length >= 2;
  $("jain").textContent = spread ? data.jain.toFixed(3) : "–";
  $("spread").textContent = spread ? fmt(data.counter_spread) : "–";
  $("backlogged").textContent = data.backlogged.length ? data.backlogged.join(", ") : "none";

  $("tree-card").hidden = !data.tree;
  if (data.tree) renderTree(data.tree);

  renderQuotas(data.quotas);
  renderRates(data.rate_caps);
  renderKeys(data.keys);

  $("backends-card").hidden = data.backends === null;
  if (data.backends !== null) {
    $("backends").tBodies[0].replaceChildren(...data.backends.map((b) => {
      const tr = document.createElement("tr");
      tr.dataset.backend = b.url;
      cell(tr, b.url, "url");
      cell(tr, b.healthy ? "healthy" : "unreachable", "healthy").className = b.healthy ? "up" : "down";
      cell(tr, b.in_flight_requests + " / " + b.limit_requests + (b.adaptive ? " (adaptive)" : ""), "in_flight");
      cell(tr, String(b.in_flight_tokens), "tokens");
      return tr;
    }));
  }
  $("window").textContent = "(service per second, over " + data.history.window_s + " s windows; up to the last " +
    Math.round(data.history.span_s / 60) + " minutes)";
  chart(data.history, data.tenants.map((t) => t.name));
}

function renderLimits(name, doc, nodes, measures, fill) {
  // a card of limits (quotas, rate caps), hidden while there are none: one row per node and measure it limits,
  // `fill(tr, path, node, m)` writing the row's cells
  $(name + "-card").hidden = nodes.length === 0;
  if (nodes.length === 0) return;
  $(name + "-note").textContent = doc.estimated ? "(this replica's estimate: Redis cannot be reached)" : "";
  const rows = [];
  for (const [path, node] of nodes) {
    for (const measure of measures) {
      const m = node[measure];
      if (!m) continue;
      const tr = document.createElement("tr");
      tr.dataset.node = path;
      tr.dataset.measure = measure;
      fill(tr, path, node, measure, m);
      rows.push(tr);
    }
  }
  $(name).tBodies[0].replaceChildren(...rows);
}

function renderQuotas(quotas) {
  // each node's quota: one row per measure (tokens, service) in the current UTC window
  const nodes = quotas ? Object.entries(quotas.quotas) : [];
  renderLimits("quotas", quotas, nodes, ["tokens", "service"], (tr, path, q, measure, m) => {
    cell(tr, path + " (per " + q.per + ")", "name");
    cell(tr, measure, "measure");
    cell(tr, fmt(m.used, 0), "used");
    cell(tr, fmt(m.held, 0), "held");
    cell(tr, fmt(m.remaining, 0), "remaining").className = m.remaining > 0 ? "up" : "down";
    cell(tr, fmt(m.limit, 0), "limit");
    cell(tr, m.resets_at.replace("T", " ").replace("+00:00", ""), "resets_at");
  });
}

function renderRates(rates) {
  // each node's per-minute caps (GET /admin/rates): one row per measure (requests, tokens)
  const nodes = rates ? Object.entries(rates.rates) : [];
  renderLimits("rates", rates, nodes, ["requests", "tokens"], (tr, path, caps, measure, m) => {
    cell(tr, path, "name");
    cell(tr, measure, "measure");
    cell(tr, fmt(m.used, 0), "used");
    cell(tr, fmt(m.remaining, 0), "remaining").className = m.remaining > 0 ? "up" : "down";
    cell(tr, fmt(m.limit, 0), "limit");
    cell(tr, m.resets_at.replace("T", " ").replace("+00:00", ""), "resets_at");
  });
}

function when(iso) {
  return iso ? iso.replace("T", " ").replace("+00:00", "").replace(/\.\d+$/, "") : "–";
}

function renderKeys(keys) {
  // the keys made through the API (GET /admin/keys): never a key, its prefix only
  const rows = keys ? keys.keys : [];
  $("keys-card").hidden = rows.length === 0;
  if (rows.length === 0) return;
  $("keys-note").textContent = "(kept in " + (keys.store === "redis" ? "the shared state, Redis" : "the keys file") + ")";
  $("keys").tBodies[0].replaceChildren(...rows.map((k) => {
    const tr = document.createElement("tr");
    tr.dataset.key = k.id;
    cell(tr, k.name || k.id, "name");
    cell(tr, k.prefix + "…", "prefix");
    cell(tr, k.tenant, "tenant");
    cell(tr, when(k.created_at), "created_at");
    cell(tr, when(k.expires_at), "expires_at");
    cell(tr, when(k.last_used_at), "last_used_at");
    const state = k.orphaned ? "tenant removed" : k.expired ? "expired" : "active";
    cell(tr, state, "state").className = state === "active" ? "up" : "down";
    return tr;
  }));
}

function renderTree(top) {
  const rows = [], paths = [];
  const walk = (nodes, depth) => {
    for (const n of nodes) {
      const tr = document.createElement("tr");
      tr.dataset.node = n.path;
      tr.className = n.kind;
      const name = cell(tr, "", "name");
      name.style.paddingLeft = (0.4 + 1.4 * depth) + "em";
      if (n.kind === "tenant") {
        const sw = document.createElement("span");
        sw.className = "swatch";
        sw.style.background = color(n.path);
        name.append(sw);
      }
      name.append(n.name + (n.kind === "group" ? "/" : ""));
      cell(tr, fmt(n.weight, 3), "weight");
      cell(tr, String(n.priority), "priority");
      cell(tr, (100 * n.share).toFixed(1) + "%", "share");
      cell(tr, fmt(n.rate), "rate");
      cell(tr, fmt(n.counter), "counter");
      cell(tr, String(n.queue_length), "queue_length");
      cell(tr, String(n.in_flight), "in_flight");
      rows.push(tr);
      paths.push(n.path);
      walk(n.children, depth + 1);
    }
  };
  walk(top, 0);
  $("tree").tBodies[0].replaceChildren(...rows);
  const list = $("node-paths");
  if (list.children.length !== paths.length) {
    list.replaceChildren(...paths.map((p) => { const o = document.createElement("option"); o.value = p; return o; }));
  }
}

async function reweight(ev) {
  ev.preventDefault();
  const path = $("node-path").value.trim(), weight = Number($("node-weight").value);
  if (!path || key === null) return;
  const url = "/admin/nodes/" + path.split("/").map(encodeURIComponent).join("/") + "/weight";
  let r;
  try {
    r = await fetch(url, {
      method: "PUT",
      headers: { Authorization: "Bearer " + key, "Content-Type": "application/json" },
      body: JSON.stringify({ weight }),
    });
  } catch (e) {
    $("reweight-status").textContent = "cannot reach the server: " + e.message;
    return;
  }
  const body = await r.json().catch(() => ({}));
  $("reweight-status").textContent = r.ok ? path + ": weight " + fmt(body.weight, 3)
    : "refused: " + (body.error && body.error.message ? body.error.message : "HTTP " + r.status);
  poll();
}

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function niceMax(x) {
  if (!(x > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

function chart(history, tenants) {
  const svg = $("chart");
  // the x axis grows with the history, from one minute to the whole span
  const oldest = history.t.length ? -history.t[0] : 0;
  const span = Math.min(history.span_s, Math.max(60, Math.ceil(oldest / 60) * 60));
  const step = span <= 60 ? 15 : span <= 180 ? 30 : 60;
  let top = 0;
  for (const t of tenants) for (const v of history.rates[t] || []) if (v !== null && v > top) top = v;
  top = niceMax(top * 1.05);
  const x = (s) => PAD.left + (W - PAD.left - PAD.right) * (1 + s / span);
  const y = (v) => H - PAD.bottom - (H - PAD.top - PAD.bottom) * (v / top);
  const parts = [];
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    parts.push(el("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v) }));
    parts.push(el("text", { class: "axis", x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
  }
  for (let s = 0; s <= span; s += step) {
    const label = s === 0 ? "now" : s % 60 === 0 ? "−" + s / 60 + " min" : "−" + s + " s";
    parts.push(el("text", { class: "axis", x: x(-s), y: H - 8, "text-anchor": "middle" }, label));
  }
  for (const t of tenants) {
    const values = history.rates[t] || [];
    let d = "", pen = "M";
    history.t.forEach((s, i) => {
      const v = values[i];
      if (v === null || v === undefined || s < -span) { pen = "M"; return; }
      d += pen + x(s).toFixed(1) + "," + y(v).toFixed(1) + " ";
      pen = "L";
    });
    if (d) parts.push(el("path", { class: "series", d, stroke: color(t), "data-tenant": t }));
  }
  svg.replaceChildren(...parts);
  $("legend").replaceChildren(...tenants.map((t) => {
    const span = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = color(t);
    span.append(sw, t);
    return span;
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    key = $("key").value.trim();
    $("key").value = "";
    if (key) {
      $("error").hidden = true;     // a refusal shown belongs to the key tried before
      setStatus("connecting…");
      poll();
    }
  });
  $("forget").addEventListener("click", () => signOut(""));
  $("reweight").addEventListener("submit", reweight);
  $("key").focus();
});
