// One trace from the producer's span to the worker's, with the real
// OpenTelemetry SDK (in-memory exporter): Client.submit sends the active
// span's context as `traceparent`, the server hands it to the worker in the
// pull answer, and the Worker runs the handler in a consumer span whose parent
// is the producer's span; a later attempt is a new trace linked to it.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import * as otel from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { Client, Worker } from "../dist/index.js";
import { AS_CLIENT, AS_WORKER, memoryLogger, needsCluster, unique } from "./helpers.mjs";

const NO_SERVER_SUPPORT =
  "the server does not hand traceparent to workers yet (issue 32 item 5: the pull answer has no traceparent)";

describe("trace context across the queue", needsCluster, () => {
  test("one trace from the producer's span to the worker's span; a retry links to it", async (t) => {
    const exporter = new InMemorySpanExporter();
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
    const contextManager = new AsyncLocalStorageContextManager().enable();
    otel.context.setGlobalContextManager(contextManager);
    otel.trace.setGlobalTracerProvider(provider);
    t.after(() => {
      otel.trace.disable();
      otel.context.disable();
    });

    const queue = unique("t-trace");
    const seen = []; // what each attempt's handler saw
    const worker = new Worker({ ...AS_WORKER, id: unique("ts-t"), logger: memoryLogger(), handleSignals: false });
    worker.handle(queue, (job) => {
      const active = otel.trace.getActiveSpan()?.spanContext();
      seen.push({ attempt: job.attempt, traceparent: job.traceparent, active });
      if (job.attempt === 1) throw new Error("first attempt fails, to see the retry's span");
      return "traced";
    });
    const running = worker.run();
    t.after(async () => {
      await worker.stop();
      await running;
    });

    const client = new Client({ ...AS_CLIENT });
    const tracer = otel.trace.getTracer("producer");
    let producer;
    const id = await tracer.startActiveSpan("POST /checkout", async (span) => {
      producer = span.spanContext();
      try {
        return (await client.submit({ queue, payload: 1, max_attempts: 2 })).id;
      } finally {
        span.end();
      }
    });
    const work = await client.wait(id, { timeout: 20 });
    assert.equal(work.status, "completed", JSON.stringify(work));
    assert.equal(seen.length, 2);

    const sent = `00-${producer.traceId}-${producer.spanId}-01`;
    if (seen[0].traceparent === undefined) {
      t.skip(NO_SERVER_SUPPORT);
      return;
    }
    assert.equal(seen[0].traceparent, sent, "the handler gets the producer's traceparent");
    assert.equal(seen[1].traceparent, sent, "a retry keeps the producer's context");

    const spans = exporter.getFinishedSpans();
    const mine = spans.filter((s) => s.name === `process ${queue}`);
    assert.equal(mine.length, 2, `one consumer span per attempt: ${spans.map((s) => s.name)}`);
    const [first, second] = mine.sort((x, y) => x.attributes["workd.attempt"] - y.attributes["workd.attempt"]);

    assert.equal(first.spanContext().traceId, producer.traceId, "the first attempt is in the producer's trace");
    assert.equal(first.parentSpanContext?.spanId, producer.spanId, "its parent is the producer's span");
    assert.equal(first.kind, otel.SpanKind.CONSUMER);
    assert.equal(first.attributes["messaging.system"], "workd");
    assert.equal(first.attributes["messaging.destination.name"], queue);
    assert.equal(first.attributes["messaging.message.id"], id);
    assert.equal(first.status.code, otel.SpanStatusCode.ERROR, "the failed attempt's span says so");
    assert.equal(seen[0].active?.spanId, first.spanContext().spanId, "the handler runs in its span");

    assert.notEqual(second.spanContext().traceId, producer.traceId, "a later attempt starts a new trace");
    assert.equal(second.parentSpanContext, undefined);
    assert.equal(second.links.length, 1);
    assert.equal(second.links[0].context.traceId, producer.traceId, "linked to the producer's span");
    assert.equal(second.links[0].context.spanId, producer.spanId);
    assert.equal(second.status.code, otel.SpanStatusCode.UNSET);
    assert.equal(seen[1].active?.spanId, second.spanContext().spanId);
  });

  test("submit sends a given traceparent and tracestate instead of the active context", async (t) => {
    const queue = unique("t-given");
    const got = [];
    const worker = new Worker({ ...AS_WORKER, id: unique("ts-t"), logger: memoryLogger(), handleSignals: false, opentelemetry: false });
    worker.handle(queue, (job) => {
      got.push({ traceparent: job.traceparent, tracestate: job.tracestate });
      return null;
    });
    const running = worker.run();
    t.after(async () => {
      await worker.stop();
      await running;
    });
    const headers = [];
    const recording = (url, init) => {
      const h = new Headers(init.headers);
      if (init.method === "POST") headers.push([h.get("traceparent"), h.get("tracestate")]);
      return fetch(url, init);
    };
    const client = new Client({ ...AS_CLIENT, fetch: recording, opentelemetry: false });
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const { id } = await client.submit({ queue, payload: 1 }, { traceparent, tracestate: "vendor=1" });
    await client.wait(id, { timeout: 20 });
    assert.deepEqual(headers, [[traceparent, "vendor=1"]], "sent as the W3C headers");
    if (got[0].traceparent === undefined) {
      t.skip(NO_SERVER_SUPPORT);
      return;
    }
    assert.deepEqual(got, [{ traceparent, tracestate: "vendor=1" }], "the worker's job carries them");
  });
});
