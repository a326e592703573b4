// vlarun edge dashboard: polls /api/state with the page's key and draws it. No dependencies.
"use strict";

const KEY = new URLSearchParams(location.search).get("key") || "";
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 1) => (x === null || x === undefined ? "-" : Number(x).toFixed(d));

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

function fillTable(id, rows) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    cells.forEach((c) => tr.appendChild(cell(c)));
    return tr;
  }));
}

function counts(map) {
  return Object.entries(map).map(([k, n]) => `${k} x${n}`).join(", ");
}

function drawLatency(lat) {
  const w = 900, h = 260, pad = 20;
  const n = lat.server_ms.length;
  if (!n) return;
  const top = Math.max(...lat.server_ms, ...lat.deadline_ms) * 1.1 || 1;
  const t0 = Math.min(...lat.t_s), span = Math.max(-t0, 1e-3);
  const x = (t) => pad + ((t - t0) / span) * (w - 2 * pad);
  const y = (ms) => h - pad - (ms / top) * (h - 2 * pad);
  const pts = (ys) => ys.map((v, i) => `${x(lat.t_s[i]).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  $("server-line").setAttribute("points", pts(lat.server_ms));
  $("deadline-line").setAttribute("points", pts(lat.deadline_ms));
  $("y-max").textContent = `${top.toFixed(0)} ms`;
  $("x-span").textContent = `last ${span.toFixed(1)} s`;
}

function render(s) {
  $("model").textContent = `- ${s.model} (${s.family})`;
  $("meta").textContent = `up ${fmt(s.uptime_s, 0)} s; ${s.secure ? "CurveZMQ" : "INSECURE transport"}`;
  const robots = Object.entries(s.robots);
  $("robots-count").textContent = robots.length;
  $("requests").textContent = s.counts.requests;
  $("p50").textContent = fmt(s.p50_ms);
  $("p99").textContent = fmt(s.p99_ms);
  $("slo").textContent = s.deadline_met === null ? "-" : `${(100 * s.deadline_met).toFixed(1)}%`;
  $("slo").className = "v" + (s.deadline_met !== null && s.deadline_met < 0.99 ? " bad" : "");
  $("refused").textContent = s.counts.refused;
  $("expired").textContent = s.counts.expired;
  $("energy").textContent = fmt(s.energy.joules, 2);
  $("energy-source").textContent = `(${s.energy.source})`;
  fillTable("robots", robots.map(([id, r]) => [
    id, r.requests, counts(r.segments), counts(r.settings), fmt(r.p50_ms), fmt(r.last_seen_s, 2),
  ]));
  fillTable("stages", Object.keys(s.queue).map((st) => [
    st, s.queue[st], fmt(s.batch_mean[st], 2), fmt(s.stage_ms[st], 2),
  ]));
  fillTable("events", s.events.slice().reverse().map((e) => [fmt(-e.t, 1), e.kind, e.stages]));
  drawLatency(s.latency);
  document.body.dataset.ready = "1";
}

async function poll() {
  try {
    const r = await fetch(`api/state`, { headers: { Authorization: `Bearer ${KEY}` } });
    if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
    render(await r.json());
    $("status").textContent = "";
  } catch (e) {
    $("status").textContent = `no state: ${e.message}`;
  }
  setTimeout(poll, 500);
}

poll();
