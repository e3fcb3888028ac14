// phalanx dashboard: schedules: the list, the cluster map, the jobs, the Gantt timeline and
// two schedules' JCT distributions.
"use strict";
(() => {
const {$, esc, fmt, api, hue, problems, lineChart, keepScroll} = window.PXU;
const PX = window.PX;

async function showSchedules() {
  const idx = await api("/api/index");
  if (idx.error) { $("#view").innerHTML = `<p class="error">${esc(idx.error)}</p>`; return; }
  $("#root").textContent = idx.root;
  const opts = idx.schedules.map((s) => `<option>${esc(s.id)}</option>`).join("");
  const rows = idx.schedules.map((s) => `<tr data-schedule="${esc(s.id)}">` +
    `<td class="t"><a href="#schedule=${encodeURIComponent(s.id)}">${esc(s.id)}</a>` +
    `${problems(s.problems)}</td><td class="t">${esc(s.kind)}</td>` +
    `<td class="t">${esc(s.status)}</td><td class="t">${esc(s.policy ?? "-")}` +
    ` / ${esc(s.placement ?? "-")}</td><td class="t">${esc(s.cluster)}</td>` +
    `<td>${s.jobs}</td><td>${s.running}</td><td>${fmt(s.mean_jct_s)}</td></tr>`).join("");
  $("#view").innerHTML = `<h2>Schedules (${idx.schedules.length})</h2>` +
    `<table id="schedules"><thead><tr><th class="t">schedule</th><th class="t">kind</th>` +
    `<th class="t">status</th><th class="t">policy / placement</th><th class="t">cluster</th>` +
    `<th>jobs</th><th>running</th><th>mean JCT s</th></tr></thead><tbody>${rows}</tbody>` +
    `</table><h2>JCT distributions</h2><div class="bar">` +
    `<select id="jct-a">${opts}</select> against <select id="jct-b">${opts}</select>` +
    `<button id="jct-go">Compare</button></div>`;
  if (idx.schedules.length > 1) $("#jct-b").selectedIndex = 1;
  $("#jct-go").onclick = () => {
    location.hash = "jct=" + encodeURIComponent($("#jct-a").value + "|" + $("#jct-b").value);
  };
  PX.refresh = showSchedules;
}

function segments(d) {
  // [{job, from, to, devs, kind}] from each job's placements: a placement lasts until its
  // recorded stop; without one (files written before stops were), until the next
  // placement, the job's end, when a live job now waiting was stopped, or the clock.
  const J = d.jobs, out = [], now = d.clock ?? Infinity;
  for (let i = 0; i < J.name.length; i++) {
    const ps = J.placements[i], stops = (J.stops && J.stops[i]) || [];
    for (let k = 0; k < ps.length; k++) {
      const [t, devs] = ps[k];
      const last = J.stopped && J.stopped[i] != null ? J.stopped[i] : (J.end[i] ?? now);
      const next = k < stops.length && stops[k] >= t ? stops[k] :
        k + 1 < ps.length ? ps[k + 1][0] : last;
      const prev = k ? ps[k - 1][1] : null;
      const kind = !prev ? "start" : prev.length !== devs.length ? "resize" :
        prev.join() !== devs.join() ? "move" : "resume";
      out.push({job: i, from: t, to: next, devs, kind});
    }
  }
  return out;
}
PX.segments = segments;  // the timeline's bars, for the browser tests to check

function holders(d, segs, t) {
  const held = new Map();
  if (d.kind === "live" && !d.finished && t == null) {
    const J = d.jobs;
    for (let i = 0; i < J.name.length; i++) {
      const ps = J.placements[i];
      if (J.status[i] === "running" && ps.length) for (const dev of ps[ps.length - 1][1])
        held.set(dev, J.name[i]);
    }
    return held;
  }
  for (const s of segs) if (s.from <= t && t < s.to) for (const dev of s.devs)
    held.set(dev, d.jobs.name[s.job]);
  return held;
}

function clusterMap(d, held) {
  const c = d.cluster, big = c.devices > 256, lostSet = new Set(d.lost || []);
  let html = `<div class="${big ? "big" : ""}" id="cluster">`;
  for (const z of c.zones) {
    html += `<div class="zone"><div class="label">${esc(z.name)}</div>`;
    for (const r of z.racks) {
      html += `<div class="rack"><div class="label">${esc(r.name)}</div>`;
      for (const s of r.servers) {
        const lost = lostSet.has(s.name);
        html += `<div class="server${lost ? " lost" : ""}" title="${esc(s.name)} ` +
          `(${esc(s.type)})${lost ? ": lost" : ""}">` +
          `<div class="label">${esc(s.name)} ${esc(s.type)}${lost ? " (lost)" : ""}</div>`;
        for (let k = 0; k < s.n; k++) {
          const dev = s.first + k, job = held.get(dev);
          const what = lost ? ": lost" + (job ? " (" + esc(job) + ")" : "") :
            job ? ": " + esc(job) : ": free";
          html += `<span class="dev${lost ? " lost" : ""}" data-dev="${dev}"` +
            ` data-job="${esc(job ?? "")}" title="device ${dev} (${esc(s.type)})${what}"` +
            `${job && !lost ? ` style="background:${hue(job)}"` : ""}>${esc(s.type)}</span>`;
        }
        html += "</div>";
      }
      html += "</div>";
    }
    html += "</div>";
  }
  return html + "</div>";
}

function statusAt(d, held, t) {
  // a simulated or ended schedule at time t: arrived or not, waiting, running, ended
  const J = d.jobs, on = new Set(held.values());
  return J.name.map((name, i) => J.submit[i] != null && J.submit[i] > t ? "not arrived" :
    J.end[i] != null && J.end[i] <= t ? J.status[i] : on.has(name) ? "running" :
    /^rejected/.test(J.status[i]) ? J.status[i] : "waiting");
}

function jobTable(d, title, pick, status, limit = 100) {
  const J = d.jobs, idx = [];
  for (let i = 0; i < J.name.length; i++) if (pick(status[i])) idx.push(i);
  const rows = idx.slice(0, limit).map((i) => `<tr data-job="${esc(J.name[i])}">` +
    `<td class="t"><span class="swatch" style="background:${hue(J.name[i])}"></span>` +
    `${esc(J.name[i])}</td><td>${fmt(J.gpus[i])}</td><td class="t">${esc(status[i])}</td>` +
    `<td>${fmt(J.submit[i])}</td><td>${fmt(J.start[i])}</td><td>${fmt(J.end[i])}</td>` +
    `<td>${fmt(J.delay[i])}</td><td>${fmt(J.jct[i])}</td><td>${fmt(J.preemptions[i])}</td>` +
    `<td>${fmt(J.restarts[i])}</td></tr>`).join("");
  const more = idx.length > limit ? `<div class="muted">${idx.length - limit} more</div>` : "";
  return `<div><h2>${esc(title)} (${idx.length})</h2><div class="scroll"><table>` +
    `<thead><tr><th class="t">job</th><th>gpus</th><th class="t">status</th><th>submit</th>` +
    `<th>start</th><th>end</th><th>queue delay</th><th>JCT</th><th>preempted</th>` +
    `<th>restarts</th></tr></thead><tbody>${rows}</tbody></table></div>${more}</div>`;
}

const word = (r, g, b) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;  // canvas RGBA
const hex = (c) => word(...[1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));

const RGBA = new Map();
function jobRgba(name) {  // hue(name)'s colour, computed (a canvas read per job is slow)
  let v = RGBA.get(name);
  if (v !== undefined) return v;
  const [h, sat, light] = hue(name).match(/[\d.]+/g).map(Number);
  const s = sat / 100, l = light / 100, k = (n) => (n + h / 30) % 12;
  const f = (n) => l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(k(n) - 3, 9 - k(n), 1));
  v = word(...[0, 8, 4].map((n) => Math.round(255 * f(n))));
  RGBA.set(name, v);
  return v;
}

function gantt(canvas, d, segs) {
  // drawn into a pixel buffer: 10,000 jobs' 25,000 bars as fillRect calls, each parsing its
  // colour, took 0.3-0.7 s on a loaded machine
  const J = d.jobs, n = J.name.length;
  const order = [...Array(n).keys()].sort((a, b) => (J.submit[a] ?? 0) - (J.submit[b] ?? 0));
  const rowOf = new Int32Array(n);
  order.forEach((j, r) => { rowOf[j] = r; });
  const names = n <= 40, left = names ? 90 : 10, W = canvas.width, H = canvas.height - 20;
  let tmax = d.clock || 0;
  for (const s of segs) if (isFinite(s.to)) tmax = Math.max(tmax, s.to);
  for (let i = 0; i < n; i++) tmax = Math.max(tmax, J.end[i] ?? 0, J.submit[i] ?? 0);
  tmax = tmax || 1;
  const x = (t) => Math.round(left + (W - left - 10) * Math.min(t, tmax) / tmax);
  const rh = H / Math.max(n, 1), ctx = canvas.getContext("2d");
  const img = ctx.createImageData(W, canvas.height), px = new Uint32Array(img.data.buffer);
  px.fill(0xffffffff);
  const box = (x0, x1, row, c, minH) => {  // a bar on a row: at least 1 px each way
    const y0 = Math.floor(row * rh), gap = rh >= 4 ? 1 : 0;
    const y1 = Math.min(H, Math.max(y0 + minH, Math.floor((row + 1) * rh) - gap));
    const a = Math.max(0, x0), b = Math.min(W, Math.max(x1, x0 + 1));
    for (let y = y0; y < y1; y++) px.fill(c, y * W + a, y * W + b);
  };
  const grey = hex("#e5e7eb");
  for (let i = 0; i < n; i++) {  // waiting: from arrival to the first start (or now)
    if (J.submit[i] == null) continue;
    const first = J.placements[i].length ? J.placements[i][0][0] : (J.end[i] ?? tmax);
    box(x(J.submit[i]), x(first), rowOf[i], grey, 1);
  }
  const marks = {resize: hex("#111827"), move: hex("#2563eb"), resume: hex("#dc2626")};
  for (const s of segs) {
    box(x(s.from), x(isFinite(s.to) ? s.to : tmax), rowOf[s.job], jobRgba(J.name[s.job]), 1);
  }
  for (const s of segs) {
    if (s.kind !== "start") box(x(s.from) - 1, x(s.from) + 2, rowOf[s.job], marks[s.kind], 2);
  }
  ctx.putImageData(img, 0, 0);
  ctx.fillStyle = "#374151"; ctx.font = "10px sans-serif";
  if (names) order.forEach((j, r) => ctx.fillText(J.name[j].slice(0, 14), 2, r * rh + rh * 0.7));
  for (let k = 0; k <= 5; k++) ctx.fillText(`${fmt(tmax * k / 5)} s`, x(tmax * k / 5) - 8, H + 14);
  canvas.dataset.segments = segs.length;
}

async function showSchedule(id) {
  const d = await api(`/api/schedule?id=${encodeURIComponent(id)}`);
  if (d.error) { $("#view").innerHTML = `<p class="error">${esc(d.error)}</p>`; return; }
  const segs = segments(d), live = d.kind === "live" && !d.finished;
  let tmax = d.clock || 0;
  for (const s of segs) if (isFinite(s.to)) tmax = Math.max(tmax, s.to);
  const starts = segs.map((x) => x.from).sort((a, b) => a - b);  // default: a busy moment
  const t = live ? null : (PX.mapT ?? (starts.length ? starts[starts.length >> 1] : 0));
  const s = d.summary || {};
  const draw = (tt, tables) => {
    const held = holders(d, segs, tt);
    $("#map").innerHTML = clusterMap(d, held);
    if (!tables) return;
    const st = tt == null ? d.jobs.status : statusAt(d, held, tt);
    $("#jobs").innerHTML = jobTable(d, "Queue", (x) => x === "waiting" ||
      x === "not arrived", st) + jobTable(d, "Running", (x) => x === "running", st) +
      jobTable(d, "Finished", (x) => x === "finished" || /^(failed|rejected)/.test(x), st);
  };
  keepScroll(() => {
    $("#view").innerHTML = `<h2>${esc(id)}: ${esc(d.kind === "live" ? "live schedule" :
    "schedule")} ${live ? `(running, clock ${fmt(d.clock)} s)` : "(ended)"}</h2>` +
    problems(d.problems) + `<div class="muted">${esc(s.ordering ?? "")} ` +
    `${esc(s.placement ?? "")} on ${esc(d.cluster.name)} (map from ${esc(d.cluster.source)})` +
    `</div><h2>Cluster ${live ? "now" : `at <input id="map-t" type="range" min="0" ` +
    `max="${tmax}" step="${tmax / 500 || 1}" value="${t}"> <span id="map-t-v">` +
    `${fmt(t)}</span> s`}</h2><div id="map"></div><div class="charts" id="jobs"></div>` +
    `<h2>Timeline</h2><div class="legend"><span><span class="swatch" ` +
    `style="background:#e5e7eb"></span>waiting</span><span>bars: a placement, in the job's ` +
    `colour</span><span><span class="swatch" style="background:#dc2626"></span>resumed ` +
    `(after a preemption)</span><span><span class="swatch" style="background:#2563eb"></span>` +
    `moved</span><span><span class="swatch" style="background:#111827"></span>resized</span>` +
    `</div><canvas class="gantt" id="gantt" width="1100" ` +
    `height="${Math.min(Math.max(d.jobs.name.length * 14, 120), 700)}"></canvas>`;
    draw(t, true);
  });
  if (!live) {
    $("#map-t").oninput = (e) => {
      PX.mapT = Number(e.target.value);
      $("#map-t-v").textContent = fmt(PX.mapT);
      draw(PX.mapT, false);
    };
    $("#map-t").onchange = () => draw(PX.mapT, true);
  }
  gantt($("#gantt"), d, segs);
  PX.refresh = () => showSchedule(id);
}

function cdf(jct) {
  const v = jct.filter((x) => x != null && x > 0).sort((a, b) => a - b);
  return {x: v, y: v.map((_, i) => (i + 1) / v.length)};
}

const q = (v, p) => v.length ? v[Math.min(v.length - 1, Math.floor(p * v.length))] : null;

async function showJct(ids) {
  const ds = await Promise.all(ids.map((id) =>
    api(`/api/schedule?only=jct&id=${encodeURIComponent(id)}`)));
  const bad = ds.map((d, i) => d.error ? `<p class="error">${esc(ids[i])}: ${esc(d.error)}</p>`
                                       : "").join("");
  const ok = ds.map((d, i) => [d, ids[i]]).filter(([d]) => !d.error);
  const rows = ok.map(([d, id]) => {
    const c = cdf(d.jobs.jct), mean = c.x.reduce((a, b) => a + b, 0) / (c.x.length || 1);
    return `<tr data-schedule="${esc(id)}"><td class="t">${esc(id)}</td><td>${c.x.length}</td>` +
      `<td>${fmt(mean)}</td><td>${fmt(q(c.x, 0.5))}</td><td>${fmt(q(c.x, 0.9))}</td>` +
      `<td>${fmt(q(c.x, 0.99))}</td></tr>`;
  }).join("");
  $("#view").innerHTML = `<h2>JCT distributions</h2>${bad}<table><thead><tr>` +
    `<th class="t">schedule</th><th>jobs ended</th><th>mean s</th><th>median s</th>` +
    `<th>p90 s</th><th>p99 s</th></tr></thead><tbody>${rows}</tbody></table>` +
    `<div class="charts"><div class="chart" id="jct-cdf"></div></div>`;
  const colors = ["#2563eb", "#dc2626", "#059669", "#7c3aed"];
  lineChart($("#jct-cdf"), "JCT CDF", "JCT (s, log)", ok.map(([d, id], i) => {
    const c = cdf(d.jobs.jct);
    return {label: id, x: c.x, y: c.y, color: colors[i % 4]};
  }), {logx: true, yLabel: "fraction of jobs", width: 720, height: 360});
  PX.refresh = null;
}

window.PXS = {showSchedules, showSchedule, showJct};
})();
