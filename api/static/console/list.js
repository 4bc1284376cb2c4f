// The session list: one population at a time (or a search's results), rows and row menus.
import { api } from "./api.js";
import { archiveFlow, deleteFlow, restore } from "./lifecycle.js";
import { $, enc, hub, meta, state, titleOf } from "./shared.js";
import { setTime, timeEl } from "./time.js";
// The activity families' labels, from the family registry (served by api/console.py).
import { FAMILIES } from "/console/families.js";

let loadSeq = 0;

export async function loadList() {
  const seq = ++loadSeq;
  paintSide();
  // A search spans both sides; a result opens on the side that holds it (openResult).
  const archived = state.q ? "include" : state.population === "archived" ? "only" : "exclude";
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
  const live = state.sessions.filter((s) => !s.archived);
  await Promise.all(live.map((s) => refreshActivity(s.sessionId)));
}

export async function refreshActivity(id) {
  try {
    const data = await api("GET", `/sessions/${enc(id)}/activity`);
    state.activity.set(id, data.activity);
  } catch {
    state.activity.delete(id);
  }
  const el = document.querySelector(`.row[data-session-id="${CSS.escape(id)}"] .status`);
  if (el) paintStatus(el, id);
  if (state.selected === id) hub.paintDetailActivity();
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
  const row = el.closest(".row");
  if (row && row.dataset.archived === "true") {
    el.textContent = "archived";
    el.classList.remove("busy");
    return;
  }
  const [text, busy] = statusText(state.activity.get(id));
  el.textContent = text;
  el.classList.toggle("busy", busy);
}

export function paintSide() {
  const archivedView = state.population === "archived";
  $("#door").setAttribute("aria-pressed", String(archivedView));
  $("#list-title").textContent = state.q
    ? "Search results, active and archived"
    : archivedView ? "Archived sessions" : "Active sessions";
  $("#search-toggle").setAttribute("aria-expanded", String(!$("#search").hidden));
}

// The rows on the page by session id, each with the session it shows as last read. A live
// refresh updates these rows in place rather than building new ones, so a row's open menu,
// the focus in it and the element under the pointer survive a change to any other session.
const shown = new Map(); // sessionId -> { li, s }

function renderList() {
  const archivedView = state.population === "archived";
  paintSide();
  const rows = $("#rows");
  const empty = $("#list-empty");
  const wanted = new Set(state.sessions.map((s) => s.sessionId));
  for (const [id, entry] of shown) {
    if (wanted.has(id)) continue;
    entry.li.remove();
    shown.delete(id);
  }
  empty.hidden = state.sessions.length > 0;
  if (!state.sessions.length) {
    empty.textContent = state.q
      ? "No titles match."
      : archivedView ? "Nothing archived" : "No active sessions";
  }
  // Subagents nest under their parent on the active side only: the archive is a flat
  // cold-storage list, and search results span both sides.
  const nest = !archivedView && !state.q;
  const children = new Map();
  const roots = [];
  for (const s of state.sessions) {
    const parent = meta(s).parentId;
    if (nest && parent && wanted.has(parent)) {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(s);
    } else roots.push(s);
  }
  const place = (list, into) => {
    const lis = list.map((s) => {
      const li = rowFor(s);
      const kids = children.get(s.sessionId);
      let ul = li.querySelector(":scope > ul");
      if (!kids) {
        if (ul) ul.remove();
        return li;
      }
      if (!ul) ul = li.appendChild(document.createElement("ul"));
      ul.setAttribute("aria-label", `Subagents of ${titleOf(s)}`);
      place(kids, ul);
      return li;
    });
    placeInOrder(into, lis);
  };
  place(roots, rows);
  // The open menu's row is gone (its session left this list): forget the menu.
  if (state.openMenu && !state.openMenu.menu.isConnected) closeMenu(false);
}

