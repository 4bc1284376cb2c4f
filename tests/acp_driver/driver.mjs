// Drives agent-fleet's ACP agent with the official TypeScript SDK (@agentclientprotocol/sdk 2.x,
// `/unstable` entry point for session/archive, session/unarchive and session/set_title).
//
//   node driver.mjs stdio <cwd> <command> [args...]   spawn the agent (`fleet acp`), talk over stdio
//   node driver.mjs ws <cwd> <ws://host:port/acp>     talk to the API's /acp WebSocket
//
// The agent's environment is this process's (pytest passes FLEET_REDIS_URL/FLEET_KEY_PREFIX).
// Prints one JSON line per check: {"check", "transport", "ok", "detail"?}; then a summary line
// {"done": true, "passed", "failed"}. Exits 0 only if every check passed. The SDK does not
// validate responses, so every response shape is asserted here; incoming notifications are
// parsed by the SDK's schema, and a notification it rejects fails the run.

import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { isDeepStrictEqual } from "node:util";

import * as acp from "@agentclientprotocol/sdk/unstable";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import WebSocket from "ws";

const [transport, cwd, ...target] = process.argv.slice(2);
if (!["stdio", "ws"].includes(transport) || !cwd || target.length === 0) {
  console.error("usage: driver.mjs stdio|ws <cwd> <command...>|<url>");
  process.exit(64);
}

const STEP_TIMEOUT_MS = 30_000;
// The first answer also waits for the agent process to start, slow on a loaded machine
// (pytest passes its startup bound, tests/helpers.py STARTUP_TIMEOUT, in seconds).
const STARTUP_TIMEOUT_MS = 1000 * Number(process.env.FLEET_TEST_STARTUP_TIMEOUT || 120);
let passed = 0;
let failed = 0;

