// disque-py dashboard: one page, no dependencies. It polls the node's JSON API (/api/...)
// every POLL_MS, keeps HISTORY samples for the charts (plain SVG), and runs actions through
// POST /api/... (the node runs them with its own command code). Names and bodies come from
// users: they are only ever set as textContent, never as HTML.
"use strict";

const POLL_MS = Number(new URLSearchParams(location.search).get("interval")) || 2000;
const HISTORY = 150; // samples kept per series (5 minutes at the default interval)
const COLORS = ["#2f6fdb", "#1f9d55", "#d64545", "#c98a00", "#8e44ad", "#16a2b8"];

const state = {
  prevQueues: null,     // last /api/queues sample, for the per-queue rates
  prevTotals: null,     // last /api/node totals, for the added / acked rates
  rates: { added: [], acked: [] },
  depth: {},            // queue name -> [[t, len], ...]
  queues: [],
  queueCount: 0,
  sort: { key: "len", asc: false },
  route: null,
  timer: null,
};

// ------------------------------------------------------------------ helpers
function $(sel) { return document.querySelector(sel); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function human(bytes) {
  if (bytes == null) return "–";
  const units = ["B", "K", "M", "G", "T"];
  let i = 0;
  while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  return (i ? bytes.toFixed(1) : bytes) + units[i];
}

function fmt(n, digits) {
  if (n == null) return "–";
  return typeof n === "number" ? n.toFixed(digits || 0) : String(n);
}

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  // location.origin, not a relative URL: opened as user:password@host the page's own
  // URL holds credentials, and fetch() refuses URLs that do (the browser keeps the login)
  const resp = await fetch(location.origin + path, opts);
  const data = await resp.json().catch(() => ({ error: resp.statusText }));
  if (!resp.ok) throw new Error(data.error || resp.statusText);
  return data;
}

function say(text, isError) {
  const m = $("#message");
  m.textContent = text;
  m.className = "message" + (isError ? " error" : "");
  clearTimeout(say.timer);
  say.timer = setTimeout(() => m.classList.add("hidden"), 4000);
}

function push(series, t, v) {
  series.push([t, v]);
  if (series.length > HISTORY) series.shift();
}

// ------------------------------------------------------------------ charts (plain SVG)
function lineChart(svg, series) {
  const NS = "http://www.w3.org/2000/svg";
  const [, , W, H] = svg.getAttribute("viewBox").split(" ").map(Number);
  const pad = { l: 48, r: 8, t: 26, b: 22 };  // the legend goes above the plot
  while (svg.firstChild) svg.firstChild.remove();
  const all = series.flatMap((s) => s.points);
  svg.dataset.samples = String(Math.max(0, ...series.map((s) => s.points.length)));
  if (!all.length) return;
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const vmax = Math.max(1, ...all.map((p) => p[1]));
  const x = (t) => pad.l + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - pad.l - pad.r);
  const y = (v) => H - pad.b - (v / vmax) * (H - pad.t - pad.b);
  const line = (x1, y1, x2, y2) => {
    const l = document.createElementNS(NS, "line");
    for (const [k, v] of Object.entries({ x1, y1, x2, y2, class: "axis" })) l.setAttribute(k, v);
    svg.append(l);
  };
  const text = (tx, ty, s, anchor) => {
    const n = document.createElementNS(NS, "text");
    n.setAttribute("x", tx); n.setAttribute("y", ty);
    if (anchor) n.setAttribute("text-anchor", anchor);
    n.textContent = s;
    svg.append(n);
  };
  line(pad.l, pad.t, pad.l, H - pad.b);
  line(pad.l, H - pad.b, W - pad.r, H - pad.b);
  line(pad.l, y(vmax), W - pad.r, y(vmax));
  text(pad.l - 4, y(vmax) + 4, vmax >= 100 ? vmax.toFixed(0) : vmax.toFixed(1), "end");
  text(pad.l - 4, H - pad.b + 4, "0", "end");
  text(W - pad.r, H - 6, `${Math.round((t1 - t0))} s`, "end");
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const pl = document.createElementNS(NS, "polyline");
    pl.setAttribute("points", s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
    pl.setAttribute("stroke", color);
    pl.dataset.series = s.name;
    svg.append(pl);
    const lx = pad.l + i * 110;
    const swatch = document.createElementNS(NS, "rect");
    for (const [k, v] of Object.entries({ x: lx, y: 4, width: 10, height: 10, fill: color }))
      swatch.setAttribute(k, v);
    svg.append(swatch);
    text(lx + 14, 13, s.name.length > 14 ? s.name.slice(0, 13) + "…" : s.name);
  });
}

