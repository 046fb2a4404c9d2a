// Alias page: the shadow's agreement with the live answers per minute (Plotly from the
// installed plotly package; the figure comes as JSON in the page, never as inline script).
"use strict";

document.addEventListener("DOMContentLoaded", async () => {
  const data = document.getElementById("shadow-figure");
  const element = document.getElementById("chart-shadow");
  if (!data || !element) return;
  const figure = JSON.parse(data.textContent);
  await Plotly.react(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
  document.body.dataset.shadowDrawn = "1";
});
