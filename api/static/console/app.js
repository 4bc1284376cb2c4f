// The fleet console: plain ES modules over the REST API and GET /events, no build step.
// This one routes, opens New and Search, follows /events and starts the page.
import { TOKEN_KEY, api, newIdempotencyKey, tokenSubmitted } from "./api.js";
import { loadDetail, paintDetailActivity } from "./detail.js";
import { hideNotice, trapFocus } from "./lifecycle.js";
import { closeMenu, loadList, paintSide, refreshActivity } from "./list.js";
import { $, enc, hub, state } from "./shared.js";
import { tickTimes } from "./time.js";

// New: ask for the working directory (prefilled with the one in view), then create the
// session (POST /sessions) and open it. A refusal (a relative path) stays in the dialog.
function newFlow() {
  const input = $("#new-cwd");
  $("#new-error").textContent = "";
  if (!input.value) input.value = (state.current && state.current.cwd) || "";
  $("#new-dialog").showModal();
  input.focus();
  input.select();
}

// The idempotency key of the creation being asked for: the same while the user submits the
// same cwd again after an error (a lost answer may have created it), a new one otherwise.
let creating = null;

async function newSubmitted(ev) {
  ev.preventDefault();
  const err = $("#new-error");
  const create = $("#new-create");
  err.textContent = "";
  create.disabled = true;
  const cwd = $("#new-cwd").value.trim();
  if (!creating || creating.cwd !== cwd) creating = { cwd, key: newIdempotencyKey() };
  try {
    const s = await api("POST", "/sessions", { cwd }, { idempotencyKey: creating.key });
    creating = null;
    $("#new-dialog").close();
    closeSearch();
    state.population = "active";
    go(`#/session/${s.sessionId}`);
    loadList();
  } catch (e) {
    err.textContent = e.message;
    $("#new-cwd").focus();
  } finally {
    create.disabled = false;
  }
}

function openSearch() {
  $("#search").hidden = false;
  paintSide();
  $("#q").focus();
}

// Hide the search field and forget the query (the caller reloads the list).
function closeSearch() {
  $("#search").hidden = true;
  $("#q").value = "";
  state.q = "";
  paintSide();
}

// A search result opens on the side that holds it, with that side's list beside it.
function openResult(s) {
  closeSearch();
  state.population = s.archived ? "archived" : "active";
  go(`#/session/${s.sessionId}`);
  loadList();
}

function go(hash, opts) {
  pendingOpts = opts || {};
  if (location.hash === hash) route();
  else location.hash = hash;
}

let pendingOpts = {};

function route() {
  const opts = pendingOpts;
  pendingOpts = {};
  const h = location.hash || "#/";
  const m = h.match(/^#\/session\/([^/?#]+)/);
  if (m) {
    state.selected = decodeURIComponent(m[1]);
    loadDetail(state.selected, opts);
    if (!state.sessions.length) loadList();
    return;
  }
  state.selected = null;
  state.current = null;
  $("#detail").replaceChildren(Object.assign(document.createElement("p"), {
    className: "hint", textContent: "Select a session.",
  }));
  const want = h.startsWith("#/archived") ? "archived" : "active";
  state.population = want;
  loadList();
}

let source = null;

let refreshTimer = null;

function refreshAll() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => {
    loadList();
    if (state.selected) loadDetail(state.selected);
  }, 150);
}

function connectEvents() {
  if (source) source.close();
  const token = sessionStorage.getItem(TOKEN_KEY);
  const url = token ? `/events?token=${enc(token)}` : "/events";
  source = new EventSource(url);
  const live = $("#live");
  source.onopen = () => { live.textContent = "live"; live.dataset.state = "live"; };
  source.onerror = () => { live.textContent = "reconnecting…"; live.dataset.state = "down"; };
  const onEvent = (ev) => {
    let data = {};
    try { data = JSON.parse(ev.data); } catch { /* ignore */ }
    if (ev.type === "turn" && data.sessionId) refreshActivity(data.sessionId);
    // A session deleted elsewhere leaves the list; its open view goes back to the list.
    if (ev.type === "deleted" && data.sessionId === state.selected) {
      go(state.population === "archived" ? "#/archived" : "#/");
      return;
    }
    refreshAll();
  };
  for (const type of ["archived", "unarchived", "title", "turn", "deleted", "gap"]) {
    source.addEventListener(type, onEvent);
  }
}

function start() {
  $("#token-form").addEventListener("submit", tokenSubmitted);
  $("#token-dialog").addEventListener("cancel", (ev) => ev.preventDefault());
  for (const id of ["#refusal", "#confirm-delete", "#token-dialog", "#new-dialog"]) trapFocus($(id));
  $("#new").addEventListener("click", newFlow);
  $("#new-form").addEventListener("submit", newSubmitted);
  $("#new-cancel").addEventListener("click", () => $("#new-dialog").close());
  $("#door").addEventListener("click", () => {
    const to = state.population === "archived" ? "#/" : "#/archived";
    if (state.q) closeSearch();
    go(to);
  });
  $("#search-toggle").addEventListener("click", () => {
    if ($("#search").hidden) return openSearch();
    closeSearch();
    loadList();
  });
  $("#search").addEventListener("submit", (ev) => ev.preventDefault());
  $("#q").addEventListener("keydown", (ev) => {
    if (ev.key !== "Escape") return;
    ev.preventDefault();
    closeSearch();
    loadList();
    $("#search-toggle").focus();
  });
  let qTimer = null;
  $("#q").addEventListener("input", (ev) => {
    clearTimeout(qTimer);
    qTimer = setTimeout(() => { state.q = ev.target.value.trim(); loadList(); }, 200);
  });
  document.addEventListener("click", (ev) => {
    if (state.openMenu && !state.openMenu.menu.contains(ev.target)) closeMenu(false);
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && state.openMenu) closeMenu(true);
  });
  $("#notice-close").addEventListener("click", hideNotice);
  window.addEventListener("hashchange", route);
  setInterval(tickTimes, 30_000);
  connectEvents();
  route();
}

Object.assign(hub, { go, openResult, refreshAll, connectEvents, paintDetailActivity });
start();