// ------------------------------------------------------------------ cluster view
function renderNodes(data) {
  const tbody = $("#nodes tbody");
  tbody.replaceChildren(...data.nodes.map((n) => {
    const info = n.info || {};
    const flags = el("td");
    n.flags.forEach((f, i) => flags.append(el("span", { class: "flag-" + f, text: (i ? "," : "") + f })));
    return el("tr", { "data-node": n.id },
      el("td", { class: "id", title: n.id, text: n.id.slice(0, 8) + (n.id === data.myself ? " (this)" : "") }),
      el("td", { text: `${n.ip}:${n.port}` }),
      flags,
      el("td", { text: n.priority }),
      el("td", { class: "link-" + n.link, text: n.link }),
      el("td", { class: "num", text: info.error ? "?" : human(info.used_memory) }),
      el("td", { class: "num", text: info.error ? "?" : fmt(info.registered_jobs) }),
      el("td", { class: "num ondisk", text: info.error ? "?" : fmt(info.overflow_jobs || 0) }),
      el("td", { class: "num", text: info.error ? "?" : fmt(info.registered_queues) }),
      el("td", { class: "num", text: info.error ? "?" : fmt(info.instantaneous_ops_per_sec) }),
      el("td", { class: "num", title: info.error || "", text: info.error ? "unreachable" : fmt(info.connected_clients) }));
  }));
}

function queueRates(queues, t) {
  const prev = state.prevQueues;
  const byName = {};
  if (prev) for (const q of prev.queues) byName[q.name] = q;
  for (const q of queues) {
    const p = byName[q.name];
    const dt = prev ? t - prev.t : 0;
    q.rate_in = p && dt > 0 ? Math.max(0, (q["jobs-in"] - p["jobs-in"]) / dt) : 0;
    q.rate_out = p && dt > 0 ? Math.max(0, (q["jobs-out"] - p["jobs-out"]) / dt) : 0;
  }
  state.prevQueues = { t, queues };
}

function renderQueues() {
  const { key, asc } = state.sort;
  const rows = [...state.queues].sort((a, b) => {
    const va = a[key], vb = b[key];
    const c = typeof va === "string" ? va.localeCompare(vb) : va - vb;
    return asc ? c : -c;
  });
  $("#queue-count").textContent = rows.length < state.queueCount
    ? `(the ${rows.length} busiest of ${state.queueCount})` : `(${rows.length})`;
  document.querySelectorAll("#queues th").forEach((th) => {
    th.classList.toggle("sorted", th.dataset.key === key);
    th.classList.toggle("asc", th.dataset.key === key && asc);
  });
  $("#queues tbody").replaceChildren(...rows.map((q) => el("tr", { "data-queue": q.name },
    el("td", {}, el("a", { href: "#/queue/" + encodeURIComponent(q.name), text: q.name })),
    el("td", { class: "num len", text: q.len }),
    el("td", { class: "num", text: q.active }),
    el("td", { class: "num", text: q.blocked }),
    el("td", { class: "num", text: fmt(q.oldest_age, 1) }),
    el("td", { class: "num", text: fmt(q.rate_in, 1) }),
    el("td", { class: "num", text: fmt(q.rate_out, 1) }),
    el("td", { class: "num", text: q.acked }),
    el("td", { class: "num", text: q.nacked }),
    el("td", { class: "pause", text: q.pause }))));
}

function renderCharts() {
  lineChart($("#chart-rates"), [
    { name: "added/s", points: state.rates.added },
    { name: "acked/s", points: state.rates.acked },
  ]);
  const top = [...state.queues].sort((a, b) => b.len - a.len).slice(0, 5).map((q) => q.name);
  lineChart($("#chart-depth"), top.map((name) => ({ name, points: state.depth[name] || [] })));
}

// ------------------------------------------------------------------ queue view
async function renderQueue(name) {
  const data = await api("/api/queues/" + encodeURIComponent(name) + "?limit=200");
  $("#queue-name").textContent = name;
  const stat = data.stat || {};
  $("#queue-stat").replaceChildren(...Object.entries(stat).flatMap(([k, v]) =>
    [el("dt", { text: k }), el("dd", { "data-field": k, text: Array.isArray(v) ? v.join(", ") || "–" : v })]));
  document.querySelectorAll("[data-pause]").forEach((b) =>
    b.classList.toggle("active", b.dataset.pause === (stat.pause || "none")));
  $("#jobs-note").textContent = `(${data.jobs.length}${data.complete ? "" : "+"} shown)`;
  const now = Date.now();
  data.jobs.sort((a, b) => a.ctime - b.ctime);  // oldest first, as the queue serves them
  $("#jobs tbody").replaceChildren(...data.jobs.map((j) => el("tr", { "data-job": j.id },
    el("td", { class: "id" }, el("a", { href: "#/job/" + encodeURIComponent(j.id), text: j.id })),
    el("td", { class: "state-" + j.state, text: j.state }),
    el("td", { class: "num", text: j.nacks }),
    el("td", { class: "num", text: j["additional-deliveries"] }),
    el("td", { class: "num", text: fmt((now - j.ctime / 1e6) / 1000, 0) }),
    el("td", { class: "num", text: j["next-requeue-within"] == null ? "–" : fmt(j["next-requeue-within"] / 1000, 0) }),
    el("td", {}, ...["ack", "nack", "enqueue", "deljob"].map((a) =>
      el("button", { "data-action": a, onclick: () => jobAction(a, j.id) }, a))))));
  lineChart($("#chart-queue"), [{ name, points: state.depth[name] || [] }]);
}

