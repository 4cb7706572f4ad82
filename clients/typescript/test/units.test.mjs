// Parts that need no cluster: the event-stream parser, event ids of several
// shards (against a small server of scripted streams, over real HTTP), trace
// context, the generated types' freshness, and the package's metadata.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { test } from "node:test";
import { Client, VERSION, cursorLe, formatTraceContext, parseEventStream, parseTraceparent } from "../dist/index.js";
import { generate } from "../scripts/generate-types.mjs";

test("the types were generated from the openapi.yaml of this tree (npm run build)", async () => {
  const built = await readFile(new URL("../src/generated/openapi.ts", import.meta.url), "utf8");
  const fresh = await generate();
  assert.ok(built === fresh, "src/generated/openapi.ts differs from what openapi.yaml gives now: run `npm run build`");
  const { SPEC_SHA256 } = await import("../dist/generated/openapi.js");
  const sha = /openapi\.yaml sha256: ([0-9a-f]{64})/.exec(fresh)[1];
  assert.equal(SPEC_SHA256, sha, "dist/ was built from another openapi.yaml: run `npm run build`");
});

test("a user's TypeScript (test/usage.ts) type-checks against dist/'s declarations", async () => {
  const tsc = fileURLToPath(new URL("../node_modules/typescript/bin/tsc", import.meta.url));
  const project = fileURLToPath(new URL("./tsconfig.json", import.meta.url));
  try {
    await promisify(execFile)(process.execPath, [tsc, "-p", project]);
  } catch (e) {
    assert.fail(`tsc -p test/tsconfig.json:\n${e.stdout}${e.stderr}`);
  }
});

test("VERSION is package.json's version", async () => {
  const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8"));
  assert.equal(VERSION, pkg.version);
  assert.equal(pkg.license, "Apache-2.0");
});

function streamOf(chunks) {
  const enc = new TextEncoder();
  return new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(enc.encode(ch));
      c.close();
    },
  });
}

test("parseEventStream: blocks, ids, comments, CRLF split across chunks, multi-line data", async () => {
  const retries = [];
  const text =
    ": workd results stream\r\nretry: 1000\r\nid: 5\r\nevent: ready\r\ndata: {\"after\": 5}\r\n\r\n" +
    "id: 6\nevent: completed\ndata: {\"a\":\ndata: 1}\n\n: keep-alive\n\ndata:no-space\n\n" +
    "id: 7\revent: dead\rdata: x\r\r";
  const chunks = [];
  for (let i = 0; i < text.length; i += 3) chunks.push(text.slice(i, i + 3)); // \r and \n in different chunks
  const got = [];
  for await (const m of parseEventStream(streamOf(chunks), { onRetry: (ms) => retries.push(ms) })) got.push(m);
  assert.deepEqual(got, [
    { id: "5", event: "ready", data: '{"after": 5}' },
    { id: "6", event: "completed", data: '{"a":\n1}' },
    { id: "6", event: "message", data: "no-space" },
    { id: "7", event: "dead", data: "x" },
  ]);
  assert.deepEqual(retries, [1000]);
});

test("parseEventStream: a multi-byte character split across chunks", async () => {
  const bytes = new TextEncoder().encode("data: naïve ✓\n\n");
  const body = new ReadableStream({
    start(c) {
      for (const b of bytes) c.enqueue(new Uint8Array([b]));
      c.close();
    },
  });
  const got = [];
  for await (const m of parseEventStream(body)) got.push(m.data);
  assert.deepEqual(got, ["naïve ✓"]);
});

test("cursorLe: event ids compare shard by shard, as numbers, a missing shard at 0", () => {
  for (const [a, b, le] of [
    ["5", "5", true], ["4", "5", true], ["6", "5", false],
    ["9.2", "10.2", true], ["10.2", "9.2", false], // numbers, not text
    ["3.2", "4.2", true], ["4.1", "4.2", true], ["4.3", "4.2", false], ["5.1", "4.2", false],
    ["4", "4.2", true], ["4.2", "4", false], ["4.0.0", "4", true], ["4.0.1", "4", false],
    ["99999999999999999999", "99999999999999999998", false], // past 2^53
    ["x", "4", false], ["4", "x", false], ["", "4", false], ["4.", "4", false],
  ]) {
    assert.equal(cursorLe(a, b), le, `cursorLe(${JSON.stringify(a)}, ${JSON.stringify(b)}) is not ${le}`);
  }
});

/**
 * A results stream as a cluster of several shards serves it: each connection
 * in turn gets a `ready` event at the Last-Event-ID it sent, then its
 * script's events ([id, seq]), and ends (the last one stays open). It keeps
 * every Last-Event-ID it was sent.
 */
async function shardedStream(scripts) {
  const resumedFrom = [];
  const server = createServer((req, res) => {
    const last = req.headers["last-event-id"];
    const script = scripts[resumedFrom.length] ?? [];
    resumedFrom.push(last);
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.write(`retry: 20\nid: ${last}\nevent: ready\ndata: ${JSON.stringify({ after: last })}\n\n`);
    for (const [id, seq] of script) {
      const data = { seq, id: `w-${id}`, queue: "q", status: "completed", at: "2026-01-01T00:00:00Z", result: id, attempt: 1 };
      res.write(`id: ${id}\nevent: completed\ndata: ${JSON.stringify(data)}\n\n`);
    }
    if (resumedFrom.length < scripts.length) res.end();
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${server.address().port}`, resumedFrom, server };
}

test("results: ids of several shards are resumed as text and deduplicated shard by shard", { timeout: 15_000 }, async () => {
  const srv = await shardedStream([
    [["3.2", 2], ["4.2", 4]],
    [["3.2", 2], ["4.2", 4], ["4.1", 1], ["4", 4], ["10.2", 10], ["10.3.1", 1]],
    [["10.3.1", 1], ["10.3.2", 2]],
  ]);
  const stream = new Client({ servers: [srv.url] }).results({ after: "3.1", idleTimeout: 10_000 });
  const got = [];
  try {
    for await (const ev of stream) {
      got.push([stream.lastEventId, ev.seq]);
      if (got.length === 5) break;
    }
  } finally {
    srv.server.closeAllConnections();
    srv.server.close();
  }
  assert.deepEqual(got, [["3.2", 2], ["4.2", 4], ["10.2", 10], ["10.3.1", 1], ["10.3.2", 2]], "events lost or repeated");
  assert.deepEqual(srv.resumedFrom, ["3.1", "4.2", "10.3.1"], "the stream did not resume from its last event id");
  assert.equal(stream.lastEventId, "10.3.2");
});

test("traceparent: parsed and formatted as W3C says; invalid ones refused", () => {
  const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const sc = parseTraceparent(tp);
  assert.deepEqual(sc, { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", traceFlags: 1, isRemote: true });
  assert.deepEqual(formatTraceContext(sc), { traceparent: tp });
  for (const bad of [
    undefined,
    "",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
  ]) {
    assert.equal(parseTraceparent(bad), undefined, `${bad} is not a valid traceparent`);
  }
  assert.ok(parseTraceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"),
    "a later version may carry more fields");
});
