// Usage page: tokens per day stacked by alias (or tenant), drawn with Plotly from the
// installed plotly package; the figure comes as JSON in the page, never as inline script.
"use strict";

document.addEventListener("DOMContentLoaded", async () => {
  const data = document.getElementById("usage-figure");
  const element = document.getElementById("chart-usage");
  if (!data || !element) return;
  const figure = JSON.parse(data.textContent);
  await Plotly.react(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
  document.body.dataset.usageDrawn = "1";
});