// ------------------------------------------------------------------ job view
async function renderJob(id) {
  const job = await api("/api/jobs/" + encodeURIComponent(id));
  $("#job-id").textContent = id;
  $("#job-back").href = job.queue ? "#/queue/" + encodeURIComponent(job.queue) : "#/";
  $("#job-show").replaceChildren(...Object.entries(job).filter(([k]) => k !== "body").flatMap(([k, v]) =>
    [el("dt", { text: k }), el("dd", { "data-field": k, text: Array.isArray(v) ? v.join(", ") || "–" : (v == null ? "–" : v) })]));
  $("#job-body").textContent = job.body == null ? "" : job.body;
}

async function jobAction(action, id) {
  try {
    const r = await api("/api/jobs/" + action, { ids: [id] });
    say(`${r.command} ${id}: ${r.count}`);
  } catch (e) { say(`${action}: ${e.message}`, true); }
  refresh();
}

// ------------------------------------------------------------------ polling and routing
function route() {
  const h = location.hash.replace(/^#\/?/, "");
  const [kind, ...rest] = h.split("/");
  const arg = decodeURIComponent(rest.join("/"));
  if (kind === "queue" && arg) return { view: "queue", arg };
  if (kind === "job" && arg) return { view: "job", arg };
  return { view: "cluster" };
}

async function refresh() {
  clearTimeout(state.timer);
  const r = route();
  for (const v of ["cluster", "queue", "job"]) $("#view-" + v).classList.toggle("hidden", v !== r.view);
  try {
    const [node, queues] = await Promise.all([api("/api/node"), api("/api/queues")]);
    const t = node.time;
    $("#me").textContent = `${node.myself.id.slice(0, 8)} @ ${node.myself.ip}:${node.myself.port}`;
    if (state.prevTotals) {
      const dt = t - state.prevTotals.t;
      if (dt > 0) {
        push(state.rates.added, t, Math.max(0, (node.totals.added - state.prevTotals.added) / dt));
        push(state.rates.acked, t, Math.max(0, (node.totals.acked - state.prevTotals.acked) / dt));
      }
    }
    state.prevTotals = { t, added: node.totals.added, acked: node.totals.acked };
    queueRates(queues.queues, t);
    state.queues = queues.queues;
    state.queueCount = queues.count;
    for (const q of queues.queues) push(state.depth[q.name] || (state.depth[q.name] = []), t, q.len);
    if (r.view === "cluster") {
      renderNodes(await api("/api/cluster"));
      renderQueues();
      renderCharts();
    } else if (r.view === "queue") {
      await renderQueue(r.arg);
    } else {
      await renderJob(r.arg);
    }
    $("#status").textContent = "updated " + new Date().toLocaleTimeString();
    $("#status").classList.remove("error");
  } catch (e) {
    $("#status").textContent = "error: " + e.message;
    $("#status").classList.add("error");
  }
  state.timer = setTimeout(refresh, POLL_MS);
}

function init() {
  document.querySelectorAll("#queues th").forEach((th) => th.addEventListener("click", () => {
    const key = th.dataset.key;
    state.sort = { key, asc: state.sort.key === key ? !state.sort.asc : key === "name" };
    renderQueues();
  }));
  document.querySelectorAll("[data-pause]").forEach((b) => b.addEventListener("click", async () => {
    const name = route().arg;
    try {
      const r = await api("/api/queues/" + encodeURIComponent(name) + "/pause",
        { state: b.dataset.pause, bcast: $("#pause-bcast").checked });
      say(`PAUSE ${name}: ${r.pause}`);
    } catch (e) { say(`pause: ${e.message}`, true); }
    refresh();
  }));
  document.querySelectorAll("#job-actions [data-action]").forEach((b) =>
    b.addEventListener("click", () => jobAction(b.dataset.action, route().arg)));
  window.addEventListener("hashchange", () => { $("#message").classList.add("hidden"); refresh(); });
  refresh();
}

document.addEventListener("DOMContentLoaded", init);
