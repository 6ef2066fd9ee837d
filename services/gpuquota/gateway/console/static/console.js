// The gpuquota console: hash routes (#/, #/jobs, #/job/ID, #/nodes) rendered from /console/api/*,
// re-rendered every pollMs milliseconds (live updates). Plain JavaScript, no dependencies.
"use strict";

const API = "/console/api";
// The gateway's console token (gpuquota.gateway.browser_guard): only a page it served can read it, and
// every change sends it, so no other page can make one.
const TOKEN = document.querySelector('meta[name="gpuquota-console-token"]').content;
let pollMs = 1000;
let timer = null;
let readOnly = true;

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

async function api(path, options) {
  const response = await fetch(API + path, options);
  const body = await response.json();
  if (!response.ok) throw new Error(body.message || response.statusText);
  return body;
}

let rendered = new WeakMap();

// Replace an element's content only when it changed: a poll that finds nothing new leaves the page
// (and what the user is pointing at) alone. The Content-Security-Policy forbids style attributes, so
// the bars carry their geometry as data-left/data-width (percentages), applied through the CSSOM.
function render(element, html) {
  if (rendered.get(element) === html) return;
  rendered.set(element, html);
  element.innerHTML = html;
  for (const span of element.querySelectorAll("[data-left]")) {
    span.style.left = span.dataset.left + "%";
    if (span.dataset.width !== undefined) span.style.width = span.dataset.width + "%";
  }
}

function time(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : "";
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  return { path, params: new URLSearchParams(query || "") };
}

// ----- quota shares ------------------------------------------------------------------------------

// In-share preemption and S10's opt-in hygiene tags, as `gpuquota shares` shows them.
function preemption(row) {
  const hygiene = row.hygiene || {}, parts = row.inSharePreemption === "ENABLED" ? ["in-share"] : [];
  const minRuntime = hygiene["gpuquota:minRuntimeSeconds"], backoff = hygiene["gpuquota:reborrowBackoffSeconds"];
  if (minRuntime !== undefined) parts.push(`min runtime ${minRuntime}s`);
  if (backoff !== undefined) parts.push(`reborrow backoff ${backoff}s`);
  return parts.join(", ") || "-";
}

// S11: what an open training plan window adds to the share's limit is drawn after the limit.
function bar(row, unit, scale) {
  const pct = (n) => (100 * n) / scale;
  const limit = row.limits[unit] || 0, used = row.usage[unit] || 0, borrowed = row.borrowed[unit] || 0;
  const lent = row.lent[unit] || 0, queued = row.queued[unit] || 0, planned = (row.planned || {})[unit] || 0;
  const inQuota = used - borrowed;
  return `<div class="bar" title="used ${used}, limit ${limit}, plan +${planned}, borrowed ${borrowed}, lent ${lent}, queued ${queued}">
    <span class="plan" data-left="${pct(limit)}" data-width="${pct(planned)}"></span>
    <span class="used" data-left="0" data-width="${pct(inQuota)}"></span>
    <span class="borrowed" data-left="${pct(inQuota)}" data-width="${pct(borrowed)}"></span>
    <span class="lent" data-left="${pct(inQuota)}" data-width="${pct(lent)}"></span>
    <span class="queued" data-left="${pct(used)}" data-width="${pct(queued)}"></span>
    <span class="limit" data-left="${pct(limit)}"></span></div>`;
}

