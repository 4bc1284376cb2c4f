// The fleet console: plain ES module over the REST API and GET /events.
const $ = (sel) => document.querySelector(sel);
const TOKEN_KEY = "fleetConsoleToken";
// The activity families' labels, from the family registry (served by api/console.py).
import { FAMILIES } from "/console/families.js";

const state = {
  population: "active", // "active" | "archived"
  q: "",
  sessions: [],
  activity: new Map(), // sessionId -> [items]
  selected: null, // sessionId shown in the detail pane
  openMenu: null,
};

// ------------------------------------------------------------------ API
let tokenWaiters = null;

function askToken() {
  if (!tokenWaiters) {
    tokenWaiters = [];
    const dlg = $("#token-dialog");
    $("#token-input").value = "";
    if (!dlg.open) dlg.showModal();
  }
  return new Promise((resolve) => tokenWaiters.push(resolve));
}

function tokenSubmitted(ev) {
  ev.preventDefault();
  const value = $("#token-input").value.trim();
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  $("#token-dialog").close();
  const waiters = tokenWaiters || [];
  tokenWaiters = null;
  waiters.forEach((w) => w());
  connectEvents();
}

class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || "http_error";
    this.data = err.data || {};
  }
}

async function api(method, path, body) {
  for (;;) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (res.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      await askToken();
      continue;
    }
    let data = null;
    try {
      data = await res.json();
    } catch {
      data = null;
    }
    if (!res.ok) throw new ApiError(res.status, data);
    return data;
  }
}

const enc = encodeURIComponent;
const meta = (s) => (s._meta && s._meta.agentFleet) || {};
const titleOf = (s) => s.title || `Untitled (${s.sessionId.slice(0, 8)})`;

// ------------------------------------------------------------------ list
let loadSeq = 0;

async function loadList() {
  const seq = ++loadSeq;
  paintSide();
  const archived = state.population === "archived" ? "only" : "exclude";
  const found = [];
  let cursor = null;
  for (let page = 0; page < 10 && found.length < 50; page++) {
    let path = `/sessions?archived=${archived}&limit=50`;
    if (state.q) path += `&q=${enc(state.q)}`;
    if (cursor) path += `&cursor=${enc(cursor)}`;
    const data = await api("GET", path);
    found.push(...data.sessions);
    cursor = data.nextCursor;
    if (!cursor) break;
  }
  if (seq !== loadSeq) return;
  state.sessions = found.slice(0, 50);
  renderList();
  if (state.population === "active") {
    await Promise.all(state.sessions.map((s) => refreshActivity(s.sessionId)));
  }
}

async function refreshActivity(id) {
  try {
    const data = await api("GET", `/sessions/${enc(id)}/activity`);
    state.activity.set(id, data.activity);
  } catch {
    state.activity.delete(id);
  }
  const el = document.querySelector(`.row[data-session-id="${CSS.escape(id)}"] .status`);
  if (el) paintStatus(el, id);
  if (state.selected === id) paintDetailActivity();
}

function statusText(items) {
  if (!items) return ["…", false];
  if (!items.length) return ["idle", false];
  const counts = {};
  for (const it of items) counts[it.family] = (counts[it.family] || 0) + 1;
  const parts = [];
  const known = Object.keys(FAMILIES);
  for (const f of [...known, ...Object.keys(counts).filter((f) => !FAMILIES[f])]) {
    const n = counts[f];
    const fam = FAMILIES[f] || { display: f, plural: f };
    if (n) parts.push(fam.status || `${n} ${n > 1 ? fam.plural : fam.display}`);
  }
  return [parts.join(" · "), true];
}

function paintStatus(el, id) {
  if (state.population === "archived") {
    el.textContent = "archived";
    el.classList.remove("busy");
    return;
  }
  const [text, busy] = statusText(state.activity.get(id));
  el.textContent = text;
  el.classList.toggle("busy", busy);
}

function paintSide() {
  const archivedView = state.population === "archived";
  $("#door").setAttribute("aria-pressed", String(archivedView));
  $("#list-title").textContent = archivedView ? "Archived sessions" : "Active sessions";
}

