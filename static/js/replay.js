// Replay page: follow a running replay's progress, then draw its charts (Plotly from the
// installed plotly package).
"use strict";

async function poll() {
  const status = document.getElementById("replay-status");
  const response = await fetch(status.dataset.url, { credentials: "same-origin" });
  if (!response.ok) { setTimeout(poll, 2000); return; }
  const body = await response.json();
  if (body.state !== status.dataset.state && (body.state === "done" || body.state === "failed")) {
    location.reload();  // the server renders the tables
    return;
  }
  if (body.state === "done") {
    for (const [id, figure] of Object.entries(body.figures || {})) {
      const element = document.getElementById(id);
      if (element) await Plotly.react(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
    }
    document.body.dataset.replayDrawn = "1";
    return;
  }
  if (body.state === "failed") return;
  const percent = Math.round(100 * body.progress);
  document.getElementById("replay-progress").value = percent;
  document.getElementById("replay-percent").textContent = `${percent} %`;
  document.getElementById("replay-step").textContent = body.step || "waiting for a worker";
  setTimeout(poll, 1000);
}

document.addEventListener("DOMContentLoaded", poll);