function emit(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

function check(name, ok, detail) {
  const line = { check: name, transport, ok: Boolean(ok) };
  if (!ok && detail !== undefined) line.detail = detail;
  emit(line);
  if (ok) passed += 1;
  else failed += 1;
  return Boolean(ok);
}

function withTimeout(promise, what, ms = STEP_TIMEOUT_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// The SDK logs (and drops) a notification its schema rejects; count those as failures.
const rejectedNotifications = [];
const consoleError = console.error.bind(console);
console.error = (...args) => {
  if (typeof args[0] === "string" && args[0].startsWith("Error handling notification")) {
    rejectedNotifications.push(args.slice(1));
  }
  consoleError(...args);
};

// -- transport --------------------------------------------------------------------------------
let child;
let stream;
if (transport === "stdio") {
  child = spawn(target[0], target.slice(1), {
    stdio: ["pipe", "pipe", "inherit"],
    env: process.env,
  });
  stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
} else {
  stream = createWebSocketStream(target[0], { WebSocket });
}

// Tap the incoming side: every raw message, in arrival order, as the agent sent it.
const raw = [];
const waiters = new Set();
stream = {
  writable: stream.writable,
  readable: stream.readable.pipeThrough(
    new TransformStream({
      transform(message, controller) {
        raw.push(message);
        for (const waiter of [...waiters]) waiter();
        controller.enqueue(message);
      },
    }),
  ),
};

function waitRaw(predicate, what) {
  return withTimeout(
    new Promise((resolve) => {
      const test = () => {
        const index = raw.findIndex(predicate);
        if (index >= 0) {
          waiters.delete(test);
          resolve(index);
        }
      };
      waiters.add(test);
      test();
    }),
    what,
  );
}

const isInfoUpdate = (sessionId, fields) => (m) =>
  m.method === "session/update" &&
  m.params?.sessionId === sessionId &&
  isDeepStrictEqual(m.params.update, { sessionUpdate: "session_info_update", ...fields });

// Typed updates, as the SDK parsed them.
const updates = [];
const app = acp.client({ name: "agent-fleet-test-driver" }).onNotification(
  acp.methods.client.session.update,
  ({ params }) => {
    updates.push(params);
  },
);

async function expectError(promise, code, what) {
  try {
    const result = await withTimeout(promise, what);
    return check(what, false, { expected: code, result });
  } catch (error) {
    const ok =
      error instanceof acp.RequestError &&
      error.code === code &&
      typeof error.message === "string" &&
      error.message.length > 0;
    check(what, ok, { expected: code, code: error?.code, message: error?.message });
    return error;
  }
}

function isSessionInfo(info) {
  return (
    info !== null &&
    typeof info === "object" &&
    typeof info.sessionId === "string" &&
    typeof info.cwd === "string" &&
    info.cwd.startsWith("/") &&
    typeof info.archived === "boolean" &&
    (info.title === undefined || typeof info.title === "string") &&
    (info.updatedAt === undefined || typeof info.updatedAt === "string")
  );
}

async function list(ctx, params, what) {
  const result = await withTimeout(ctx.request(acp.methods.agent.session.list, params), what);
  const ok =
    result !== null &&
    typeof result === "object" &&
    Array.isArray(result.sessions) &&
    result.sessions.every(isSessionInfo) &&
    (result.nextCursor === undefined || typeof result.nextCursor === "string");
  check(`${what}: ListSessionsResponse shape`, ok, result);
  return result;
}

// -- the scripted sequence --------------------------------------------------------------------
async function run(ctx) {
  const S = acp.methods.agent.session;

  const init = await withTimeout(
    ctx.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: {},
      clientInfo: { name: "agent-fleet-test-driver", version: "0.0.0" },
    }),
    "initialize",
    STARTUP_TIMEOUT_MS,
  );
  check("initialize: protocolVersion 1", init?.protocolVersion === 1, init);
  check("initialize: loadSession true", init?.agentCapabilities?.loadSession === true, init);
  const caps = init?.agentCapabilities?.sessionCapabilities ?? {};
  for (const name of ["list", "delete", "close", "resume", "archive", "title", "setTitle"]) {
    check(`initialize: sessionCapabilities.${name} is {}`, isDeepStrictEqual(caps[name], {}), caps);
  }

  const created = await withTimeout(ctx.request(S.new, { cwd, mcpServers: [] }), "session/new");
  const sessionId = created?.sessionId;
  check("newSession: sessionId", typeof sessionId === "string" && sessionId.length > 0, created);

  const titled = await withTimeout(
    ctx.request(S.setTitle, { sessionId, title: "  SDK\n\t title  " }),
    "session/set_title",
  );
  check("setSessionTitle: returns the stored title", isDeepStrictEqual(titled, { title: "SDK title" }), titled);
  await waitRaw(isInfoUpdate(sessionId, { title: "SDK title" }), "title session_info_update");
  check("setSessionTitle: session_info_update with the title", true);

  let listing = await list(ctx, { cwd }, "listSessions default");
  let info = listing.sessions.find((s) => s.sessionId === sessionId);
  check(
    "listSessions default: shows the title and archived false",
    info?.title === "SDK title" && info?.archived === false && listing.nextCursor === undefined,
    listing,
  );

  await expectError(
    ctx.request(S.setTitle, { sessionId, title: " \n " }),
    -32602,
    "setSessionTitle: empty title is -32602",
  ).then((error) =>
    check("setSessionTitle: empty title message", error?.message === "Title must not be empty.", error?.message),
  );

  const archived = await withTimeout(ctx.request(S.archive, { sessionId }), "session/archive");
  check("archiveSession: result {}", isDeepStrictEqual(archived, {}), archived);
  await waitRaw(isInfoUpdate(sessionId, { archived: true }), "archived session_info_update");
  check("archiveSession: session_info_update archived true", true);
  check(
    "archiveSession: idempotent",
    isDeepStrictEqual(await withTimeout(ctx.request(S.archive, { sessionId }), "archive again"), {}),
  );

  listing = await list(ctx, { cwd }, "listSessions default after archive");
  check("listSessions default: archived session hidden", listing.sessions.length === 0, listing);
  listing = await list(ctx, { cwd, archived: "only" }, "listSessions only");
  info = listing.sessions.find((s) => s.sessionId === sessionId);
  check("listSessions only: archived session with archived true", info?.archived === true, listing);
  listing = await list(ctx, { cwd, archived: "include" }, "listSessions include");
  check(
    "listSessions include: archived session listed",
    listing.sessions.some((s) => s.sessionId === sessionId && s.archived === true),
    listing,
  );
  for (const value of [true, false, "yes", 1]) {
    await expectError(
      ctx.request(S.list, { cwd, archived: value }),
      -32602,
      `listSessions archived ${JSON.stringify(value)} is -32602`,
    );
  }
  await expectError(ctx.request(S.list, { cursor: "garbled" }), -32602, "listSessions garbled cursor is -32602");

  const unarchived = await withTimeout(ctx.request(S.unarchive, { sessionId }), "session/unarchive");
  check("unarchiveSession: result {}", isDeepStrictEqual(unarchived, {}), unarchived);
  await waitRaw(isInfoUpdate(sessionId, { archived: false }), "unarchived session_info_update");
  check("unarchiveSession: session_info_update archived false", true);
  listing = await list(ctx, { cwd }, "listSessions default after unarchive");
  info = listing.sessions.find((s) => s.sessionId === sessionId);
  check("listSessions default: unarchived session back, archived false", info?.archived === false, listing);

  const unknown = "sess_" + "9".repeat(24);
  await expectError(ctx.request(S.archive, { sessionId: unknown }), -32002, "archiveSession unknown is -32002");
  await expectError(ctx.request(S.unarchive, { sessionId: unknown }), -32002, "unarchiveSession unknown is -32002");
  await expectError(
    ctx.request(S.setTitle, { sessionId: unknown, title: "x" }),
    -32002,
    "setSessionTitle unknown is -32002",
  );

  // A prompt: every update of the turn arrives before the session/prompt response.
  const before = updates.length;
  const response = await withTimeout(
    ctx.request(S.prompt, { sessionId, prompt: [{ type: "text", text: "say hi" }] }),
    "session/prompt",
    45_000,
  );
  check("prompt: stopReason end_turn", isDeepStrictEqual(response, { stopReason: "end_turn" }), response);
  const texts = updates
    .slice(before)
    .filter((n) => n.sessionId === sessionId && n.update.sessionUpdate === "agent_message_chunk")
    .map((n) => n.update.content?.text);
  check("prompt: agent_message_chunk 'hi' before the response", isDeepStrictEqual(texts, ["hi"]), texts);
  listing = await list(ctx, { cwd }, "listSessions after prompt");
  info = listing.sessions.find((s) => s.sessionId === sessionId);
  check("prompt: a client-set title is not replaced by a generated one", info?.title === "SDK title", info);

  // The SDK's own session helper (session/new + routed updates + prompt).
  const session = await withTimeout(ctx.buildSession(cwd).start(), "buildSession().start()");
  try {
    const [text, stop] = await withTimeout(
      Promise.all([session.readText(), session.prompt("say from the helper")]),
      "ActiveSession prompt",
      45_000,
    );
    check("ActiveSession: readText collects the agent's text", text === "from the helper", text);
    check("ActiveSession: prompt ends with end_turn", stop?.stopReason === "end_turn", stop);
  } finally {
    session.dispose();
  }

  const deleted = await withTimeout(ctx.request(S.delete, { sessionId }), "session/delete");
  check("deleteSession: result {}", isDeepStrictEqual(deleted, {}), deleted);
  listing = await list(ctx, { cwd, archived: "include" }, "listSessions after delete");
  check(
    "deleteSession: gone from every list",
    !listing.sessions.some((s) => s.sessionId === sessionId),
    listing,
  );
}