function renderList() {
  const archivedView = state.population === "archived";
  paintSide();
  const rows = $("#rows");
  rows.replaceChildren();
  const empty = $("#list-empty");
  if (!state.sessions.length) {
    empty.hidden = false;
    empty.textContent = state.q
      ? "No titles match."
      : archivedView ? "Nothing archived" : "No active sessions";
    return;
  }
  empty.hidden = true;
  const ids = new Set(state.sessions.map((s) => s.sessionId));
  const children = new Map();
  const roots = [];
  for (const s of state.sessions) {
    const parent = meta(s).parentId;
    if (parent && ids.has(parent)) {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(s);
    } else roots.push(s);
  }
  const build = (list, into) => {
    for (const s of list) {
      const li = rowFor(s);
      const kids = children.get(s.sessionId);
      if (kids) {
        const ul = document.createElement("ul");
        ul.setAttribute("aria-label", `Subagents of ${titleOf(s)}`);
        build(kids, ul);
        li.append(ul);
      }
      into.append(li);
    }
  };
  build(roots, rows);
}

function rowFor(s) {
  const li = document.createElement("li");
  const row = document.createElement("div");
  row.className = "row";
  row.dataset.sessionId = s.sessionId;
  const open = document.createElement("button");
  open.type = "button";
  open.className = "open";
  const t = document.createElement("span");
  t.className = "t";
  t.textContent = titleOf(s);
  const st = document.createElement("span");
  st.className = "status";
  open.append(t, st);
  open.addEventListener("click", () => go(`#/session/${s.sessionId}`));
  paintStatus(st, s.sessionId);
  const more = document.createElement("button");
  more.type = "button";
  more.className = "more";
  more.textContent = "⋯";
  more.setAttribute("aria-label", `Actions for ${titleOf(s)}`);
  more.setAttribute("aria-haspopup", "menu");
  more.setAttribute("aria-expanded", "false");
  more.addEventListener("click", (ev) => {
    ev.stopPropagation();
    toggleMenu(row, more, s);
  });
  row.append(open, more);
  li.append(row);
  return li;
}

function closeMenu(focusBack) {
  const m = state.openMenu;
  if (!m) return;
  state.openMenu = null;
  m.menu.remove();
  m.button.setAttribute("aria-expanded", "false");
  if (focusBack) m.button.focus();
}

function toggleMenu(row, button, s) {
  const wasOpen = state.openMenu && state.openMenu.button === button;
  closeMenu(false);
  if (wasOpen) return;
  const menu = document.createElement("div");
  menu.className = "menu";
  menu.setAttribute("role", "menu");
  const item = (label, fn, cls) => {
    const b = document.createElement("button");
    b.type = "button";
    b.setAttribute("role", "menuitem");
    b.textContent = label;
    if (cls) b.className = cls;
    b.addEventListener("click", () => {
      closeMenu(false);
      fn();
    });
    menu.append(b);
    return b;
  };
  // The move out of the row's state, first, with the other non-destructive actions.
  if (s.archived) item("Restore", () => restore(s));
  else item("Archive", () => archiveFlow(s));
  item("Open", () => go(`#/session/${s.sessionId}`));
  if (!s.archived) item("Rename", () => go(`#/session/${s.sessionId}`, { rename: true }));
  menu.append(document.createElement("hr"));
  item("Delete…", () => deleteFlow(s), "danger");
  menu.addEventListener("keydown", (ev) => {
    const items = [...menu.querySelectorAll("button")];
    const i = items.indexOf(document.activeElement);
    if (ev.key === "Escape") { ev.preventDefault(); closeMenu(true); }
    else if (ev.key === "ArrowDown") { ev.preventDefault(); items[(i + 1) % items.length].focus(); }
    else if (ev.key === "ArrowUp") { ev.preventDefault(); items[(i - 1 + items.length) % items.length].focus(); }
  });
  row.append(menu);
  button.setAttribute("aria-expanded", "true");
  state.openMenu = { menu, button };
  menu.querySelector("button").focus();
}

// ------------------------------------------------------------------ dialogs
function trapFocus(dlg) {
  dlg.addEventListener("keydown", (ev) => {
    if (ev.key !== "Tab") return;
    const f = [...dlg.querySelectorAll("button, input, [href], [tabindex]:not([tabindex='-1'])")]
      .filter((e) => !e.disabled && e.offsetParent !== null);
    if (!f.length) return;
    const first = f[0];
    const last = f[f.length - 1];
    if (ev.shiftKey && document.activeElement === first) { ev.preventDefault(); last.focus(); }
    else if (!ev.shiftKey && document.activeElement === last) { ev.preventDefault(); first.focus(); }
  });
}

