// Dialogs, the notice, and the lifecycle moves: archive (with the refusal dialog), restore,
// delete.
import { ApiError, api } from "./api.js";
import { $, enc, hub, state, titleOf } from "./shared.js";

export function trapFocus(dlg) {
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

let noticeTimer = null;

export function notice(text, undo) {
  const box = $("#notice");
  $("#notice-text").textContent = text;
  const btn = $("#notice-undo");
  btn.hidden = !undo;
  btn.onclick = undo ? () => { hideNotice(); undo(); } : null;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(hideNotice, 20000);
}

export function hideNotice() {
  $("#notice").hidden = true;
}

export async function archiveFlow(s) {
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
      ? "Deleting stops everything below first, then deletes the session and its subagents."
      : "Archiving stops everything below first. Restoring later does not resume it.";
  $("#refusal-confirm").textContent = `Stop and ${verb}`;
  const ul = $("#refusal-items");
  ul.replaceChildren(...items.map((it) => {
    const li = document.createElement("li");
    li.dataset.family = it.family;
    li.dataset.id = it.id;
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
  hub.refreshAll();
}

export async function restore(s, stoppedCount) {
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
  hub.refreshAll();
}

export async function deleteFlow(s) {
  const ok = await ask($("#confirm-delete"), $("#delete-confirm"), $("#delete-cancel"));
  if (!ok) return;
  // Live work refuses the delete: the refusal dialog asks to stop it first.
  const stopped = await stopFlow("DELETE", `/sessions/${enc(s.sessionId)}`, "delete", titleOf(s));
  if (stopped === null) return;
  notice(`Deleted “${titleOf(s)}”.`);
  if (state.selected === s.sessionId) hub.go("#/");
  else hub.refreshAll();
}