async function overview(view) {
  const data = await api("/overview");
  pollMs = data.pollMs;
  const groups = {};
  for (const row of data.shares) {
    for (const unit of row.units) (groups[`${row.jobQueue}|${unit}`] ??= []).push(row);
  }
  let html = `<div class="legend"><span><i class="used"></i>used in quota</span>
    <span><i class="borrowed"></i>borrowed</span><span><i class="lent"></i>lent</span>
    <span><i class="queued"></i>queued</span><span><i class="limit"></i>limit</span>
    <span><i class="plan"></i>training plan</span></div>`;
  if (!data.shares.length) html += "<p>No quota shares yet.</p>";
  for (const [key, rows] of Object.entries(groups)) {
    const [queue, unit] = key.split("|");
    const scale = Math.max(1, ...rows.map((r) => Math.max((r.limits[unit] || 0) + ((r.planned || {})[unit] || 0), (r.usage[unit] || 0) + (r.queued[unit] || 0))));
    html += `<h2>Queue ${esc(queue)} &middot; ${esc(unit)}</h2><table class="shares"><tr><th>Share</th><th>Strategy</th>
      <th>Limit</th><th>Maximum</th><th>Used</th><th>Borrowed</th><th>Lent</th><th>Queued</th><th></th><th>Preemption</th></tr>`;
    for (const r of rows) {
      const max = r.maximum[unit] === null ? "&infin;" : r.maximum[unit];
      const jobs = `#/jobs?queue=${encodeURIComponent(queue)}&share=${encodeURIComponent(r.quotaShareName)}`;
      html += `<tr data-share="${esc(r.quotaShareName)}" data-queue="${esc(queue)}" data-unit="${esc(unit)}">
        <td><a href="${jobs}">${esc(r.quotaShareName)}</a></td><td>${esc(r.strategy)}</td>
        <td class="num limit">${r.limits[unit] || 0}</td><td class="num maximum">${max}</td>
        <td class="num used">${r.usage[unit] || 0}</td><td class="num borrowed">${r.borrowed[unit] || 0}</td>
        <td class="num lent">${r.lent[unit] || 0}</td><td class="num queued">${r.queued[unit] || 0}</td>
        <td>${bar(r, unit, scale)}</td><td class="preemption">${esc(preemption(r))}</td></tr>`;
    }
    html += "</table>";
  }
  if ((data.plans || []).length) {
    html += `<h2>Training plans</h2><table class="plans"><tr><th>Plan</th><th>Unit</th><th>Count</th><th>Window</th>
      <th>Allocations</th><th>Used GPU-h</th><th>Idle GPU-h</th></tr>`;
    for (const p of data.plans) {
      const open = p.openWindow ? `open until ${time(p.openWindow.end)}` : "closed";
      const allocations = p.allocations.map((a) => `${esc(a.quotaShare)}=${a.count}`).join(", ") || "-";
      html += `<tr data-plan="${esc(p.trainingPlanName)}"><td>${esc(p.trainingPlanName)}</td><td>${esc(p.capacityUnit)}</td>
        <td class="num">${p.count}</td><td class="window">${open}</td><td>${allocations}</td>
        <td class="num used">${p.usedGpuHours}</td><td class="num idle">${p.idleGpuHours}</td></tr>`;
    }
    html += "</table>";
  }
  if (data.pools.length) {
    html += `<h2>Pools</h2><table class="pools"><tr><th>Pool</th><th>Unit</th><th>Slots</th><th>Free</th></tr>`;
    for (const p of data.pools) {
      html += `<tr><td>${esc(p.pool)}</td><td>${esc(p.unit)}</td><td class="num">${p.slots}</td><td class="num">${p.free}</td></tr>`;
    }
    html += "</table>";
  }
  render(view, html);
}

// ----- jobs --------------------------------------------------------------------------------------

const STATUSES = ["", "SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"];

function filterForm(params) {
  const field = (name, label) => `<label>${label} <input name="${name}" value="${esc(params.get(name) || "")}" size="12"></label>`;
  const options = STATUSES.map((s) => `<option${s === (params.get("status") || "") ? " selected" : ""}>${s}</option>`).join("");
  return `<form class="filters" id="filters">${field("queue", "Queue")}${field("share", "Share")}
    <label>Status <select name="status">${options}</select></label>${field("name", "Name")}<button>Filter</button></form>`;
}

async function jobs(view, params, first) {
  if (first) {
    render(view, filterForm(params) + '<div id="jobs"></div>');
    document.getElementById("filters").addEventListener("submit", (event) => {
      event.preventDefault();
      const query = new URLSearchParams([...new FormData(event.target)].filter(([, v]) => v));
      location.hash = "#/jobs?" + query.toString();
    });
  }
  const data = await api("/jobs?" + params.toString());
  let html = `<table class="jobs"><tr><th>Name</th><th>Status</th><th>Share</th><th>Priority</th><th>Demand</th>
    <th>Preempted</th><th>Created</th><th>Reason</th></tr>`;
  for (const j of data.jobs) {
    html += `<tr data-job="${esc(j.jobName)}"><td><a href="#/job/${encodeURIComponent(j.jobId)}">${esc(j.jobName)}</a></td>
      <td class="status ${esc(j.status)}">${esc(j.status)}</td><td>${esc(j.jobQueue)}/${esc(j.quotaShareName)}</td>
      <td class="num priority">${j.schedulingPriority}</td><td>${j.count} &times; ${esc(j.unit)}</td>
      <td class="num preempted">${j.preemptedAttemptCount}</td><td>${time(j.createdAt)}</td><td>${esc(j.statusReason)}</td></tr>`;
  }
  render(document.getElementById("jobs"), html + "</table>" + (data.jobs.length ? "" : "<p>No jobs match.</p>"));
}

// ----- one job -----------------------------------------------------------------------------------

