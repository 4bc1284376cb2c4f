// What the console's modules share: the page state, DOM helpers, and `hub`, where app.js
// registers the functions other modules call back (routing, refreshing, the detail pane),
// so that no module imports another in a cycle.

export const $ = (sel) => document.querySelector(sel);

// Functions registered by app.js: go, openResult, refreshAll, connectEvents,
// paintDetailActivity.
export const hub = {};

export const state = {
  population: "active", // "active" | "archived"
  q: "",
  sessions: [],
  activity: new Map(), // sessionId -> [items]
  selected: null, // sessionId shown in the detail pane
  openMenu: null,
  current: null, // the selected session's info, as last read
};

export const enc = encodeURIComponent;

export const meta = (s) => (s._meta && s._meta.agentFleet) || {};

export const titleOf = (s) => s.title || `Untitled (${s.sessionId.slice(0, 8)})`;

export function dd(dl, label, value) {
  const dt = document.createElement("dt");
  dt.textContent = label;
  const d = document.createElement("dd");
  d.textContent = value;
  dl.append(dt, d);
  return d;
}

export function button(label, fn, cls) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  if (cls) b.className = cls;
  b.addEventListener("click", fn);
  return b;
}
