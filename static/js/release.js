// Release page: draw the candidate-against-baseline charts (Plotly from the installed plotly
// package; the figures come as JSON in the page), and while the release runs, reload the page
// when the judge moves it, so the timeline, gates and split stay current.
"use strict";

async function draw() {
  const data = document.getElementById("release-figures");
  if (!data) return;
  const figures = JSON.parse(data.textContent);
  for (const [id, figure] of Object.entries(figures)) {
    const element = document.getElementById(id);
    if (element) {
      await Plotly.react(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
    }
  }
  document.body.dataset.releaseDrawn = "1";
}

async function follow() {
  const state = document.getElementById("release-state");
  if (!state || !state.dataset.url) return;
  const seen = `${state.dataset.state}`;
  let lastEvents = null;
  const poll = async () => {
    try {
      const response = await fetch(state.dataset.url, { credentials: "same-origin" });
      if (response.ok) {
        const release = await response.json();
        if (lastEvents === null) lastEvents = release.events.length;
        if (release.state !== seen || release.events.length !== lastEvents) {
          location.reload();
          return;
        }
      }
    } catch (error) {
      // the console is restarting: try again at the next tick
    }
    setTimeout(poll, 1000);
  };
  setTimeout(poll, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  draw();
  follow();
});