function ask(dlg, confirmBtn, cancelBtn) {
  return new Promise((resolve) => {
    const done = (v) => {
      confirmBtn.removeEventListener("click", yes);
      cancelBtn.removeEventListener("click", no);
      dlg.removeEventListener("close", no);
      if (dlg.open) dlg.close();
      resolve(v);
    };
    const yes = () => done(true);
    const no = () => done(false);
    confirmBtn.addEventListener("click", yes);
    cancelBtn.addEventListener("click", no);
    dlg.addEventListener("close", no); // Escape closes (the dialog's cancel)
    dlg.showModal();
    cancelBtn.focus();
  });
}

// ------------------------------------------------------------------ notice
let noticeTimer = null;
function notice(text, undo) {
  const box = $("#notice");
  $("#notice-text").textContent = text;
  const btn = $("#notice-undo");
  btn.hidden = !undo;
  btn.onclick = undo ? () => { hideNotice(); undo(); } : null;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(hideNotice, 20000);
}
function hideNotice() {
  $("#notice").hidden = true;
}

// ------------------------------------------------------------------ lifecycle
async function archiveFlow(s) {
  const name = titleOf(s);
  const path = `/sessions/${enc(s.sessionId)}/archive`;
  const stopped = await stopFlow("POST", path, "archive", name);
  if (stopped !== null) archived(s, name, stopped);
}

// Run a request that live work refuses (archive, delete). On a refusal the dialog lists the
// live items; confirming sends them back (confirmedActivity), so the server stops exactly
// what was shown. If the work changed meanwhile (activity_changed) nothing was written: the
// dialog shows the new list and asks again. Resolves to the items stopped, or null if the
// user declined or the request failed (a notice says why).
async function stopFlow(method, path, verb, name) {
  try {
    await api(method, path, {});
    return [];
  } catch (err) {
    if (!(err instanceof ApiError) || err.code !== "session_active") {
      notice(`Could not ${verb} “${name}”: ${err.message}`);
      return null;
    }
    let items = err.data.activity || [];
    let changed = false;
    for (;;) {
      showRefusal(items, verb, changed);
      const ok = await ask($("#refusal"), $("#refusal-confirm"), $("#refusal-cancel"));
      if (!ok) return null;
      try {
        await api(method, path, { stopActivity: true, confirmedActivity: items });
        return items;
      } catch (err2) {
        if (err2 instanceof ApiError && err2.code === "activity_changed") {
          items = err2.data.activity || [];
          changed = true;
          continue;
        }
        notice(`Could not ${verb} “${name}”: ${err2.message}`);
        return null;
      }
    }
  }
}

function showRefusal(items, verb, changed) {
  $("#refusal-title").textContent = changed
    ? "The work changed since you looked"
    : "This session is still working";
  $("#refusal-text").textContent = changed
    ? `Nothing was stopped. This is what runs now; ${verb === "delete" ? "deleting" : "archiving"} stops all of it first.`
    : verb === "delete"
      ? "Deleting stops everything below first, then deletes the session."
      : "Archiving stops everything below first. Restoring later does not resume it.";
  $("#refusal-confirm").textContent = `Stop and ${verb}`;
  const ul = $("#refusal-items");
  ul.replaceChildren(...items.map((it) => {
    const li = document.createElement("li");
    li.dataset.family = it.family;
    const fam = document.createElement("strong");
    fam.textContent = it.family;
    li.append(fam, `: ${it.label}`);
    return li;
  }));
}

function archived(s, name, stopped) {
  const what = stopped.length
    ? `Archived “${name}” and stopped ${stopped.length} item${stopped.length > 1 ? "s" : ""}.`
    : `Archived “${name}”.`;
  notice(what, () => restore(s, stopped.length));
  refreshAll();
}

async function restore(s, stoppedCount) {
  const name = titleOf(s);
  try {
    await api("POST", `/sessions/${enc(s.sessionId)}/unarchive`);
  } catch (err) {
    notice(`Could not restore “${name}”: ${err.message}`);
    return;
  }
  notice(
    stoppedCount
      ? `Restored “${name}”. The stopped work was not resumed.`
      : `Restored “${name}”. Nothing was resumed: restoring never restarts stopped work.`,
  );
  refreshAll();
}

