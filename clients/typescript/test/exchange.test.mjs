// The Worker's exchange (docs/worker-api.md: a pull carries the finished
// reports, its answer says what became of them) against a scripted server
// (a real HTTP server on loopback that speaks the worker protocol for one
// worker id; no cluster needed): reports ride in the pulls, the results are
// read as the reports route's, a lost answer sends them again, a server
// older than the exchange gets them on their own, and a report with no pull
// coming is not held. The same against a real cluster is in worker.test.mjs.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";
import { Worker } from "../dist/index.js";
import { memoryLogger, waitUntil } from "./helpers.mjs";

const FINAL = new Set(["accepted", "superseded", "cancelled", "not-found", "not-holder"]);

/**
 * The worker protocol of worker "w": hands out `jobs` (a pull with none
 * holds up to `hold` ms for one), answers reports on the reports route and,
 * unless `old`, in a pull. An old one refuses a pull naming 'reports' (400),
 * as a server older than the exchange does. `verdicts` maps a work id to
 * what its reports get in turn (a refusal's reason, or "other-entry": the
 * answer's entry is of another attempt), then acceptance. The answers of the
 * first `lose` pulls that carry reports are lost (the connection ends; the
 * reports were decided). `reported` keeps each report that came: { route,
 * id, attempt, verdict, at }; `pulls` each pull: { max, wait, reports }.
 */
async function scriptedWorkd({ jobs = [], old = false, verdicts = {}, lose = 0, hold = 1000 } = {}) {
  const queue = [];
  const waiting = new Set();
  const reported = [];
  const pulls = [];
  const script = Object.fromEntries(Object.entries(verdicts).map(([k, v]) => [k, [...v]]));
  const add = (ids) => {
    queue.push(...ids.map((id) => ({ id, attempt: 1, queue: "q", priority: 0, payload: id, timeout_ms: 60_000, deadline: new Date(Date.now() + 60_000).toISOString() })));
    for (const w of waiting) w();
  };
  add(jobs);
  const decide = (route, r) => {
    const verdict = script[r.id]?.shift() ?? "accepted";
    reported.push({ route, id: r.id, attempt: r.attempt, verdict, at: Date.now() });
    if (verdict === "accepted") return { id: r.id, attempt: r.attempt, accepted: true, status: "completed" };
    if (verdict === "other-entry") return { id: r.id, attempt: r.attempt + 1, accepted: true };
    return { id: r.id, attempt: r.attempt, accepted: false, reason: verdict };
  };
  const json = (res, status, body, type = "application/json") => {
    const text = JSON.stringify(body);
    res.writeHead(status, { "Content-Type": type, "Content-Length": Buffer.byteLength(text) }).end(text);
  };
  const routes = {
    "PUT /workers/w": (res) => json(res, 200, { heartbeat_interval_ms: 500, cancel: [] }),
    "DELETE /workers/w": (res) => res.writeHead(204).end(),
    "POST /workers/w/progress": (res, body) => json(res, 200, { results: body.progress.map(() => ({ accepted: true })) }),
    "POST /workers/w/reports": (res, body) => json(res, 200, { results: body.reports.map((r) => decide("reports", r)) }),
    "POST /workers/w/pull": async (res, body, req) => {
      pulls.push({ max: body.max, wait: body.wait, reports: body.reports?.length ?? 0 });
      if (body.reports !== undefined && old) {
        return json(res, 400, {
          type: "https://workd.dev/problems/unknown-field",
          title: "Bad Request",
          status: 400,
          detail: "the pull has an unknown field 'reports' (known: instance, max, wait, queues, peek)",
        }, "application/problem+json");
      }
      const results = body.reports?.map((r) => decide("pull", r));
      if (results && lose > 0) {
        lose--;
        req.socket.destroy(); // no answer
        return;
      }
      if (queue.length === 0 && body.wait > 0) {
        await new Promise((resolve) => {
          const done = () => {
            clearTimeout(timer);
            waiting.delete(done);
            resolve();
          };
          const timer = setTimeout(done, Math.min(body.wait * 1000, hold));
          waiting.add(done);
        });
      }
      const answer = { jobs: queue.splice(0, body.max) };
      if (results) answer.results = results;
      json(res, 200, answer);
    },
  };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const route = routes[`${req.method} ${req.url.split("?")[0]}`];
      const text = Buffer.concat(chunks).toString();
      if (!route) res.writeHead(404).end();
      else void route(res, text ? JSON.parse(text) : undefined, req);
    });
    res.on("error", () => {});
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    reported,
    pulls,
    add,
    of: (id) => reported.filter((r) => r.id === id).map((r) => [r.route, r.verdict]),
    /** Waits until each of ids had a report accepted or refused for good. */
    settled: (ids) => waitUntil(() => ids.every((id) => reported.some((r) => r.id === id && FINAL.has(r.verdict))),
      `the reports of ${ids.length} jobs`, 20_000),
    close: () => {
      for (const w of waiting) w();
      server.closeAllConnections();
      server.close();
    },
  };
}