function timeline(job) {
  const width = 760, left = 90, right = 10, rowH = 22;
  const start = job.createdAt, end = Math.max(job.now, start + 1000);
  const x = (t) => left + ((width - left - right) * (t - start)) / (end - start);
  const rows = job.attempts.length + 1;
  let svg = `<svg class="timeline" width="${width}" height="${rowH * rows + 24}">`;
  const history = job.history.concat([{ at: end, status: null }]);
  // S11: training plans' windows for the job's unit, shaded behind the rows.
  for (const w of (job.planWindows || []).filter((w) => w.start < end && w.end > start)) {
    const from = x(Math.max(w.start, start)), to = x(Math.min(w.end, end));
    svg += `<rect class="plan-window" x="${from}" y="0" width="${Math.max(1, to - from)}" height="${rowH * rows + 4}" fill="#d69e2e" fill-opacity="0.15"><title>training plan ${esc(w.trainingPlanName)}: ${w.count} instances, ${time(w.start)} - ${time(w.end)}</title></rect>`;
  }
  svg += `<text x="0" y="15">status</text>`;
  const colours = { RUNNING: "#2f855a", RUNNABLE: "#ecc94b", SCHEDULED: "#90cdf4", STARTING: "#63b3ed", SUCCEEDED: "#2b6cb0", FAILED: "#c53030", SUBMITTED: "#cbd5e0" };
  for (let i = 0; i + 1 < history.length; i++) {
    const a = history[i], b = history[i + 1];
    svg += `<rect x="${x(a.at)}" y="4" width="${Math.max(1, x(b.at) - x(a.at))}" height="14" fill="${colours[a.status] || "#a0aec0"}"><title>${esc(a.status)} at ${time(a.at)}</title></rect>`;
  }
  job.attempts.forEach((att, i) => {
    const y = rowH * (i + 1) + 4;
    const from = att.scheduledAt, to = att.stoppedAt || end;
    svg += `<text x="0" y="${y + 11}">attempt ${i + 1}</text>`;
    svg += `<rect x="${x(from)}" y="${y}" width="${Math.max(1, x(to) - x(from))}" height="14" fill="#90cdf4"></rect>`;
    if (att.startedAt) svg += `<rect x="${x(att.startedAt)}" y="${y}" width="${Math.max(1, x(to) - x(att.startedAt))}" height="14" fill="#2f855a"></rect>`;
    if (att.stoppedAt) svg += `<text x="${Math.min(x(to) + 4, width - 120)}" y="${y + 11}">${esc((att.statusReason || "").slice(0, 40))}</text>`;
  });
  svg += `<text x="${left}" y="${rowH * rows + 18}">${time(start)}</text><text x="${width - right - 60}" y="${rowH * rows + 18}">${time(end)}</text>`;
  return svg + "</svg>";
}

