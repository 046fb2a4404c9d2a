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
    ["Errors", `${fmt(totals.errors)} (${fmt(totals.error_rate, "%")})`],
    ["Engine hit rate (L1+L2)", fmt(totals.hit_rate, "%")],
    ["TTFT p50", fmt(totals.ttft_p50, "ms")],
    ["TTFT p95", fmt(totals.ttft_p95, "ms")],
    ["TTFT p99", fmt(totals.ttft_p99, "ms")],
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

async function load() {
  const form = document.getElementById("dashboard-controls");
  const status = document.getElementById("dashboard-status");
  const params = new URLSearchParams(new FormData(form));
  history.replaceState(null, "", `?${params}`);
  status.textContent = "loading…";
  const response = await fetch(`${form.dataset.url}?${params}`, { credentials: "same-origin" });
  if (!response.ok) { status.textContent = `could not load the data (HTTP ${response.status})`; return; }
  const body = await response.json();
  showTotals(body.totals);
  for (const [id, figure] of Object.entries(body.figures)) {
    const element = document.getElementById(id);
    if (!element) continue;
    await Plotly.react(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
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