// Make `lis` the children of `into`, in this order, moving only the rows out of place (a
// moved element loses the focus). A session with news moves up to its place; the rows it
// passes stay where they are.
function placeInOrder(into, lis) {
  const keep = new Set(lis);
  for (const child of [...into.children]) if (!keep.has(child)) child.remove();
  let at = into.firstElementChild;
  for (const li of lis) {
    if (li === at) at = at.nextElementSibling;
    else into.insertBefore(li, at);
  }
}

// The row of `s`: the one on the page, its changed parts repainted, or a new one.
function rowFor(s) {
  const id = s.sessionId;
  let entry = shown.get(id);
  if (!entry) {
    entry = { li: newRow(id), s };
    shown.set(id, entry);
  }
  entry.s = s;
  const row = entry.li.querySelector(":scope > .row");
  const archived = String(Boolean(s.archived));
  // The open menu offers the moves of the side the session was on: close it when it moved.
  if (row.dataset.archived !== archived && state.openMenu && row.contains(state.openMenu.menu)) {
    closeMenu(false);
  }
  row.dataset.archived = archived;
  const title = titleOf(s);
  const t = row.querySelector(".t");
  if (t.textContent !== title) t.textContent = title;
  const more = row.querySelector("button.more");
  if (more.getAttribute("aria-label") !== `Actions for ${title}`) {
    more.setAttribute("aria-label", `Actions for ${title}`);
  }
  setTime(row.querySelector("time.when"), s.updatedAt);
  paintStatus(row.querySelector(".status"), id);
  return entry.li;
}

// An empty row for session `id`; its handlers act on the session as last read (`shown`).
function newRow(id) {
  const current = () => shown.get(id).s;
  const li = document.createElement("li");
  const row = document.createElement("div");
  row.className = "row";
  row.dataset.sessionId = id;
  const open = document.createElement("button");
  open.type = "button";
  open.className = "open";
  const t = document.createElement("span");
  t.className = "t";
  const st = document.createElement("span");
  st.className = "status";
  const sub = document.createElement("span");
  sub.className = "sub";
  sub.append(st, timeEl(""));
  open.append(t, sub);
  open.addEventListener("click", () => {
    if (state.q) hub.openResult(current());
    else hub.go(`#/session/${id}`);
  });
  const more = document.createElement("button");
  more.type = "button";
  more.className = "more";
  more.textContent = "⋯";
  more.setAttribute("aria-haspopup", "menu");
  more.setAttribute("aria-expanded", "false");
  more.addEventListener("click", (ev) => {
    ev.stopPropagation();
    toggleMenu(row, more, current);
  });
  // A right-click (or the context-menu key) opens the same menu as the ⋯ button.
  row.addEventListener("contextmenu", (ev) => {
    if (row.querySelector(".menu") && row.querySelector(".menu").contains(ev.target)) return;
    ev.preventDefault();
    if (!(state.openMenu && state.openMenu.button === more)) toggleMenu(row, more, current);
  });
  row.append(open, more);
  li.append(row);
  return li;
}

export function closeMenu(focusBack) {
  const m = state.openMenu;
  if (!m) return;
  state.openMenu = null;
  m.menu.remove();
  m.button.setAttribute("aria-expanded", "false");
  if (focusBack) m.button.focus();
}

// `current()` answers the row's session as last read, when the menu opens and when an item
// is chosen (a refresh may have come in between).
function toggleMenu(row, button, current) {
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
  const s = current();
  // The move out of the row's state, first, with the other non-destructive actions.
  if (s.archived) item("Restore", () => restore(current()));
  else item("Archive", () => archiveFlow(current()));
  item("Open", () => hub.go(`#/session/${s.sessionId}`));
  if (!s.archived) item("Rename", () => hub.go(`#/session/${s.sessionId}`, { rename: true }));
  menu.append(document.createElement("hr"));
  item("Delete…", () => deleteFlow(current()), "danger");
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
