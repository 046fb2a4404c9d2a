// Dashboards: figures come as JSON from the page's data URL and are drawn with Plotly
// (served from the installed plotly package, never a CDN).
"use strict";

function fmt(value, unit) {
  if (value === null || value === undefined) return "—";
  if (unit === "%") return `${(100 * value).toFixed(1)} %`;
  if (unit === "ms") return `${value.toFixed(1)} ms`;
  return String(value);
}

function showTotals(totals) {
  const items = [
    ["Requests", fmt(totals.requests)],
    ["Server failures (the error rate)", `${fmt(totals.errors)} (${fmt(totals.error_rate, "%")})`],
    ["Caller errors (4xx)", `${fmt(totals.caller_errors)} (${fmt(totals.caller_error_rate, "%")})`],
    ["Throttled (429)", `${fmt(totals.throttled)} (${fmt(totals.throttled_rate, "%")})`],
    ["Engine hit rate (L1+L2)", fmt(totals.hit_rate, "%")],
    ["TTFT p50", fmt(totals.ttft_p50, "ms")],
    ["TTFT p95", fmt(totals.ttft_p95, "ms")],
    ["TTFT p99", fmt(totals.ttft_p99, "ms")],
    ["Cut by max_tokens", fmt(totals.cut_rate, "%")],
    ["Empty answers", fmt(totals.empty_rate, "%")],
    ["Invalid JSON (of JSON requests)", fmt(totals.json_invalid_rate, "%")],
    ["Refused by the engine", fmt(totals.refused)],
  ];
  document.getElementById("totals").replaceChildren(...items.map(([label, value]) => {
    const div = document.createElement("div");
    div.className = "total";
    const strong = document.createElement("strong");
    strong.textContent = value;
    const span = document.createElement("span");
    span.textContent = label;
    div.append(strong, span);
    return div;
  }));
}

// One adapter's versions side by side: its errors, latency and output-quality markers.
function showVersions(versions) {
  const section = document.getElementById("versions");
  if (!section) return;
  section.hidden = !versions.length;
  const columns = [
    ["version", (v) => v.version, ""],
    ["Requests", (v) => fmt(v.requests), "num"],
    ["Server failures", (v) => fmt(v.error_rate, "%"), "num"],
    ["Caller errors", (v) => fmt(v.caller_error_rate, "%"), "num"],
    ["Throttled", (v) => fmt(v.throttled_rate, "%"), "num"],
    ["TTFT p95", (v) => fmt(v.ttft_p95, "ms"), "num"],
    ["Cut by max_tokens", (v) => fmt(v.cut_rate, "%"), "num"],
    ["Empty", (v) => fmt(v.empty_rate, "%"), "num"],
    ["Invalid JSON", (v) => fmt(v.json_invalid_rate, "%"), "num"],
    ["Refused", (v) => fmt(v.refused), "num"],
  ];
  const head = document.createElement("tr");
  for (const [label, , cls] of columns) {
    const th = document.createElement("th");
    th.textContent = label === "version" ? "Version" : label;
    th.className = cls;
    head.append(th);
  }
  const rows = versions.map((v) => {
    const tr = document.createElement("tr");
    tr.dataset.version = v.version;
    for (const [, value, cls] of columns) {
      const td = document.createElement("td");
      td.textContent = value(v);
      td.className = cls;
      tr.append(td);
    }
    return tr;
  });
  section.querySelector("thead").replaceChildren(head);
  section.querySelector("tbody").replaceChildren(...rows);
}

// Each change starts a load; only the latest one draws. Two changes in a row (an adapter, then
// a range) start two, and the first one's answer may come last: it must not draw over the
// second's (the page would show one range and say another).
let latest = 0;

async function load() {
  const form = document.getElementById("dashboard-controls");
  const status = document.getElementById("dashboard-status");
  const params = new URLSearchParams(new FormData(form));
  const mine = ++latest;
  history.replaceState(null, "", `?${params}`);
  status.textContent = "loading…";
  const response = await fetch(`${form.dataset.url}?${params}`, { credentials: "same-origin" });
  if (mine !== latest) return;
  if (!response.ok) { status.textContent = `could not load the data (HTTP ${response.status})`; return; }
  const body = await response.json();
  if (mine !== latest) return;
  showTotals(body.totals);
  showVersions(body.versions || []);
  for (const [id, figure] of Object.entries(body.figures)) {
    const element = document.getElementById(id);
    if (!element) continue;
    await Plotly.react(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
    if (mine !== latest) return;
  }
  status.textContent = body.totals.requests ? "" : "no requests in this range yet";
  document.body.dataset.dashboardLoaded = body.range;
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("dashboard-controls");
  form.addEventListener("change", load);
  form.addEventListener("submit", (e) => { e.preventDefault(); load(); });
  load();
});
