// What the tests share: the cluster that tests/integration/test_client_typescript.py
// started (WORKD_TEST_SERVERS, WORKD_TEST_NODES) and its control endpoint
// (WORKD_TEST_CONTROL) to kill and restart nodes.
import { randomBytes } from "node:crypto";

export const SERVERS = (process.env.WORKD_TEST_SERVERS ?? "").split(/\s+/).filter(Boolean);
// The cluster wants tokens: an admin token (every scope), a worker token
// shared by workers, and one bound to the worker ids `ts-bound-*`.
export const ADMIN_TOKEN = process.env.WORKD_TEST_ADMIN_TOKEN;
export const WORKER_TOKEN = process.env.WORKD_TEST_WORKER_TOKEN;
export const BOUND_TOKEN = process.env.WORKD_TEST_BOUND_TOKEN;
/** Options of a Client of the cluster, and of a Worker. */
export const AS_CLIENT = { servers: SERVERS, token: ADMIN_TOKEN };
export const AS_WORKER = { servers: SERVERS, token: WORKER_TOKEN };
export const NODES = (process.env.WORKD_TEST_NODES ?? "").split(/\s+/).filter(Boolean);
const CONTROL = process.env.WORKD_TEST_CONTROL;

/** Options for a suite of node:test: a time limit, and skipped (saying why) without a cluster. */
export const needsCluster = SERVERS.length
  ? { timeout: 60_000 }
  : { skip: "no cluster: run tests/integration/test_client_typescript.py (WORKD_TEST_SERVERS unset)" };

/** A name no other test uses (queues, work ids, worker ids). */
export function unique(prefix) {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** Kills (SIGKILL) or starts again a node of the cluster, by name (a, b). */
export async function control(action, node) {
  const res = await fetch(`${CONTROL}/${action}/${node}`, { method: "POST" });
  const body = await res.json();
  if (res.status !== 200) throw new Error(`control ${action} ${node}: ${body.error}`);
}

/** Polls `pred` until it returns a truthy value (returned), or fails saying `what`. */
export async function waitUntil(pred, what, timeoutMs = 15_000, intervalMs = 50) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await pred();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) {
      throw new Error(`timed out after ${timeoutMs}ms waiting for ${what}${last ? ` (last error: ${last})` : ""}`);
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** A logger that keeps lines, for asserting on what a Worker said. */
export function memoryLogger() {
  const lines = [];
  const add = (level) => (m) => lines.push(`${level} ${m}`);
  return { lines, info: add("info"), warn: add("warn"), error: add("error") };
}

/** A promise and its resolve, to let a handler wait for the test. */
export function deferred() {
  let resolve, reject;
  const promise = new Promise((a, b) => ((resolve = a), (reject = b)));
  return { promise, resolve, reject };
}

/** `promise`'s value, or a failure saying `what` when it takes more than `ms`. */
export async function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing after ${ms}ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}