// -- main -------------------------------------------------------------------------------------
const watchdog = setTimeout(() => {
  check("driver finished in time", false, "watchdog fired after 120 s");
  emit({ done: true, passed, failed });
  child?.kill("SIGKILL");
  process.exit(2);
}, 120_000);

try {
  await app.connectWith(stream, run);
} catch (error) {
  check("scripted sequence ran to the end", false, String(error?.stack ?? error));
}
check("no notification rejected by the SDK's schema", rejectedNotifications.length === 0, rejectedNotifications);
check(
  "every message from the agent is JSON-RPC 2.0",
  raw.every((m) => m?.jsonrpc === "2.0"),
  raw.filter((m) => m?.jsonrpc !== "2.0"),
);
check(
  "no -32603 internal error",
  !raw.some((m) => m?.error?.code === -32603),
  raw.filter((m) => m?.error?.code === -32603),
);

if (child) {
  child.stdin.end();
  const exited = await Promise.race([
    new Promise((resolve) => {
      if (child.exitCode !== null) resolve(child.exitCode);
      else child.once("exit", (code) => resolve(code));
    }),
    new Promise((resolve) => setTimeout(() => resolve("timeout"), 10_000)),
  ]);
  check("agent exits cleanly when stdin closes", exited === 0, exited);
  if (exited === "timeout") child.kill("SIGKILL");
}
clearTimeout(watchdog);
emit({ done: true, passed, failed });
process.exit(failed === 0 ? 0 : 1);
