// The Servlane console: reads /console/api/state and renders it. Everything shown is set through
// textContent or attributes (never innerHTML): names come from users. The API key, when the gateway has
// keys, is asked for once and kept in sessionStorage (this tab only); it travels only in the
// Authorization header, never in a URL.
"use strict";

(function () {
  const KEY_ITEM = "servlane-console-key";
  const REFRESH_MS = 10000;
  const COLORS = ["#2f6fde", "#e07b00", "#2a9d5c", "#9b51e0", "#c0392b", "#16a2b8", "#7f8c8d"];
  const VERDICTS = { advance: "#2f6fde", hold: "#e0a800", promote: "#2a9d5c", rollback: "#c0392b" };
  const charts = [];

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    return node;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cell === null || cell === undefined ? "–" : String(cell);
      tr.appendChild(td);
    }
    return tr;
  }

  function fill(tableId, rows, empty) {
    const body = document.querySelector("#" + tableId + " tbody");
    body.replaceChildren(...rows);
    if (!rows.length) {
      const cols = document.querySelectorAll("#" + tableId + " thead th").length;
      body.appendChild(el("tr")).appendChild(el("td", empty, { colspan: String(cols), class: "muted" }));
    }
  }

  const seconds = (s) => (s === null || s === undefined ? null : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s");
  const percent = (r) => (r === null || r === undefined ? null : (r * 100).toFixed(1) + " %");
  const duration = (s) => (s === null || s === undefined ? null : s < 120 ? s.toFixed(0) + " s" : (s / 60).toFixed(1) + " min");

  // The last pod start's total (created to Ready) and the median of the recent ones; each step in the tooltip.
  const STEPS = [["scheduled", "scheduled"], ["imageReady", "image ready"], ["containerStarted", "container started"],
    ["runtimeImports", "imports"], ["weightsFetched", "weights fetched"], ["engineLoaded", "engine loaded"],
    ["runtimeReady", "warm-up"], ["podReady", "probe to Ready"], ["firstToken", "first token after Ready"]];
  function coldStart(cold) {
    if (!cold || !cold.last) return null;
    const median = cold.median && cold.median.total !== undefined ? " (median " + seconds(cold.median.total) + ")" : "";
    const steps = STEPS.filter(([key]) => cold.last[key] !== undefined)
      .map(([key, label]) => label + ": " + seconds(cold.last[key]));
    const title = "pod " + cold.last.pod + "\n" + steps.join("\n") + "\n" + cold.samples + " recent start(s)";
    return el("span", seconds(cold.last.total) + median, { title, class: "cold-start" });
  }

  function split(weights) {
    const bar = el("div", null, { class: "split" });
    weights.forEach((w, i) => {
      const part = el("span", w.model + " " + w.weight + "%", { title: w.model + ": " + w.weight + "%" });
      part.style.width = Math.max(0, Math.min(100, Number(w.weight))) + "%";
      part.style.background = COLORS[i % COLORS.length];
      bar.appendChild(part);
    });
    return bar;
  }

  function canaryChart(feature) {
    const box = el("div", null, { class: "canary", "data-feature": feature.namespace + "/" + feature.name });
    box.appendChild(el("h3", feature.namespace + "/" + feature.name));
    const points = feature.analyses
      .map((a) => ({ a, t: Date.parse(a.time) / 1000 }))
      .filter((p) => !Number.isNaN(p.t))
      .sort((x, y) => x.t - y.t);
    if (!points.length) {
      box.appendChild(el("p", "No canary analyses yet.", { class: "muted" }));
      return box;
    }
    const chart = el("div", null, { class: "canary-chart" });
    box.appendChild(chart);
    const xs = points.map((p) => p.t);
    const weight = points.map((p) => (p.a.canaryWeight === undefined ? null : p.a.canaryWeight));
    const errors = points.map((p) => (p.a.canaryErrorRate === undefined ? null : p.a.canaryErrorRate * 100));
    const series = [{}, { label: "canary weight %", stroke: "#2f6fde", width: 2, scale: "%" },
      { label: "canary error %", stroke: "#c0392b", width: 1, dash: [4, 4], scale: "%" }];
    const data = [xs, weight, errors];
    for (const [verdict, color] of Object.entries(VERDICTS)) {
      series.push({ label: verdict, scale: "%", stroke: color, fill: color, paths: () => null,
        points: { show: true, size: 9, stroke: color, fill: color } });
      data.push(points.map((p) => (p.a.verdict === verdict ? (p.a.canaryWeight || 0) : null)));
    }
    const opts = { width: 560, height: 220, series, scales: { "%": { range: [0, 100] } },
      axes: [{}, { scale: "%", label: "%" }] };
    if (window.uPlot) charts.push(new window.uPlot(opts, data, chart));
    return box;
  }

  function render(state) {
    document.getElementById("scope").textContent = "showing: " + state.scope;
    document.getElementById("updated").textContent = "updated " + state.generatedAt;
    document.getElementById("replica-note").textContent = state.replicaNote +
      " Slow: at least " + state.slowSeconds + " s; rates over the last " + Math.round(state.windowSeconds) + " s.";
    fill("features", state.features.map((f) => row([f.name, f.namespace, f.phase, split(f.weights)])), "No features.");
    while (charts.length) charts.pop().destroy();
    document.getElementById("canaries").replaceChildren(...state.features.map(canaryChart));
    fill("models", state.models.map((m) => row([
      m.name, m.namespace, m.phase,
      (m.readyReplicas ?? "–") + " / " + (m.desiredReplicas ?? m.replicas ?? "–"),
      duration(m.timeToReadySeconds), coldStart(m.coldStart), m.requestsPerSecond.toFixed(2), percent(m.errorRate), seconds(m.ttftP95Seconds),
    ])), "No models.");
    fill("recent", state.recent.map((r) => {
      let trace = r.traceId || null;
      if (r.traceUrl && /^https?:\/\//.test(r.traceUrl)) {
        trace = el("a", r.traceId, { href: r.traceUrl, class: "trace-link", target: "_blank", rel: "noopener noreferrer" });
      }
      const tr = row([r.time, r.namespace, r.feature, r.model || null,
        r.status + (r.error ? " (" + r.error + ")" : ""), seconds(r.durationSeconds), trace]);
      if (r.failed) tr.className = "failed";
      return tr;
    }), "None on this replica.");
    // The Batch API's newest batches (the caller key's own): shared by all replicas, through its database.
    fill("batches", (state.batches || []).map((b) => row([
      b.id, b.status, b.endpoint,
      (b.completed + b.failed) + " / " + b.total, b.failed, b.requestsPerMinute, b.createdAt,
    ])), state.batches === null ? "The Batch API is off or its database is not reachable." : "No batches.");
    document.getElementById("content").hidden = false;
  }

  function askForKey(message) {
    document.getElementById("content").hidden = true;
    document.getElementById("key-form").hidden = false;
    document.getElementById("key-error").textContent = message || "";
  }

  async function refresh() {
    const key = sessionStorage.getItem(KEY_ITEM);
    const headers = key ? { Authorization: "Bearer " + key } : {};
    document.getElementById("forget-key").hidden = !key;
    let response;
    try {
      response = await fetch("/console/api/state", { headers, cache: "no-store" });
    } catch (err) {
      document.getElementById("updated").textContent = "the gateway does not answer";
      return;
    }
    if (response.status === 401 || response.status === 403) {
      const body = await response.json().catch(() => ({}));
      askForKey(key ? (body.error && body.error.message) || "The key was refused." : "");
      return;
    }
    if (!response.ok) {
      document.getElementById("updated").textContent = "the gateway answered " + response.status;
      return;
    }
    document.getElementById("key-form").hidden = true;
    render(await response.json());
  }

  document.getElementById("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("key-input");
    if (input.value.trim()) sessionStorage.setItem(KEY_ITEM, input.value.trim());
    input.value = "";
    refresh();
  });
  document.getElementById("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_ITEM);
    askForKey("");
  });
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
