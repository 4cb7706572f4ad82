// Client against the real cluster: submit (one, many, idempotent), get, wait,
// cancel, list, history, queues, schedules, errors, and several servers.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Client, WorkdError } from "../dist/index.js";
import { ADMIN_TOKEN, AS_CLIENT, SERVERS, control, needsCluster, unique, waitUntil } from "./helpers.mjs";

describe("Client", needsCluster, () => {
  const client = new Client({ ...AS_CLIENT });

  test("submit gives an item an id, and is idempotent by id", async () => {
    const queue = unique("c-submit");
    const first = await client.submit({ queue, payload: { n: 7 } });
    assert.match(first.id, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
      "an item without id gets a UUID from the client, so that a retried request cannot submit it twice");
    assert.equal(first.created, true);
    assert.equal(first.status, "pending");
    const again = await client.submit({ id: first.id, queue, payload: { n: 7 } });
    assert.deepEqual(again, { id: first.id, status: "pending", created: false },
      "the same id with the same payload is acknowledged, not created again");
    await assert.rejects(client.submit({ id: first.id, queue, payload: { n: 8 } }), (e) => {
      assert.ok(e instanceof WorkdError, `a refusal is a WorkdError, got ${e}`);
      assert.equal(e.status, 409);
      assert.equal(e.kind, "conflict");
      assert.match(e.detail, /payload/);
      return true;
    });
    const work = await client.get(first.id);
    assert.equal(work.queue, queue);
    assert.deepEqual(work.payload, { n: 7 });
    assert.equal(work.status, "pending");
  });

  test("submitMany submits items in order, and opens a batch", async () => {
    const queue = unique("c-many");
    const res = await client.submitMany([
      { queue, payload: 1 },
      { id: unique("mine"), queue, payload: 2, priority: 5 },
      { queue, payload: 3 },
    ]);
    assert.equal(res.items.length, 3);
    for (const it of res.items) assert.equal(it.created, true);
    const payloads = await Promise.all(res.items.map(async (it) => (await client.get(it.id)).payload));
    assert.deepEqual(payloads, [1, 2, 3], "one result per item, in the order given");
    const batchId = unique("batch");
    const batch = await client.submitMany({ items: [{ queue, payload: 4 }], batch: { id: batchId } });
    assert.equal(batch.batch, batchId);
    assert.equal((await client.get(batch.items[0].id)).batch, batchId);
  });

  test("wait gives up after its timeout; cancel ends pending work; wait then returns it", async () => {
    const queue = unique("c-wait");
    const { id } = await client.submit({ queue, payload: null });
    const t0 = Date.now();
    await assert.rejects(client.wait(id, { timeout: 0.5 }), { name: "TimeoutError" });
    assert.ok(Date.now() - t0 < 5000, `wait({timeout: 0.5}) took ${Date.now() - t0}ms`);
    const waiting = client.wait(id);
    const cancelled = await client.cancel(id);
    assert.equal(cancelled.status, "cancelled");
    const done = await waiting;
    assert.equal(done.status, "cancelled", "wait resolves once the work has finished");
    await assert.rejects(client.cancel(id), (e) => e instanceof WorkdError && e.status === 409 &&
      e.kind === "not-cancellable");
    const types = [];
    for await (const ev of client.history(id)) types.push(ev.type);
    assert.deepEqual(types, ["accepted", "cancelled"], "the history of a cancelled item");
  });

  test("an unknown id is a 404 problem", async () => {
    await assert.rejects(client.get(unique("nobody")), (e) => {
      assert.ok(e instanceof WorkdError);
      assert.equal(e.status, 404);
      assert.equal(e.kind, "not-found");
      assert.equal(e.problem.status, 404);
      return true;
    });
  });

  test("list pages work newest first, by queue", async () => {
    const queue = unique("c-list");
    const res = await client.submitMany([1, 2, 3].map((n) => ({ queue, payload: n })));
    const page1 = await client.list({ queue, limit: 2 });
    assert.deepEqual(page1.items.map((w) => w.id), [res.items[2].id, res.items[1].id]);
    const page2 = await client.list({ queue, limit: 2, before: page1.next_before });
    assert.deepEqual(page2.items.map((w) => w.id), [res.items[0].id]);
  });

  test("queues: counts, pause, resume and limits", async () => {
    const queue = unique("c-queue");
    await client.submitMany([{ queue, payload: 1 }, { queue, payload: 2 }]);
    const stats = (await client.queues()).queues.find((q) => q.queue === queue);
    assert.ok(stats, `GET /queues should list ${queue}`);
    assert.equal(stats.pending, 2, `two pending items in ${JSON.stringify(stats)}`);
    assert.equal((await client.pauseQueue(queue)).paused, true);
    assert.equal((await client.resumeQueue(queue)).paused, false);
    const limits = await client.setQueue(queue, { max_running: 3 });
    assert.equal(limits.max_running, 3);
  });

  test("schedules: set, read, list, pause, resume, delete", async () => {
    const name = unique("nightly");
    const queue = unique("c-sched");
    const set = await client.setSchedule(name, { cron: "0 3 * * *", timezone: "UTC", work: { queue, payload: "x" } });
    assert.equal(set.name, name);
    assert.equal(set.cron, "0 3 * * *");
    assert.equal((await client.schedule(name)).work.queue, queue);
    assert.ok((await client.schedules()).some((s) => s.name === name), "schedules() lists it");
    assert.equal((await client.pauseSchedule(name)).paused, true);
    assert.equal((await client.resumeSchedule(name)).paused, false);
    await client.deleteSchedule(name);
    await assert.rejects(client.schedule(name), (e) => e instanceof WorkdError && e.status === 404);
  });

  test("servers are tried in turn: one that refuses connections is passed over", async () => {
    const seen = [];
    const recording = (url, init) => {
      seen.push(new URL(url).origin);
      return fetch(url, init);
    };
    const dead = "http://127.0.0.1:1";
    const c = new Client({ servers: [dead, ...SERVERS], fetch: recording, token: ADMIN_TOKEN });
    const { id } = await c.submit({ queue: unique("c-servers"), payload: 1 });
    assert.equal((await c.get(id)).id, id);
    assert.equal(seen[0], dead, "the first server is tried first");
    assert.equal(seen[1], SERVERS[0], "then the next one");
    assert.equal(seen[2], SERVERS[0], "and the client stays with the one that answered");
  });

  test("the token comes from the option or WORKD_TOKEN, and the servers from WORKD_SERVER", async () => {
    process.env.WORKD_TOKEN = ADMIN_TOKEN;
    process.env.WORKD_SERVER = SERVERS.join(",");
    try {
      const fromEnv = new Client();
      assert.deepEqual(fromEnv.servers, SERVERS);
      assert.ok(Array.isArray((await fromEnv.queues()).queues), "WORKD_TOKEN is sent");
      const wrong = new Client({ token: "not-a-token-of-this-cluster" });
      await assert.rejects(wrong.queues(), (e) => e instanceof WorkdError && e.status === 401 && e.kind === "unauthorized",
        "the option wins over WORKD_TOKEN");
    } finally {
      delete process.env.WORKD_TOKEN;
      delete process.env.WORKD_SERVER;
    }
    await assert.rejects(new Client({ servers: SERVERS }).queues(), (e) => e.status === 401, "no token, no answer");
  });

  test("a 503 (PostgreSQL down) is retried, as Retry-After says, until the server can answer", async () => {
    const { id } = await client.submit({ queue: unique("c-503"), payload: 1 });
    const statuses = [];
    const recording = async (url, init) => {
      const res = await fetch(url, init);
      statuses.push(res.status);
      return res;
    };
    const c = new Client({ ...AS_CLIENT, servers: [SERVERS[0]], fetch: recording, retryFor: 60_000 });
    const auth = { Authorization: `Bearer ${ADMIN_TOKEN}` };
    let reading;
    await control("pg-stop", "db");
    try {
      await waitUntil(async () => (await fetch(`${SERVERS[0]}/work/${id}`, { headers: auth })).status === 503,
        "GET /work/{id} to answer 503 without PostgreSQL", 20_000);
      reading = c.get(id);
      await waitUntil(() => statuses.filter((s) => s === 503).length >= 2, "the client to be answered 503 twice");
    } finally {
      await control("pg-start", "db");
    }
    const work = await reading;
    assert.equal(work.id, id);
    assert.equal(statuses.at(-1), 200, `answers seen: ${statuses}`);
  });
});
