// phalanx dashboard: routing, the runs table, run comparison, live updates (SSE).
// Schedules are drawn by schedule.js. Read-only: every request is a GET.
"use strict";
const $ = (sel, el = document) => el.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
  (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmt = (v, d = 3) => v == null ? "-" : Math.abs(v) < 5e-4 ? "0" :
  (Math.abs(v) >= 1000 || Number.isInteger(v) ? Math.round(v).toLocaleString("en")
                                              : Number(v).toPrecision(d));
const PX = {state: null, charts: [], cleanup: []};

async function api(path) {
  const r = await fetch(path, {cache: "no-store"});
  let body;
  try { body = await r.json(); } catch (e) { body = {error: `${path}: not JSON`}; }
  if (!r.ok && !body.error) body.error = `${path}: HTTP ${r.status}`;
  return body;
}

const HUES = new Map();
function hue(name) {  // a job's colour: the same name, the same colour, everywhere
  let c = HUES.get(name);
  if (c) return c;
  let h = 0;
  for (const ch of String(name)) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  c = `hsl(${h % 360}, 65%, ${45 + (h >> 9) % 20}%)`;
  HUES.set(name, c);
  return c;
}

function keepScroll(fn) {  // redraw without losing where the reader had scrolled
  const before = [...document.querySelectorAll(".scroll")].map((e) => e.scrollTop);
  const y = window.scrollY;
  fn();
  document.querySelectorAll(".scroll").forEach((e, i) => { e.scrollTop = before[i] || 0; });
  window.scrollTo(0, y);
}

function problems(list) {
  return (list || []).map((p) => `<div class="problem">${esc(p)}</div>`).join("");
}

const RUN_COLS = [
  ["id", "run", "t"], ["status", "status", "t"], ["strategy", "strategy", "t"],
  ["model", "model", "t"], ["data", "data", "t"], ["workers", "workers"],
  ["test_loss", "test loss"], ["test_accuracy", "test acc"], ["perplexity", "ppl"],
  ["samples_per_s", "samples/s"], ["tokens_per_s", "tokens/s"], ["startup_s", "start-up s"],
  ["bytes_per_sample", "bytes/sample"], ["staleness", "staleness"], ["steps", "steps"]];

function runCell(row, key) {
  const v = row[key];
  if (key === "status") return `<span class="status-${esc(v)}">${esc(v)}</span>`;
  if (key === "id") return esc(v) + problems(row.problems) +
    (row.note ? `<div class="problem">${esc(row.note)}</div>` : "");
  return typeof v === "number" ? fmt(v, key === "test_accuracy" ? 4 : 3) : esc(v ?? "-");
}

function runsTable(rows, selected) {
  const head = RUN_COLS.map(([k, label, t]) =>
    `<th class="${t || ""}" data-sort="${k}">${esc(label)}</th>`).join("");
  const body = rows.map((r) => `<tr data-run="${esc(r.id)}" data-status="${esc(r.status)}"` +
    `${selected.has(r.id) ? ' class="sel"' : ""}><td class="t"><input type="checkbox" ` +
    `${selected.has(r.id) ? "checked" : ""}></td>` + RUN_COLS.map(([k, , t]) =>
      `<td class="${t || ""}" data-col="${k}">${runCell(r, k)}</td>`).join("") + "</tr>");
  return `<table id="runs"><thead><tr><th></th>${head}</tr></thead>` +
    `<tbody>${body.join("")}</tbody></table>`;
}

const runsView = {sort: "id", desc: false, selected: new Set(), page: 0};
const PAGE = 250;  // rows drawn at once: the table's layout, not the data, is what costs

async function showRuns() {
  const idx = await api("/api/index");
  if (idx.error) { $("#view").innerHTML = `<p class="error">${esc(idx.error)}</p>`; return; }
  $("#root").textContent = idx.root;
  const rows = idx.runs.slice().sort((a, b) => {
    const x = a[runsView.sort], y = b[runsView.sort];
    const c = x == null ? 1 : y == null ? -1 : x < y ? -1 : x > y ? 1 : 0;
    return runsView.desc ? -c : c;
  });
  const n = (s) => rows.filter((r) => r.status === s).length;
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  runsView.page = Math.min(runsView.page, pages - 1);
  const first = runsView.page * PAGE, shown = rows.slice(first, first + PAGE);
  const pager = pages > 1 ? `<span id="pager">rows ${first + 1}-${first + shown.length} of ` +
    `${rows.length} <button id="prev">&lt;</button> <button id="next">&gt;</button></span>` : "";
  keepScroll(() => { $("#view").innerHTML = `<h2>Runs (${rows.length}: ${n("running")} running, ` +
    `${n("finished")} finished, ${n("failed")} failed, ${n("stopped")} stopped)</h2>` +
    `<div class="bar"><button id="compare">Compare selected</button>` +
    `<span class="muted">tick runs, then compare: figures and overlaid loss curves</span>` +
    `${pager}</div><div class="scroll">${runsTable(shown, runsView.selected)}</div>`; });
  if (pages > 1) {
    $("#prev").onclick = () => { runsView.page = Math.max(0, runsView.page - 1); showRuns(); };
    $("#next").onclick = () => {
      runsView.page = Math.min(pages - 1, runsView.page + 1);
      showRuns();
    };
  }
  $("#runs thead").onclick = (e) => {
    const k = e.target.dataset.sort;
    if (!k) return;
    runsView.desc = runsView.sort === k ? !runsView.desc : false;
    runsView.sort = k;
    showRuns();
  };
  $("#runs tbody").onchange = (e) => {
    const id = e.target.closest("tr").dataset.run;
    if (e.target.checked) runsView.selected.add(id); else runsView.selected.delete(id);
  };
  $("#runs tbody").ondblclick = (e) => {
    const tr = e.target.closest("tr");
    if (tr) location.hash = "compare=" + encodeURIComponent(tr.dataset.run);
  };
  $("#compare").onclick = () => {
    if (runsView.selected.size) location.hash = "compare=" +
      [...runsView.selected].map(encodeURIComponent).join(",");
  };
  PX.refresh = showRuns;
}

// ---------------------------------------------------------------- comparison
const AXES = [["step", 0, "step"], ["samples", 1, "samples"], ["wall", 2, "wall time (s)"]];

function lineChart(el, title, xLabel, series, opts = {}) {
  // series: [{label, x: [], y: [], color, dash, points}]: joined on one x axis
  const tables = series.map((s) => [s.x, s.y]);
  const data = tables.length ? uPlot.join(tables) : [[]];
  const u = new uPlot({
    title, width: opts.width || 420, height: opts.height || 260,
    scales: {x: {time: false, distr: opts.logx ? 3 : 1}},
    axes: [{label: xLabel}, {label: opts.yLabel || "loss"}],
    series: [{label: xLabel}, ...series.map((s) => ({
      label: s.label, stroke: s.color, width: 1.5, dash: s.dash, spanGaps: true,
      points: {show: !!s.points, size: 5}}))],
  }, data, el);
  el.dataset.points = series.reduce((a, s) => a + s.x.length, 0);
  el.dataset.series = series.length;
  PX.charts.push(u);
  return u;
}

async function showCompare(ids) {
  const runs = ids.map((id) => ({id, train: [], eval: [], row: null}));
  $("#view").innerHTML = `<h2>Compare ${runs.length} run(s)</h2><div id="figs"></div>` +
    `<div class="charts">${AXES.map(([k]) =>
      `<div class="chart" id="chart-${k}" data-points="0"></div>`).join("")}</div>`;
  async function update() {
    let grew = false;
    for (const r of runs) {
      const d = await api(`/api/run?id=${encodeURIComponent(r.id)}&train=${r.train.length}` +
                          `&eval=${r.eval.length}`);
      if (d.error) { r.error = d.error; continue; }
      grew = grew || d.train.length > 0 || d.eval.length > 0 || !r.row ||
             r.row.status !== d.row.status;
      r.row = d.row;
      r.train.push(...d.train);
      r.eval.push(...d.eval);
    }
    $("#figs").innerHTML = runsTable(runs.filter((r) => r.row).map((r) => r.row), new Set()) +
      runs.filter((r) => r.error).map((r) => `<p class="error">${esc(r.error)}</p>`).join("");
    if (!grew) return;
    PX.charts.forEach((u) => u.destroy());
    PX.charts = [];
    for (const [k, i, label] of AXES) {
      const el = $(`#chart-${k}`);
      el.innerHTML = "";
      const series = [];
      runs.forEach((r, n) => {
        const color = hue(r.id + n);
        const tr = r.train.filter((p) => p[i] != null && p[3] != null);
        const ev = r.eval.filter((p) => p[i] != null && p[3] != null);
        series.push({label: `${r.id} train`, x: tr.map((p) => p[i]), y: tr.map((p) => p[3]),
                     color});
        if (ev.length) series.push({label: `${r.id} test`, x: ev.map((p) => p[i]),
                                    y: ev.map((p) => p[3]), color, dash: [4, 4], points: 1});
      });
      lineChart(el, `loss against ${label}`, label, series);
    }
  }
  await update();
  PX.refresh = update;
}

// ---------------------------------------------------------------- routing, live
function route() {
  PX.charts.forEach((u) => u.destroy());
  PX.charts = [];
  PX.cleanup.forEach((f) => f());
  PX.cleanup = [];
  PX.refresh = null;
  document.body.dataset.ready = "0";
  const h = decodeURIComponent(location.hash.slice(1));
  const [name, arg] = h.includes("=") ? [h.slice(0, h.indexOf("=")), h.slice(h.indexOf("=") + 1)]
                                       : [h || "runs", ""];
  for (const a of document.querySelectorAll("nav a")) a.classList.remove("on");
  const tab = ["schedules", "schedule", "jct"].includes(name) ? "schedules" : "runs";
  $(`#nav-${tab}`).classList.add("on");
  const views = {
    runs: () => showRuns(),
    compare: () => showCompare(arg.split(",").filter(Boolean)),
    schedules: () => PXS.showSchedules(),
    schedule: () => PXS.showSchedule(arg),
    jct: () => PXS.showJct(arg.split("|")),
  };
  const view = views[name] || views.runs;
  Promise.resolve(view()).catch((e) => {
    $("#view").innerHTML = `<p class="error">could not draw this view: ${esc(e)}</p>`;
  }).finally(() => {
    // ready once the view is painted: a timeout queued from the next animation frame runs
    // after that frame's layout and paint (bench/dashboard.py times navigation to here)
    requestAnimationFrame(() => setTimeout(() => {
      window.PXReadyAt = performance.now();
      document.body.dataset.ready = "1";
      if (!PX.listening) { PX.listening = true; listen(); }  // after the first view is drawn
    }, 0));
  });
}

function listen() {
  let busy = false, again = false;
  const refresh = async () => {
    if (busy) { again = true; return; }
    busy = true;
    try { if (PX.refresh) await PX.refresh(); } finally { busy = false; }
    if (again) { again = false; refresh(); }
  };
  const src = new EventSource("/api/stream");
  src.onopen = () => $("#live").classList.add("on");
  src.onerror = () => $("#live").classList.remove("on");  // it reconnects by itself
  let first = true;
  src.onmessage = () => { if (first) { first = false; return; } refresh(); };
}

window.PX = PX;
window.PXU = {$, esc, fmt, api, hue, problems, lineChart, keepScroll};
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);
