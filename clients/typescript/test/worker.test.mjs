// Worker against the real cluster: it processes jobs within its free slots,
// reports progress (read back through the per-work stream), fails and
// retries, is cancelled through its AbortSignal, times out, carries its
// reports in its pulls (the exchange: almost no report requests), and stops
// gracefully on SIGTERM (in a child process) within its grace period.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { describe, test } from "node:test";
import { Client, PermanentError, Worker } from "../dist/index.js";
import { ADMIN_TOKEN, AS_CLIENT, AS_WORKER, BOUND_TOKEN, NODES, SERVERS, control, deferred, memoryLogger, needsCluster, unique, waitUntil, within } from "./helpers.mjs";

const client = new Client({ ...AS_CLIENT });

/** Runs `fn(worker)` with a started Worker on `queue`, and stops it afterwards. */
async function withWorker(queue, handler, options, fn) {
  const logger = memoryLogger();
  const worker = new Worker({ ...AS_WORKER, id: unique("ts-w"), logger, handleSignals: false, ...options });
  worker.handle(queue, handler);
  const running = worker.run();
  try {
    await waitUntil(async () => (await client.cluster()).workers.some((w) => w.id === worker.id),
      `worker ${worker.id} to register`);
    await fn(worker, logger);
  } finally {
    await worker.stop();
    await running;
  }
  return logger;
}

async function workersListed() {
  return (await client.cluster()).workers.map((w) => w.id);
}