async function deleteFlow(s) {
  const ok = await ask($("#confirm-delete"), $("#delete-confirm"), $("#delete-cancel"));
  if (!ok) return;
  // Live work refuses the delete: the refusal dialog asks to stop it first.
  const stopped = await stopFlow("DELETE", `/sessions/${enc(s.sessionId)}`, "delete", titleOf(s));
  if (stopped === null) return;
  notice(`Deleted “${titleOf(s)}”.`);
  if (state.selected === s.sessionId) go("#/");
  else refreshAll();
}

// ------------------------------------------------------------------ detail
let current = null; // the selected session's info

function dd(dl, label, value) {
  const dt = document.createElement("dt");
  dt.textContent = label;
  const d = document.createElement("dd");
  d.textContent = value;
  dl.append(dt, d);
  return d;
}

async function loadDetail(id, opts = {}) {
  const box = $("#detail");
  let s;
  try {
    s = await api("GET", `/sessions/${enc(id)}`);
  } catch (err) {
    box.replaceChildren(Object.assign(document.createElement("p"), {
      className: "error", textContent: err.message,
    }));
    return;
  }
  if (state.selected !== id) return;
  const sideChanged = !current || current.sessionId !== id || current.archived !== s.archived;
  current = s;
  const want = s.archived ? "archived" : "active";
  if (sideChanged && state.population !== want) {
    state.population = want;
    loadList();
  }
  // A live refresh never takes a title the user is still editing away from them.
  const editing = document.querySelector("#detail .title-edit");
  if (editing && !sideChanged && !s.archived && !opts.rename) {
    paintDetailActivity();
  } else {
    renderDetail(s, opts);
  }
  if (!s.archived) refreshActivity(id);
}

function renderDetail(s, opts) {
  const box = $("#detail");
  const card = document.createElement("article");
  card.className = "card";
  card.dataset.sessionId = s.sessionId;
  card.dataset.archived = String(s.archived);
  const head = document.createElement("div");
  head.className = "title-box";
  const h = document.createElement("h2");
  h.id = "detail-title";
  h.textContent = titleOf(s);
  head.append(h);
  card.append(head);
  const dl = document.createElement("dl");
  dd(dl, "Working directory", s.cwd);
  const m = meta(s);
  if (m.parentId) {
    const d = dd(dl, "Parent", "");
    const a = document.createElement("a");
    a.href = `#/session/${m.parentId}`;
    a.textContent = m.parentId;
    d.append(a);
  }
  dd(dl, "Last activity", s.updatedAt);
  card.append(dl);
  const actions = document.createElement("div");
  actions.className = "actions";
  if (s.archived) {
    const ro = document.createElement("p");
    ro.className = "readonly";
    ro.textContent = "Archived — read-only.";
    card.insertBefore(ro, dl);
    if (m.archivedAt) dd(dl, "Archived", m.archivedAt);
    let quiet;
    if (m.archiveHazard) {
      const hz = m.archiveHazard;
      quiet = `Archive hazard since ${hz.since}: still live after ${hz.attempts} stop attempts (${(hz.families || []).join(", ")}).`;
    } else if (m.quietAt) quiet = `Went quiet at ${m.quietAt}.`;
    else quiet = "Not yet recorded quiet.";
    dd(dl, "Work", quiet).className = m.archiveHazard ? "error" : "";
    actions.append(button("Restore", () => restore(s), "primary"));
  } else {
    const rename = button("Rename", () => startRename(s));
    rename.id = "rename";
    head.append(rename);
    const act = document.createElement("div");
    act.id = "detail-activity";
    card.append(act);
    actions.append(button("Archive", () => archiveFlow(s)));
  }
  actions.prepend(button("Back to list", () => go(state.population === "archived" ? "#/archived" : "#/")));
  card.append(actions);
  const talk = document.createElement("section");
  talk.id = "conversation";
  talk.setAttribute("aria-label", "Conversation");
  card.append(talk);
  box.replaceChildren(card);
  loadConversation(s.sessionId, talk);
  if (!s.archived) paintDetailActivity();
  if (opts.rename && !s.archived) startRename(s);
}

