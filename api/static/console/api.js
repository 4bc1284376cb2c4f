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

// A new idempotency key: a request sent with one may be sent again without being applied twice.
export function newIdempotencyKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) =>
    b.toString(16).padStart(2, "0"),
  ).join("");
}

// How often a request with an idempotency key is sent again after a 503 or a lost answer.
const KEYED_RETRIES = 3;

// `idempotencyKey` (session creation, prompts): sent as the Idempotency-Key header, and the
// request is sent again with it when its answer was lost (the connection failed) or was a
// 503, the server's "may have been applied": the retry answers what was done, once.
export async function api(method, path, body, { idempotencyKey } = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
    const retry = idempotencyKey && attempt < KEYED_RETRIES;
    let res;
    try {
      res = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      if (!retry) throw e;
      await new Promise((r) => setTimeout(r, 250 * 2 ** attempt));
      continue;
    }
    if (res.status === 503 && retry) {
      await new Promise((r) => setTimeout(r, 250 * 2 ** attempt));
      continue;
    }
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