describe("Worker", needsCluster, () => {
  test("processes jobs in its free slots only, and reports progress before the result", async () => {
    const queue = unique("w-process");
    let busy = 0;
    let most = 0;
    const handler = async (job) => {
      most = Math.max(most, ++busy);
      job.progress({ fraction: 0.5, message: "half way", output: `${job.payload} squared\n` });
      await new Promise((r) => setTimeout(r, 100));
      job.progress(1);
      busy--;
      return job.payload * job.payload;
    };
    await withWorker(queue, handler, { capacity: 2 }, async (worker, logger) => {
      const res = await client.submitMany([1, 2, 3, 4, 5].map((n) => ({ queue, payload: n })));
      const done = await Promise.all(res.items.map((it) => client.wait(it.id, { timeout: 20 })));
      assert.deepEqual(done.map((w) => [w.status, w.result, w.attempts, w.worker_id]),
        [1, 2, 3, 4, 5].map((n) => ["completed", n * n, 1, worker.id]));
      assert.equal(most, 2, "a worker of capacity 2 runs two jobs at once, never more");
      assert.ok(done.every((w) => w.progress?.fraction === 1), "the last progress went before the result");

      const events = [];
      for await (const ev of client.stream(res.items[2].id)) events.push(ev);
      const progress = events.filter((e) => e.status === "progress");
      assert.ok(progress.length >= 1, `the stream of a job carries its progress: ${JSON.stringify(events)}`);
      assert.equal(progress.map((e) => e.output ?? "").join(""), "3 squared\n", "output chunks, once each");
      assert.equal(progress.at(-1).fraction, 1);
      assert.equal(progress[0].message, "half way");
      assert.deepEqual(events.at(-1), { ...events.at(-1), status: "completed", result: 9 },
        "the stream ends with the result");
      assert.ok(logger.lines.some((l) => l.includes(`job ${res.items[0].id} attempt 1 completed`)), logger.lines.join("\n"));
    });
  });

  test("a throwing handler fails the attempt; it is retried, or dead at once with PermanentError; retry reopens it", async () => {
    const queue = unique("w-fail");
    let healed = false;
    const handler = async (job) => {
      if (job.payload === "flaky" && job.attempt === 1) throw new Error("boom on the first try");
      if (job.payload === "broken" && !healed) throw new PermanentError("cannot ever work");
      return `ok at attempt ${job.attempt}`;
    };
    await withWorker(queue, handler, {}, async () => {
      const flaky = await client.submit({ queue, payload: "flaky", max_attempts: 3 });
      const broken = await client.submit({ queue, payload: "broken", max_attempts: 3 });
      const f = await client.wait(flaky.id, { timeout: 20 });
      assert.equal(f.status, "completed");
      assert.equal(f.attempts, 2, "the failed attempt was retried");
      assert.equal(f.result, "ok at attempt 2");
      assert.equal(f.last_error, "boom on the first try", "the handler's error is the attempt's error");
      const b = await client.wait(broken.id, { timeout: 20 });
      assert.equal(b.status, "dead");
      assert.equal(b.attempts, 1, "a PermanentError is not retried");
      assert.equal(b.last_error, "cannot ever work");
      healed = true;
      const reopened = await client.retry(broken.id);
      assert.equal(reopened.status, "pending");
      const again = await client.wait(broken.id, { timeout: 20 });
      assert.equal(again.status, "completed");
      assert.equal(again.result, "ok at attempt 2");
    });
  });

  test("a cancelled job's signal aborts, nothing is reported, and the slot is free again", async () => {
    const queue = unique("w-cancel");
    const started = deferred();
    const aborted = deferred();
    const handler = async (job) => {
      if (job.payload === "quick") return "quick";
      started.resolve(job);
      await new Promise((_, reject) =>
        job.signal.addEventListener("abort", () => {
          aborted.resolve(job.signal.reason);
          reject(job.signal.reason);
        }),
      );
    };
    await withWorker(queue, handler, { capacity: 1 }, async (worker, logger) => {
      const { id } = await client.submit({ queue, payload: "long" });
      await within(started.promise, 15_000, "the job to start");
      const t0 = Date.now();
      assert.equal((await client.cancel(id)).status, "cancelled");
      const reason = await within(aborted.promise, 5000, "the cancel to reach the handler's signal");
      assert.equal(reason.name, "AbortError");
      assert.ok(Date.now() - t0 < 3000, `the cancel reached the handler within a heartbeat or so (${Date.now() - t0}ms)`);
      const next = await client.submit({ queue, payload: "quick" });
      assert.equal((await client.wait(next.id, { timeout: 20 })).result, "quick", "the slot was freed");
      const types = [];
      for await (const ev of client.history(id)) types.push(ev.type);
      assert.deepEqual(types, ["accepted", "started", "cancelled"], "nothing reported for the cancelled attempt");
      assert.ok(!logger.lines.some((l) => l.includes("refused")), `no report was sent for it:\n${logger.lines.join("\n")}`);
      assert.ok(logger.lines.some((l) => l.includes(`job ${id} attempt 1 cancelled`)));
      assert.equal(worker.stopped, false);
    });
  });

  test("a job past its timeout is aborted and reported failed", async () => {
    const queue = unique("w-timeout");
    const handler = (job) => new Promise((_, reject) => job.signal.addEventListener("abort", () => reject(job.signal.reason)));
    await withWorker(queue, handler, {}, async () => {
      const { id } = await client.submit({ queue, payload: null, timeout: 0.3, max_attempts: 1 });
      const w = await client.wait(id, { timeout: 20 });
      assert.equal(w.status, "dead");
      assert.equal(w.last_error, "timed out after 300ms");
    });
  });

  test("an id held by a live instance: a second one is refused; one with a token bound to the id takes over", async () => {
    const queue = unique("w-taken");
    const id = unique("ts-bound"); // WORKD_TEST_BOUND_TOKEN is bound to ts-bound-*
    const first = new Worker({ ...AS_WORKER, id, logger: memoryLogger(), handleSignals: false });
    first.handle(queue, () => "first");
    const firstRun = first.run();
    try {
      await waitUntil(async () => (await client.cluster()).workers.some((w) => w.id === id), `worker ${id} to register`);
      const twin = new Worker({ ...AS_WORKER, id, logger: memoryLogger(), handleSignals: false });
      twin.handle(queue, () => "twin");
      await assert.rejects(within(twin.run(), 10_000, "the twin's run()"), (e) => e.kind === "worker-id-taken",
        "a shared worker token cannot take a live worker's id");
      assert.equal(first.stopped, false, "the first instance goes on");

      // A restart with a token bound to the id: the new instance takes over, the old one stops.
      const successor = new Worker({ ...AS_WORKER, token: BOUND_TOKEN, id, logger: memoryLogger(), handleSignals: false });
      successor.handle(queue, () => "successor");
      const successorRun = successor.run();
      try {
        await assert.rejects(within(firstRun, 10_000, "the first instance to stop"), (e) => e.kind === "worker-id-taken");
        const { id: workId } = await client.submit({ queue, payload: 1 });
        assert.equal((await client.wait(workId, { timeout: 20 })).result, "successor", "the new instance works on");
      } finally {
        await successor.stop();
        await successorRun;
      }
    } finally {
      await first.stop();
    }
  });

  test("a report outlives the death of every server: it is sent again until one acknowledges it", async () => {
    const queue = unique("w-report");
    const started = deferred();
    const release = deferred();
    const handler = async (job) => {
      started.resolve();
      await release.promise;
      return `done while the cluster was down (attempt ${job.attempt})`;
    };
    await withWorker(queue, handler, {}, async (worker, logger) => {
      const { id } = await client.submit({ queue, payload: null, timeout: 120 });
      await within(started.promise, 15_000, "the job to start");
      for (const node of NODES) await control("kill", node);
      release.resolve();
      await waitUntil(() => logger.lines.some((l) => l.includes("reports not delivered")),
        "the worker to find no server for its report");
      for (const node of NODES) await control("start", node);
      const w = await client.wait(id, { timeout: 30 });
      assert.equal(w.status, "completed");
      assert.equal(w.attempts, 1, "the report of the first attempt was taken: nothing was run twice");
      assert.equal(w.result, "done while the cluster was down (attempt 1)");
      assert.equal(w.worker_id, worker.id);
    });
  });

  /** The sum over the cluster's nodes of /metrics's workd_http_requests_total of a route. */
  async function requestsOf(route) {
    let total = 0;
    for (const server of SERVERS) {
      const res = await fetch(`${server}/metrics`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
      assert.equal(res.status, 200, `GET ${server}/metrics`);
      for (const line of (await res.text()).split("\n")) {
        if (line.startsWith("workd_http_requests_total{") && line.includes(`route="${route}"`)) {
          total += Number(line.slice(line.lastIndexOf(" ") + 1));
        }
      }
    }
    return total;
  }

  test("200 jobs: each completes once, and the reports ride in the pulls (almost no report requests)", async () => {
    const queue = unique("w-drain");
    const n = 200;
    const calls = new Map();
    const handler = (job) => {
      calls.set(job.id, (calls.get(job.id) ?? 0) + 1);
      return job.payload * 2;
    };
    const { items } = await client.submitMany(Array.from({ length: n }, (_, i) => ({ queue, payload: i })));
    const reports0 = await requestsOf("worker_reports");
    const pulls0 = await requestsOf("worker_pull");
    await withWorker(queue, handler, { capacity: 4 }, async () => {
      const t0 = Date.now();
      const done = await Promise.all(items.map((it) => client.wait(it.id, { timeout: 60 })));
      const took = Date.now() - t0;
      for (const [i, w] of done.entries()) {
        assert.deepEqual([w.status, w.attempts, w.result], ["completed", 1, i * 2], `work ${w.id}`);
      }
      const reports = (await requestsOf("worker_reports")) - reports0;
      const pulls = (await requestsOf("worker_pull")) - pulls0;
      console.log(`${n} jobs in ${took} ms: ${pulls} pulls, ${reports} report requests`);
      assert.ok(reports <= n / 10, `the worker sent ${reports} report requests for ${n} jobs (${pulls} pulls): its reports should ride in its pulls`);
    });
    assert.equal(calls.size, n, "every job ran");
    assert.deepEqual([...new Set(calls.values())], [1], "no job ran twice");
  });

  const child = fileURLToPath(new URL("./fixtures/worker-process.mjs", import.meta.url));

  /** Starts test/fixtures/worker-process.mjs; `next(pred)` waits for a line it prints. */
  async function startChild(queue, grace) {
    const id = unique("ts-child");
    // A follower first: its deregistration (DELETE /workers/{id}?instance=)
    // goes through the proxy to the leader.
    const leader = (await client.cluster()).leader;
    const servers = [...SERVERS.filter((s) => s !== leader), leader].join(" ");
    const proc = spawn(process.execPath, [child], {
      env: {
        ...process.env,
        WORKD_TEST_SERVERS: servers,
        WORKD_TEST_QUEUE: queue,
        WORKD_TEST_WORKER_ID: id,
        WORKD_TEST_GRACE: String(grace),
      },
      stdio: ["ignore", "pipe", "inherit"],
    });
    const lines = [];
    const waiters = [];
    createInterface({ input: proc.stdout }).on("line", (line) => {
      lines.push(JSON.parse(line));
      waiters.forEach((w) => w());
    });
    const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
    const next = (pred, what, ms = 15_000) =>
      new Promise((resolve, reject) => {
        const check = () => {
          const hit = lines.find(pred);
          if (hit) {
            clearTimeout(timer);
            resolve(hit);
          }
        };
        const timer = setTimeout(() => reject(new Error(`child worker: no ${what} after ${ms}ms: ${JSON.stringify(lines)}`)), ms);
        waiters.push(check);
        check();
      });
    return { id, proc, lines, next, exited };
  }

  test("SIGTERM: no new work, the running job finishes and is reported, the worker deregisters", async (t) => {
    const queue = unique("w-sigterm");
    const c = await startChild(queue, 10_000);
    t.after(() => c.proc.kill("SIGKILL"));
    const { id } = await client.submit({ queue, payload: { ms: 1000 } });
    await c.next((l) => l.event === "started" && l.id === id, "job start");
    c.proc.kill("SIGTERM");
    await c.next((l) => l.log?.includes("stopping gracefully"), "graceful stop");
    const later = await client.submit({ queue, payload: { ms: 0 } });
    const exit = await c.exited;
    assert.deepEqual(exit, { code: 0, signal: null }, `the worker exits 0 after a graceful stop: ${JSON.stringify(c.lines)}`);
    assert.ok(c.lines.some((l) => l.event === "finished" && l.id === id), "the running job was let finish");
    assert.ok(c.lines.some((l) => l.event === "stopped"));
    const w = await client.get(id);
    assert.equal(w.status, "completed", "its result was reported before the worker went");
    assert.equal(w.result, "slept 1000ms");
    assert.equal((await client.get(later.id)).status, "pending", "a stopping worker takes no new work");
    assert.ok(!(await workersListed()).includes(c.id), `the worker deregistered: ${JSON.stringify(c.lines)}`);
    await client.cancel(later.id);
  });

  test("SIGTERM: a job still running when the grace period ends is aborted and given back", async (t) => {
    const queue = unique("w-grace");
    const c = await startChild(queue, 300);
    t.after(() => c.proc.kill("SIGKILL"));
    const { id } = await client.submit({ queue, payload: { ms: 60_000 } });
    await c.next((l) => l.event === "started" && l.id === id, "job start");
    const t0 = Date.now();
    c.proc.kill("SIGTERM");
    const exit = await c.exited;
    assert.deepEqual(exit, { code: 0, signal: null }, JSON.stringify(c.lines));
    assert.ok(Date.now() - t0 < 5000, `stopped within the grace period and a little (${Date.now() - t0}ms)`);
    const aborted = c.lines.find((l) => l.event === "aborted");
    assert.match(aborted?.reason ?? "", /stopping/, "the handler's signal said why");
    const w = await client.get(id);
    assert.equal(w.last_error, "worker stopping: grace period over");
    assert.ok(["pending", "scheduled"].includes(w.status), `given back for a retry: ${w.status}`);
    // Another worker finishes it.
    await withWorker(queue, (job) => `done at attempt ${job.attempt}`, {}, async () => {
      const done = await client.wait(id, { timeout: 20 });
      assert.equal(done.result, "done at attempt 2");
    });
  });
});
