// The results stream across server restarts: every result once, in seq order,
// none lost and none repeated, whether the stream waits for its own node to
// come back or moves on to another one.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Client, Worker } from "../dist/index.js";
import { AS_CLIENT, AS_WORKER, NODES, SERVERS, control, memoryLogger, needsCluster, unique, waitUntil, within } from "./helpers.mjs";

/** Reads a stream into `seen` in the background until it yields `stopId`. */
function collect(stream, stopId) {
  const seen = [];
  const done = (async () => {
    for await (const ev of stream) {
      seen.push(ev);
      if (ev.id === stopId) break;
    }
  })();
  return { stream, seen, done };
}

function checkOnceInOrder(seen, ids, what) {
  const counts = new Map();
  for (const ev of seen) counts.set(ev.id, (counts.get(ev.id) ?? 0) + 1);
  const missing = ids.filter((id) => !counts.has(id));
  const twice = [...counts].filter(([, n]) => n > 1).map(([id]) => id);
  assert.deepEqual(missing, [], `${what}: results lost`);
  assert.deepEqual(twice, [], `${what}: results yielded twice`);
  const seqs = seen.map((e) => e.seq);
  assert.deepEqual(seqs, [...seqs].sort((x, y) => x - y), `${what}: results out of seq order`);
}

describe("results()", needsCluster, () => {
  test("follows the results across a node's restart: nothing lost, nothing repeated", async (t) => {
    const [a, b] = NODES;
    const queue = unique("r-restart");
    const client = new Client({ ...AS_CLIENT });
    // The worker talks to node a first too: the kill cuts its pull, its heartbeats move on.
    const worker = new Worker({ ...AS_WORKER, id: unique("ts-r"), logger: memoryLogger(), handleSignals: false });
    worker.handle(queue, (job) => job.payload * 10);
    const running = worker.run();
    t.after(async () => {
      await worker.stop();
      await running;
    });
    const stopId = unique("last");
    // One stream that can only use node a (it waits for a to come back), one
    // that may move on to b; both from the start of the log, filtered by queue.
    const onlyA = collect(new Client({ ...AS_CLIENT, servers: [SERVERS[0]] }).results({ queue, after: 0, idleTimeout: 10_000 }), stopId);
    const either = collect(client.results({ queue }), stopId);
    // Without `after`, a stream starts at its node's present: wait for that.
    await waitUntil(() => either.stream.lastEventId !== undefined, "the stream from now to start");

    const ids = [];
    const submitAll = async (n) => {
      const res = await client.submitMany(Array.from({ length: n }, (_, i) => ({ queue, payload: i })));
      ids.push(...res.items.map((it) => it.id));
      await Promise.all(res.items.map((it) => client.wait(it.id, { timeout: 20 })));
    };
    await submitAll(5);
    await waitUntil(() => onlyA.seen.length === 5 && either.seen.length === 5, "both streams to get the first five");

    await control("kill", a);
    await submitAll(5); // submitted and finished while a is down: through b
    await waitUntil(() => either.seen.length === 10, "the stream that can move on to see the results finished meanwhile");
    assert.equal(onlyA.seen.length, 5, "the stream bound to a cannot have more while a is down");
    await control("start", a);
    await submitAll(5);
    await client.submit({ id: stopId, queue, payload: 0 });
    await client.wait(stopId, { timeout: 20 });
    await Promise.all([onlyA.done, either.done]);
    ids.push(stopId);
    checkOnceInOrder(onlyA.seen, ids, "the stream that waited for node a");
    checkOnceInOrder(either.seen, ids, "the stream that moved to node b");
    assert.equal(onlyA.seen.length, ids.length);
    assert.equal(either.seen.length, ids.length);
    for (const ev of onlyA.seen) assert.equal(ev.status, "completed");
  });

  test("moves on from a node that hangs (no keep-alive within idleTimeout; the cluster sends one every 2 s) and resumes where it was", async (t) => {
    // Hang the node that does not lead (a stopped leader would hold its lock).
    const client = new Client({ ...AS_CLIENT });
    const leader = (await client.cluster()).leader;
    const i = SERVERS.indexOf(leader);
    assert.ok(i >= 0, `the leader ${leader} should be one of ${SERVERS}`);
    const [follower, followerNode] = [SERVERS[1 - i], NODES[1 - i]];
    const queue = unique("r-hang");
    const worker = new Worker({ ...AS_WORKER, servers: [leader], id: unique("ts-r"), logger: memoryLogger(), handleSignals: false });
    worker.handle(queue, (job) => job.payload);
    const running = worker.run();
    t.after(async () => {
      await control("cont", followerNode);
      await worker.stop();
      await running;
    });
    const submitter = new Client({ ...AS_CLIENT, servers: [leader] });
    const stopId = unique("last");
    const s = collect(new Client({ ...AS_CLIENT, servers: [follower, leader] }).results({ queue, after: 0, idleTimeout: 3000 }), stopId);
    const ids = [];
    const submitOne = async (payload, id) => {
      const r = await submitter.submit({ queue, payload, ...(id ? { id } : {}) });
      ids.push(r.id);
      await submitter.wait(r.id, { timeout: 20 });
    };
    await submitOne(1);
    await waitUntil(() => s.seen.length === 1, "the first result on the follower's stream");
    await control("stop", followerNode);
    const t0 = Date.now();
    await submitOne(2);
    await submitOne(3, stopId);
    await within(s.done, 15_000, "the stream to move on to the leader after its node hung");
    assert.ok(Date.now() - t0 < 10_000, `it took ${Date.now() - t0}ms (idleTimeout 3000 ms)`);
    checkOnceInOrder(s.seen, ids, "the stream whose node hung");
    assert.equal(s.seen.length, 3);
  });

  test("a stream ended by the consumer can be resumed from its lastEventId", async (t) => {
    const queue = unique("r-resume");
    const client = new Client({ ...AS_CLIENT });
    const worker = new Worker({ ...AS_WORKER, id: unique("ts-r"), logger: memoryLogger(), handleSignals: false });
    worker.handle(queue, (job) => job.payload);
    const running = worker.run();
    t.after(async () => {
      await worker.stop();
      await running;
    });
    const res = await client.submitMany([1, 2, 3, 4].map((n) => ({ queue, payload: n })));
    await Promise.all(res.items.map((it) => client.wait(it.id, { timeout: 20 })));
    const first = client.results({ queue, after: 0 });
    const got = [];
    for await (const ev of first) {
      got.push(ev.result);
      if (got.length === 2) break;
    }
    const rest = client.results({ queue, after: first.lastEventId });
    for await (const ev of rest) {
      got.push(ev.result);
      if (got.length === 4) rest.close();
    }
    assert.deepEqual(got.sort(), [1, 2, 3, 4]);
  });
});