/** A started Worker "w" of srv, queue "q"; stop it with `await stop()`. */
function startWorker(srv, capacity, handler = (job) => job.payload) {
  const logger = memoryLogger();
  const worker = new Worker({ servers: srv.url, id: "w", capacity, handleSignals: false, logger, pollWait: 30 });
  worker.handle("q", handler);
  const running = worker.run();
  return {
    worker,
    logger,
    stop: async () => {
      await worker.stop({ now: true });
      await running; // rejects if the worker stopped on an error
    },
  };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("every slot busy: the slot that frees pulls at once, carrying the report; the reports route is never asked", { timeout: 30_000 }, async () => {
  // One slot: each report is made while the puller waits for the slot, so
  // it rides in the pull whatever the timing (a drain with several slots,
  // against a real server, is in worker.test.mjs).
  const ids = Array.from({ length: 60 }, (_, i) => `j${i}`);
  const srv = await scriptedWorkd({ jobs: ids });
  const w = startWorker(srv, 1, async (job) => {
    await sleep(5);
    return job.payload;
  });
  try {
    await srv.settled(ids);
    await sleep(300); // a declared window: a report sent twice would come here
    assert.deepEqual(srv.reported.map((r) => r.id).sort(), [...ids].sort(), "each report once");
    const own = srv.reported.filter((r) => r.route === "reports").length;
    assert.equal(own, 0, `${own} of ${ids.length} reports went on their own`);
    const carrying = srv.pulls.filter((p) => p.reports > 0);
    assert.ok(carrying.every((p) => p.wait === 0), `a pull that carries reports waits for no job: ${JSON.stringify(srv.pulls)}`);
    console.log(`60 jobs, capacity 1: ${srv.pulls.length} pulls (${carrying.length} carrying reports), ${own} reports on their own`);
  } finally {
    await w.stop();
    srv.close();
  }
});

test("the results of a pull are read as the reports route's; a refusal that may pass, or a lost answer, sends the report again", { timeout: 30_000 }, async () => {
  const ids = Array.from({ length: 8 }, (_, i) => `v${i}`);
  const srv = await scriptedWorkd({
    jobs: ids,
    lose: 1,
    verdicts: { v1: ["superseded"], v2: ["shard-unavailable"], v3: ["not-holder"], v4: ["other-entry"], v5: ["cancelled"], v6: ["not-found"] },
  });
  const w = startWorker(srv, 1, async (job) => {
    await sleep(20);
    return job.payload;
  });
  try {
    await srv.settled(ids);
    await sleep(300); // a declared window: a report sent once too often would come here
    for (const [id, final] of [["v1", "superseded"], ["v3", "not-holder"], ["v5", "cancelled"], ["v6", "not-found"]]) {
      assert.deepEqual(srv.of(id).map(([, v]) => v), [final], `${id}: ${final} is final, sent once`);
    }
    for (const [id, first] of [["v2", "shard-unavailable"], ["v4", "other-entry"]]) {
      assert.deepEqual(srv.of(id), [["pull", first], ["reports", "accepted"]], `${id}: sent again until accepted`);
    }
    const lost = ids.filter((id) => !["v2", "v4"].includes(id) && srv.of(id).length === 2);
    assert.equal(lost.length, 1, `the report whose answer was lost is sent again: ${JSON.stringify(srv.reported)}`);
    assert.ok(w.logger.lines.some((l) => l.includes("v2 attempt 1 not accepted (refused: shard-unavailable)")), w.logger.lines.join("\n"));
  } finally {
    await w.stop();
    srv.close();
  }
});

test("a server older than the exchange (400 naming 'reports'): the reports go on their own, once each", { timeout: 30_000 }, async () => {
  const ids = Array.from({ length: 20 }, (_, i) => `o${i}`);
  const srv = await scriptedWorkd({ jobs: ids, old: true });
  const w = startWorker(srv, 2);
  try {
    await srv.settled(ids);
    await sleep(300); // a declared window: a report sent twice would come here
    assert.deepEqual(srv.reported.map((r) => r.id).sort(), [...ids].sort(), "each report once");
    assert.deepEqual([...new Set(srv.reported.map((r) => r.route))], ["reports"]);
    assert.equal(srv.pulls.filter((p) => p.reports > 0).length, 1, `reports carried after the 400: ${JSON.stringify(srv.pulls)}`);
    assert.ok(w.logger.lines.some((l) => l.includes("takes no reports in a pull")), w.logger.lines.join("\n"));
  } finally {
    await w.stop(); // rejects if the 400 stopped the worker
    srv.close();
  }
});

test("no pull coming (a free slot's pull waits for work): a report goes at once, on its own", { timeout: 30_000 }, async () => {
  const srv = await scriptedWorkd({ jobs: ["n1"], hold: 10_000 });
  let ended = 0;
  const w = startWorker(srv, 2, async () => {
    await sleep(300); // the next pull (a free slot's) waits at the server by now
    ended = Date.now();
    return "done";
  });
  try {
    await srv.settled(["n1"]);
    const [r] = srv.reported;
    assert.equal(r.route, "reports");
    const took = r.at - ended;
    assert.ok(took < 500, `the report reached the server ${took} ms after the job ended`);
    console.log(`a report with no pull coming reached the server ${took} ms after its job ended`);
  } finally {
    await w.stop();
    srv.close();
  }
});
