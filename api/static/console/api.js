// The REST API: JSON requests with the bearer token this tab holds, asked for on a 401.
import { $, hub } from "./shared.js";

export const TOKEN_KEY = "fleetConsoleToken";

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

export function tokenSubmitted(ev) {
  ev.preventDefault();
  const value = $("#token-input").value.trim();
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  $("#token-dialog").close();
  const waiters = tokenWaiters || [];
  tokenWaiters = null;
  waiters.forEach((w) => w());
  hub.connectEvents();
}

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || "http_error";
    this.data = err.data || {};
  }
}

export async function api(method, path, body) {
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