async function loadConversation(id, box) {
  let data;
  try {
    data = await api("GET", `/sessions/${encodeURIComponent(id)}/conversation?limit=200`);
  } catch (e) {
    box.textContent = `Conversation unavailable: ${e.message}`;
    return;
  }
  const h = document.createElement("h3");
  h.textContent = "Conversation";
  const list = document.createElement("ol");
  list.className = "conversation";
  for (const u of data.updates) {
    const li = document.createElement("li");
    const kind = u.sessionUpdate;
    if (kind === "user_message_chunk" || kind === "agent_message_chunk") {
      li.className = kind === "user_message_chunk" ? "from-user" : "from-agent";
      li.textContent = (u.content && u.content.text) || "";
    } else if (kind === "tool_call") {
      li.className = "tool";
      li.textContent = `tool: ${u.title || ""}`;
    } else if (kind === "tool_call_update") {
      li.className = "tool";
      const cancelled = u._meta && u._meta.agentFleet && u._meta.agentFleet.cancelled;
      const text = (u.content || []).map((c) => (c.content && c.content.text) || "").join(" ");
      li.textContent = `${cancelled ? "cancelled" : u.status}: ${text}`;
    } else continue;
    list.append(li);
  }
  if (!list.children.length) {
    const p = document.createElement("p");
    p.textContent = "No conversation yet.";
    box.replaceChildren(h, p);
  } else box.replaceChildren(h, list);
}

function button(label, fn, cls) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  if (cls) b.className = cls;
  b.addEventListener("click", fn);
  return b;
}

function paintDetailActivity() {
  const box = document.getElementById("detail-activity");
  if (!box || !current) return;
  const items = state.activity.get(current.sessionId);
  const h = document.createElement("h3");
  h.textContent = "Live work";
  const ul = document.createElement("ul");
  for (const it of items || []) {
    const li = document.createElement("li");
    li.textContent = `${it.family}: ${it.label}`;
    ul.append(li);
  }
  const p = document.createElement("p");
  p.textContent = items ? (items.length ? "" : "Idle.") : "…";
  box.replaceChildren(h, items && items.length ? ul : p);
}

function startRename(s) {
  const box = document.querySelector("#detail .title-box");
  if (!box) return;
  const form = document.createElement("form");
  form.className = "title-edit";
  // A one-line textarea: a pasted title keeps its line breaks for the server's normalizer.
  const input = document.createElement("textarea");
  input.rows = 1;
  input.id = "title-input";
  input.value = s.title || "";
  input.setAttribute("aria-label", "Title");
  const err = document.createElement("p");
  err.className = "error";
  err.id = "title-error";
  err.setAttribute("role", "alert");
  const save = button("Save", () => form.requestSubmit(), "primary");
  const cancel = button("Cancel", () => renderDetail(current, {}));
  form.append(input, save, cancel, err);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    try {
      const res = await api("PUT", `/sessions/${enc(s.sessionId)}/title`, { title: input.value });
      current = { ...current, title: res.title };
      renderDetail(current, {});
      loadList();
    } catch (e) {
      err.textContent = e.message;
      input.focus();
    }
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") { ev.preventDefault(); renderDetail(current, {}); }
    else if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); form.requestSubmit(); }
  });
  box.replaceChildren(form);
  input.focus();
  input.select();
}

// ------------------------------------------------------------------ routing
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
  current = null;
  $("#detail").replaceChildren(Object.assign(document.createElement("p"), {
    className: "hint", textContent: "Select a session.",
  }));
  const want = h.startsWith("#/archived") ? "archived" : "active";
  state.population = want;
  loadList();
}

// ------------------------------------------------------------------ live updates
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
    refreshAll();
  };
  for (const type of ["archived", "unarchived", "title", "turn", "gap"]) {
    source.addEventListener(type, onEvent);
  }
}

// ------------------------------------------------------------------ start
function start() {
  $("#token-form").addEventListener("submit", tokenSubmitted);
  $("#token-dialog").addEventListener("cancel", (ev) => ev.preventDefault());
  for (const id of ["#refusal", "#confirm-delete", "#token-dialog"]) trapFocus($(id));
  $("#door").addEventListener("click", () => {
    go(state.population === "archived" ? "#/" : "#/archived");
  });
  $("#search").addEventListener("submit", (ev) => ev.preventDefault());
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
  connectEvents();
  route();
}

start();