function wait(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`;
}

// When a waiting job should start (gpuquota.sim.estimate), as `gpuquota explain` prints it.
function startEstimate(est) {
  if (!est) return "";
  const at = (ms, none, notBefore) => ms != null ? `${time(ms)} (in ${wait(ms - est.estimatedAt)})`
    : notBefore != null ? `after ${time(notBefore)} (estimate cut short)` : none;
  const assumptions = (est.assumptions || []).map((a) => `<li>${esc(a)}</li>`).join("");
  return `<div class="estimate" id="job-estimate"><h3>Start estimate</h3>
    <p><span class="label">likely start</span> <span id="likely-start">${esc(at(est.likelyStartAt, "not foreseen", est.likelyNotBefore))}</span></p>
    <p><span class="label">latest start</span> <span id="latest-start">${esc(at(est.latestStartAt, "no bound", est.latestNotBefore))}</span></p>
    <p class="label">assuming</p><ul class="assumptions">${assumptions}</ul></div>`;
}

function explanation(job) {
  const e = job.explanation;
  if (e) return `<p class="message">${esc(e.message)}</p><p class="reason">reason: ${esc(e.reason)}</p>${startEstimate(e.startEstimate)}`;
  if (job.lastPreemption) return `<p class="message">${esc(job.lastPreemption.statusReason)}</p>`;
  return `<p class="message">${esc(job.statusReason || job.status)}</p>`;
}

// S12: the work a preemption threw away, since the attempt's last checkpoint (its start without one).
function lostWork(lost) {
  if (!lost) return "-";
  return `${Math.round(lost.seconds)} s &times; ${lost.gpus} GPUs = ${Math.round(lost.gpuSeconds)} GPU-s`;
}

function preemptions(job) {
  if (!job.preemptions.length) return "<p>Never preempted.</p>";
  let html = `<table class="preemptions"><tr><th>When</th><th>Kind</th><th>By</th><th>Reason</th><th>Lost work</th></tr>`;
  for (const p of job.preemptions) {
    html += `<tr><td>${time(p.decidedAt)}</td><td class="kind">${esc(p.kind)}</td>
      <td>${esc(p.preemptorJobName || p.preemptorJobId)} (${esc(p.preemptorQuotaShareName)})</td><td>${esc(p.statusReason)}</td>
      <td class="lost">${lostWork(p.lostWork)}</td></tr>`;
  }
  return html + "</table>";
}

function actions(job) {
  if (job.readOnly) return "<p>Read-only: authentication is on.</p>";
  return `<div class="actions"><label>Priority <input id="priority" type="number" value="${job.schedulingPriority}" min="0" max="9999"></label>
    <button id="set-priority">Change priority</button><button id="terminate">Terminate</button><span id="action-result"></span></div>`;
}

async function jobPage(view, id, first) {
  const job = await api("/jobs/" + encodeURIComponent(id));
  if (first) {
    render(view, `<h2 id="job-title"></h2><div class="box" id="job-actions">${actions(job)}</div>
      <h2>Timeline</h2><div class="box" id="job-timeline"></div>
      <h2>Explanation</h2><div class="box explanation" id="job-explanation"></div>
      <h2>Preemptions</h2><div id="job-preemptions"></div>`);
    if (!job.readOnly) bindActions(id);
  }
  render(document.getElementById("job-title"), `${esc(job.jobName)} <span class="status ${esc(job.status)}" id="job-status">${esc(job.status)}</span>
    <small>${esc(job.jobQueue)}/${esc(job.quotaShareName)} &middot; priority <span id="job-priority">${job.schedulingPriority}</span>
    &middot; preempted <span id="job-preempted">${job.preemptedAttemptCount}</span></small>`);
  render(document.getElementById("job-timeline"), timeline(job));
  render(document.getElementById("job-explanation"), explanation(job));
  render(document.getElementById("job-preemptions"), preemptions(job));
}

function bindActions(id) {
  const result = document.getElementById("action-result");
  const post = async (what, body) => {
    try {
      const headers = { "Content-Type": "application/json", "X-Gpuquota-Console-Token": TOKEN };
      await api(`/jobs/${encodeURIComponent(id)}/${what}`, { method: "POST", headers, body: JSON.stringify(body) });
      result.textContent = "done";
      result.className = "";
      refresh(false);
    } catch (error) {
      result.textContent = error.message;
      result.className = "error";
    }
  };
  document.getElementById("set-priority").addEventListener("click", () =>
    post("priority", { priority: Number(document.getElementById("priority").value) }));
  document.getElementById("terminate").addEventListener("click", () => {
    if (confirm("Terminate this job?")) post("terminate", { reason: "Terminated from the gpuquota console" });
  });
}

// ----- nodes -------------------------------------------------------------------------------------

async function nodes(view) {
  const data = await api("/nodes");
  if (!data.nodes.length) {
    render(view, "<p>No nodes registered.</p>");
    return;
  }
  let html = "";
  for (const n of data.nodes) {
    const state = !n.online ? "offline" : n.draining ? "draining" : "online";
    const age = Math.max(0, Math.round((data.now - n.lastHeartbeat) / 1000));
    html += `<div class="node" data-node="${esc(n.nodeId)}"><strong>${esc(n.nodeId)}</strong> <small>pool ${esc(n.pool)} &middot; ${state}
      &middot; heartbeat ${age} s ago</small><div>`;
    for (const s of n.slots) {
      const job = s.jobId ? `<a href="#/job/${encodeURIComponent(s.jobId)}">${esc(s.jobName || s.jobId)}</a>` : "free";
      html += `<div class="slot${s.jobId ? " busy" : ""}">#${s.index} ${esc(s.unit)}<br>GPUs ${esc(s.gpus.join(",") || "-")}<br>${job}</div>`;
    }
    html += "</div></div>";
  }
  render(view, html);
}

// ----- the loop ----------------------------------------------------------------------------------

async function refresh(first) {
  clearTimeout(timer);
  if (first) rendered = new WeakMap(); // a new view: build it afresh
  const view = document.getElementById("view");
  const { path, params } = route();
  const name = path.startsWith("/job/") ? "jobs" : path === "/jobs" ? "jobs" : path === "/nodes" ? "nodes" : "overview";
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.view === name);
  try {
    if (path.startsWith("/job/")) await jobPage(view, decodeURIComponent(path.slice(5)), first);
    else if (path === "/jobs") await jobs(view, params, first);
    else if (path === "/nodes") await nodes(view);
    else await overview(view);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    document.getElementById("updated").textContent = "error: " + error.message;
  }
  timer = setTimeout(() => refresh(false), pollMs);
}

async function start() {
  try {
    readOnly = (await api("/overview")).readOnly;
  } catch (error) {
    readOnly = true;
  }
  document.getElementById("mode").textContent = readOnly ? "read-only (authentication on)" : "authentication off";
  window.addEventListener("hashchange", () => refresh(true));
  refresh(true);
}

start();
