// Evaluation run page: follow a queued or running run's progress, then show its results.
"use strict";

async function pollRun() {
  const state = document.getElementById("run-state");
  const response = await fetch(state.dataset.url, { credentials: "same-origin" });
  if (response.ok) {
    const run = await response.json();
    if (run.state === "succeeded" || run.state === "failed") {
      location.reload();  // the server renders the summary and the cases
      return;
    }
    document.getElementById("run-progress").value = run.cases_done;
    document.getElementById("run-done").textContent = run.cases_done;
  }
  setTimeout(pollRun, 1000);
}

document.addEventListener("DOMContentLoaded", pollRun);
