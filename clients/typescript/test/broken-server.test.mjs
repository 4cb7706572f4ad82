// The library against a server that is broken or hostile (a real HTTP server
// on loopback that answers as each test scripts it; no cluster needed): an
// answer without end is cut, a redirect is not followed, Retry-After cannot
// make it wait long or ask again without pause, and an event stream that
// breaks the rules ends with an error or a pause, never all the memory.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";
import { BadAnswer, Client, EVENT_MAX_BYTES, MAX_ANSWER_BYTES, RETRY_AFTER_MAX_MS, WorkdError } from "../dist/index.js";
import { retryAfter } from "../dist/transport.js";

/**
 * A server whose `routes` map "METHOD /path" (no query) to a function (req,
 * res) that answers; 404 otherwise. `requests` keeps "METHOD /path" of each.
 */
async function scripted(routes) {
  const requests = [];
  const server = createServer((req, res) => {
    const key = `${req.method} ${req.url.split("?")[0]}`;
    requests.push(key);
    res.on("error", () => {});
    const route = routes[key];
    if (route) route(req, res);
    else res.writeHead(404).end();
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    count: (key) => requests.filter((r) => r === key).length,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

/** Writes chunk again and again until the client goes away. */
function endless(res, chunk) {
  const more = () => {
    while (!res.destroyed && res.write(chunk));
    if (!res.destroyed) res.once("drain", more);
  };
  more();
}

/** Resolves to what `promise` rejects with, failing when it resolves or takes longer than ms. */
async function rejection(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: still pending after ${ms}ms`)), ms);
  });
  try {
    await Promise.race([promise, late]);
  } catch (e) {
    return e;
  } finally {
    clearTimeout(timer);
  }
  assert.fail(`${what}: no error`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("an answer without end, or too long for its Content-Length, or not JSON, is BadAnswer", { timeout: 60_000 }, async () => {
  const srv = await scripted({
    "GET /work/x": (req, res) => {
      res.writeHead(200, { "Content-Type": "application/json" });
      endless(res, Buffer.alloc(65536, "x"));
    },
    "GET /work/y": (req, res) => {
      res.writeHead(200, { "Content-Type": "application/json", "Content-Length": String(10 * 2 ** 30) });
      endless(res, Buffer.alloc(65536, "x"));
    },
    "GET /work/z": (req, res) => {
      res.writeHead(500, { "Content-Type": "application/problem+json" });
      endless(res, Buffer.alloc(65536, "x"));
    },
    "GET /work/t": (req, res) => res.writeHead(200, { "Content-Type": "application/json" }).end("<html>"),
  });
  try {
    const client = new Client({ servers: srv.url, retryFor: 0 });
    for (const id of ["x", "y", "z"]) {
      const e = await rejection(client.get(id), 30_000, `get(${id}) of an answer without end`);
      assert.ok(e instanceof BadAnswer, `get(${id}): ${e}`);
      assert.match(e.message, new RegExp(`more than the ${MAX_ANSWER_BYTES} bytes`));
    }
    assert.equal(srv.count("GET /work/x"), 1, "an answer too long was asked for again");
    const e = await rejection(client.get("t"), 10_000, "an answer that is not JSON");
    assert.ok(e instanceof BadAnswer && /not JSON/.test(e.message), String(e));
  } finally {
    srv.close();
  }
});

test("a redirect is not followed, to another server or the same", { timeout: 30_000 }, async () => {
  const other = await scripted({ "GET /work/x": (req, res) => res.writeHead(200, { "Content-Type": "application/json" }).end("{}") });
  const srv = await scripted({
    "GET /work/x": (req, res) => res.writeHead(307, { Location: `${other.url}/work/x` }).end(),
    "POST /work": (req, res) => res.writeHead(308, { Location: `${other.url}/work` }).end(),
    "GET /work/x/stream": (req, res) => res.writeHead(302, { Location: `${srv.url}/work/x/stream` }).end(),
  });
  try {
    const client = new Client({ servers: srv.url, retryFor: 0 });
    let e = await rejection(client.get("x"), 10_000, "a redirected get");
    assert.ok(e instanceof BadAnswer, String(e));
    assert.equal(e.status, 307);
    assert.equal(e.location, `${other.url}/work/x`);
    assert.match(e.message, /does not follow/);
    e = await rejection(client.submit({ payload: 1 }), 10_000, "a redirected submission");
    assert.ok(e instanceof BadAnswer && e.status === 308, String(e));
    const stream = client.stream("x");
    e = await rejection(stream[Symbol.asyncIterator]().next(), 10_000, "a redirected stream");
    assert.ok(e instanceof BadAnswer && e.status === 302, String(e));
    assert.equal(srv.count("GET /work/x/stream"), 1, "the stream's redirect was followed (to the same server)");
    assert.deepEqual(other.requests, [], "a redirect was followed");
  } finally {
    srv.close();
    other.close();
  }
});

test("Retry-After: seconds or an HTTP date, at most RETRY_AFTER_MAX_MS, else ignored", () => {
  const now = Date.parse("2026-06-01T12:00:00Z");
  const at = (v) => retryAfter(new Headers({ "Retry-After": v }), now);
  assert.equal(at("3"), 3);
  assert.equal(at("0"), 0);
  assert.equal(at("99999999999999999999"), RETRY_AFTER_MAX_MS / 1000);
  assert.equal(at("Mon, 01 Jun 2026 12:00:20 GMT"), 20);
  assert.equal(at("Tue, 01 Jun 2027 12:00:00 GMT"), RETRY_AFTER_MAX_MS / 1000);
  assert.equal(at("Sun, 31 May 2026 12:00:00 GMT"), 0);
  for (const bad of ["-5", "1.5", "nan", "Infinity", "1e9", "soon", ""]) assert.equal(at(bad), undefined, `Retry-After: ${bad}`);
  assert.equal(retryAfter(new Headers(), now), undefined);
});

test("a stream refused with a huge Retry-After waits, not asks again at once", { timeout: 30_000 }, async () => {
  const srv = await scripted({
    "GET /results": (req, res) =>
      res.writeHead(503, { "Content-Type": "application/problem+json", "Retry-After": "99999999999" }).end(
        JSON.stringify({ type: "https://workd.dev/problems/unavailable", title: "Unavailable", status: 503 }),
      ),
  });
  const stream = new Client({ servers: srv.url }).results();
  const reading = stream[Symbol.asyncIterator]().next();
  try {
    await sleep(1500); // a measurement window: how often it asks in 1.5 s
    assert.ok(srv.count("GET /results") <= 2, `asked ${srv.count("GET /results")} times in 1.5 s`);
  } finally {
    stream.close();
    await reading.catch(() => {});
    srv.close();
  }
});

test("an event stream that breaks the rules ends with BadAnswer, or comes back after a pause", { timeout: 120_000 }, async () => {
  const sse = (res) => res.writeHead(200, { "Content-Type": "text/event-stream" });
  const srv = await scripted({
    // A line that never ends; data lines of an event that never ends.
    "GET /work/a/stream": (req, res) => {
      sse(res).write("data: ");
      endless(res, "x".repeat(65536));
    },
    "GET /work/b/stream": (req, res) => {
      sse(res).write("id: 1\n");
      endless(res, `data: ${"x".repeat(1000)}\n`);
    },
    // A stream that ends at once, again and again, asking to come back at once.
    "GET /work/c/stream": (req, res) => sse(res).end("retry: 0\n: bye\n\n"),
    // Fields the spec ignores, an id with a NUL (ignored), then an event.
    "GET /work/d/stream": (req, res) =>
      sse(res).write(
        'nonsense\nretry: soon\n: a comment\nevent\n\nfield: value\nid: 9\0x\ndata: {"id": "d"}\n\n' +
          'id: 10\nevent: completed\ndata: {"id": "d", "status": "completed", "seq": 10}\n\n',
      ),
  });
  try {
    const client = new Client({ servers: srv.url });
    for (const id of ["a", "b"]) {
      const e = await rejection(client.stream(id)[Symbol.asyncIterator]().next(), 60_000, `stream ${id}`);
      assert.ok(e instanceof BadAnswer, `stream ${id}: ${e}`);
      assert.match(e.message, new RegExp(`longer than ${EVENT_MAX_BYTES}`));
    }
    const c = client.stream("c");
    const reading = c[Symbol.asyncIterator]().next();
    await sleep(2000); // a measurement window: how often it comes back in 2 s
    c.close();
    await reading;
    const asked = srv.count("GET /work/c/stream");
    assert.ok(asked >= 2 && asked <= 12, `a stream that ends at once was opened ${asked} times in 2 s`);
    const got = [];
    for await (const ev of client.stream("d")) got.push(ev);
    assert.deepEqual(got, [{ id: "d", status: "completed", seq: 10 }]);
  } finally {
    srv.close();
  }
});

test("wait() pauses when a long poll is not held", { timeout: 30_000 }, async () => {
  const srv = await scripted({
    "GET /work/x": (req, res) => res.writeHead(200, { "Content-Type": "application/json" }).end('{"id": "x", "status": "running"}'),
  });
  try {
    const e = await rejection(new Client({ servers: srv.url }).wait("x", { timeout: 3 }), 10_000, "wait({timeout: 3})");
    assert.equal(e.name, "TimeoutError", String(e));
    const asked = srv.count("GET /work/x");
    assert.ok(asked >= 2 && asked <= 10, `wait asked ${asked} times in 3 s (the pauses allow about 6)`);
  } finally {
    srv.close();
  }
});

test("BadAnswer is a WorkdError", () => {
  const e = new BadAnswer("x", { status: 302, location: "http://elsewhere/" });
  assert.ok(e instanceof WorkdError);
  assert.equal(e.name, "BadAnswer");
  assert.equal(e.location, "http://elsewhere/");
});
