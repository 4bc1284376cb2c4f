// The session view: a card with the session's facts, live work and conversation.
import { api } from "./api.js";
import { archiveFlow, restore } from "./lifecycle.js";
import { loadList, refreshActivity } from "./list.js";
import { $, button, dd, enc, hub, meta, state, titleOf } from "./shared.js";
import { timeEl } from "./time.js";

export async function loadDetail(id, opts = {}) {
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
  const was = state.current;
  const sideChanged = !was || was.sessionId !== id || was.archived !== s.archived;
  state.current = s;
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
  dd(dl, "Last activity", "").append(timeEl(s.updatedAt));
  if (m.createdAt) dd(dl, "Created", "").append(timeEl(m.createdAt));
  if (m.agent) dd(dl, "Agent", m.agent).id = "detail-agent";
  const usage = usageText(s.usage);
  if (usage) dd(dl, "Tokens", usage).className = "usage";
  card.append(dl);
  const actions = document.createElement("div");
  actions.className = "actions";
  if (s.archived) {
    const ro = document.createElement("p");
    ro.className = "readonly";
    ro.textContent = "Archived — read-only.";
    card.insertBefore(ro, dl);
    if (m.archivedAt) dd(dl, "Archived", "").append(timeEl(m.archivedAt));
    const work = dd(dl, "Work", "");
    if (m.archiveHazard) {
      const hz = m.archiveHazard;
      work.className = "error";
      work.append(
        "Archive hazard since ", timeEl(hz.since),
        `: still live after ${hz.attempts} stop attempts (${(hz.families || []).join(", ")}).`,
      );
    } else if (m.quietAt) work.append("Went quiet ", timeEl(m.quietAt), ".");
    else work.textContent = "Not yet recorded quiet.";
    actions.append(button("Restore", () => restore(s), "primary"));
  } else {
    const rename = button("Rename", () => startRename(s));
    rename.id = "rename";
    head.append(rename);
    const act = document.createElement("div");
    act.id = "detail-activity";
    card.append(act);
    if (m.agent) {
      const asks = document.createElement("section");
      asks.id = "permissions";
      asks.setAttribute("aria-label", "Permission requests");
      card.append(asks);
    }
    actions.append(button("Archive", () => archiveFlow(s)));
  }
  actions.prepend(button("Back to list", () => hub.go(state.population === "archived" ? "#/archived" : "#/")));
  card.append(actions);
  const talk = document.createElement("section");
  talk.id = "conversation";
  talk.setAttribute("aria-label", "Conversation");
  card.append(talk);
  box.replaceChildren(card);
  loadConversation(s.sessionId, talk);
  watchPermissions(!s.archived && m.agent ? s.sessionId : null);
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
      const perm = u._meta && u._meta.agentFleet && u._meta.agentFleet.permission;
      if (perm) {
        li.textContent = perm.state === "pending"
          ? "permission asked"
          : `permission answered: ${perm.outcome || ""}`;
        list.append(li);
        continue;
      }
      if (!u.status && !u.content) continue;
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

// The permission requests of the selected session's agent waiting for a person, looked at
// every PERMISSION_POLL_MS while its view is open (they come mid-turn, with no lifecycle
// event), each answered with one of its options.
const PERMISSION_POLL_MS = 1500;
let permissionTimer = null;

function watchPermissions(id) {
  clearInterval(permissionTimer);
  permissionTimer = null;
  if (!id) return;
  loadPermissions(id);
  permissionTimer = setInterval(() => {
    if (state.selected !== id || !document.getElementById("permissions")) {
      clearInterval(permissionTimer);
      return;
    }
    loadPermissions(id);
  }, PERMISSION_POLL_MS);
}

async function loadPermissions(id) {
  let data;
  try {
    data = await api("GET", `/sessions/${enc(id)}/permissions`);
  } catch {
    return; // the next look tries again
  }
  const box = document.getElementById("permissions");
  if (!box || state.selected !== id) return;
  const asks = data.permissions || [];
  const shown = asks.map((p) => p.requestId).join(" ");
  if (box.dataset.shown === shown) return; // unchanged: keep focus where it is
  box.dataset.shown = shown;
  if (!asks.length) { box.replaceChildren(); return; }
  const h = document.createElement("h3");
  h.textContent = "Waiting for you";
  const ul = document.createElement("ul");
  ul.className = "asks";
  for (const p of asks) {
    const li = document.createElement("li");
    li.dataset.requestId = p.requestId;
    const what = document.createElement("p");
    const call = p.toolCall || {};
    what.textContent = `The agent asks to run: ${call.title || call.toolCallId || "a tool"}`;
    const err = document.createElement("p");
    err.className = "error";
    err.setAttribute("role", "alert");
    const choices = document.createElement("div");
    choices.className = "actions";
    for (const o of p.options || []) {
      const allow = String(o.kind || "").startsWith("allow");
      choices.append(button(o.name || o.optionId, async () => {
        try {
          await api("POST", `/sessions/${enc(id)}/permissions/${enc(p.requestId)}`, { outcome: o.optionId });
          box.dataset.shown = "";
          loadPermissions(id);
        } catch (e) {
          err.textContent = e.message;
        }
      }, allow ? "primary" : ""));
    }
    li.append(what, choices, err);
    ul.append(li);
  }
  box.replaceChildren(h, ul);
}

// "12,345 in · 678 out" from the session's `usage` ({inputTokens, outputTokens}), or null
// when the session carries none.
function usageText(u) {
  if (!u || !Number.isInteger(u.inputTokens) || !Number.isInteger(u.outputTokens)) return null;
  return `${u.inputTokens.toLocaleString()} in · ${u.outputTokens.toLocaleString()} out`;
}

export function paintDetailActivity() {
  const box = document.getElementById("detail-activity");
  if (!box || !state.current) return;
  const items = state.activity.get(state.current.sessionId);
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
  const cancel = button("Cancel", () => renderDetail(state.current, {}));
  form.append(input, save, cancel, err);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    try {
      const res = await api("PUT", `/sessions/${enc(s.sessionId)}/title`, { title: input.value });
      state.current = { ...state.current, title: res.title };
      renderDetail(state.current, {});
      loadList();
    } catch (e) {
      err.textContent = e.message;
      input.focus();
    }
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") { ev.preventDefault(); renderDetail(state.current, {}); }
    else if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); form.requestSubmit(); }
  });
  box.replaceChildren(form);
  input.focus();
  input.select();
}
