// W3C trace context across the queue. Without OpenTelemetry the library only
// passes `traceparent`/`tracestate` along. With `@opentelemetry/api` (an
// optional peer dependency, or given as an option) Client.submit sends the
// active span's context when none is given, and the Worker runs each handler
// in a consumer span: a child of the producer's span for the first attempt,
// a new trace linked to it for a later one (OpenTelemetry's messaging
// conventions: a retry is a new delivery of the same message).
import type { TraceContext } from "./types.js";

/** The part of a span context this library reads and makes. */
export interface SpanContextLike {
  traceId: string;
  spanId: string;
  traceFlags: number;
  isRemote?: boolean;
  traceState?: { serialize(): string };
}

interface SpanLike {
  spanContext(): SpanContextLike;
  recordException(e: unknown): void;
  setStatus(status: { code: number; message?: string }): void;
  end(): void;
}

interface SpanOptionsLike {
  kind?: number;
  attributes?: Record<string, string | number | boolean>;
  links?: { context: SpanContextLike }[];
  root?: boolean;
}

/**
 * The members of `@opentelemetry/api` that workd uses.
 */
export interface OpenTelemetryApi {
  trace: {
    getTracer(name: string, version?: string): {
      startSpan(name: string, options?: SpanOptionsLike, context?: unknown): SpanLike;
    };
    getSpanContext(context: unknown): SpanContextLike | undefined;
    setSpan(context: unknown, span: SpanLike): unknown;
    setSpanContext(context: unknown, spanContext: SpanContextLike): unknown;
  };
  context: {
    active(): unknown;
    with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(
      context: unknown,
      fn: F,
      thisArg?: ThisParameterType<F>,
      ...args: A
    ): ReturnType<F>;
  };
  ROOT_CONTEXT: unknown;
  createTraceState(raw?: string): { serialize(): string };
}

/**
 * Option for Client and Worker: the `@opentelemetry/api` module
 * (`import * as otel from "@opentelemetry/api"`), `false` for none, or
 * undefined to import it when it is installed. Typed loosely so that any
 * 1.x version of the API fits.
 */
export type OpenTelemetryOption = object | false | undefined;

function isApi(m: unknown): m is OpenTelemetryApi {
  const api = m as Partial<OpenTelemetryApi> | undefined;
  return typeof api?.trace?.getTracer === "function" && typeof api.context?.with === "function";
}

const SPAN_KIND_CONSUMER = 4;
const STATUS_ERROR = 2;
const LIBRARY = "workd";

let found: Promise<OpenTelemetryApi | undefined> | undefined;

/** `@opentelemetry/api` when it can be imported, else undefined (looked for once). */
export function loadOpenTelemetry(option: OpenTelemetryOption): Promise<OpenTelemetryApi | undefined> {
  if (option === false) return Promise.resolve(undefined);
  if (option !== undefined) {
    if (!isApi(option)) throw new TypeError("workd: the opentelemetry option is not @opentelemetry/api");
    return Promise.resolve(option);
  }
  if (!found) {
    // A name in a variable: bundlers leave the import alone, so a browser
    // build without the package still works (the import just fails).
    const name = "@opentelemetry/api";
    found = import(/* webpackIgnore: true */ /* @vite-ignore */ name).then(
      (m: unknown) => (isApi(m) ? m : undefined),
      () => undefined,
    );
  }
  return found;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** The span context a `traceparent` names, or undefined when it is not valid. */
export function parseTraceparent(traceparent: string | undefined, tracestate?: string, api?: OpenTelemetryApi) {
  const m = traceparent === undefined ? null : TRACEPARENT.exec(traceparent.trim());
  if (!m || m[1] === "ff" || (m[1] === "00" && m[5] !== undefined)) return undefined;
  const [traceId, spanId] = [m[2]!, m[3]!];
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined;
  const sc: SpanContextLike = { traceId, spanId, traceFlags: parseInt(m[4]!, 16) & 1, isRemote: true };
  if (tracestate && api) sc.traceState = api.createTraceState(tracestate);
  return sc;
}

/** The W3C headers of a span context. */
export function formatTraceContext(sc: SpanContextLike): TraceContext {
  const out: TraceContext = {
    traceparent: `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`,
  };
  const ts = sc.traceState?.serialize();
  if (ts) out.tracestate = ts;
  return out;
}

/** The active span's trace context, when there is a valid one. */
export function activeTraceContext(api: OpenTelemetryApi): TraceContext | undefined {
  const sc = api.trace.getSpanContext(api.context.active());
  if (!sc || /^0+$/.test(sc.traceId) || /^0+$/.test(sc.spanId)) return undefined;
  return formatTraceContext(sc);
}

export interface ConsumedJob {
  id: string;
  attempt: number;
  queue: string;
  traceparent?: string | undefined;
  tracestate?: string | undefined;
}

/**
 * Runs `fn` in a consumer span for `job` (see the file's comment) and ends
 * the span when its promise settles; an error is recorded on the span.
 */
export async function inConsumerSpan<T>(
  api: OpenTelemetryApi,
  version: string,
  job: ConsumedJob,
  fn: () => Promise<T>,
): Promise<T> {
  const producer = parseTraceparent(job.traceparent, job.tracestate, api);
  const options: SpanOptionsLike = {
    kind: SPAN_KIND_CONSUMER,
    attributes: {
      "messaging.system": "workd",
      "messaging.operation.type": "process",
      "messaging.operation.name": "process",
      "messaging.destination.name": job.queue,
      "messaging.message.id": job.id,
      "workd.attempt": job.attempt,
    },
  };
  let parent: unknown = api.ROOT_CONTEXT;
  if (producer && job.attempt === 1) parent = api.trace.setSpanContext(api.ROOT_CONTEXT, producer);
  else if (producer) {
    options.links = [{ context: producer }];
    options.root = true;
  }
  const span = api.trace.getTracer(LIBRARY, version).startSpan(`process ${job.queue}`, options, parent);
  try {
    return await api.context.with(api.trace.setSpan(parent, span), fn);
  } catch (e) {
    span.recordException(e instanceof Error ? e : String(e));
    span.setStatus({ code: STATUS_ERROR, message: e instanceof Error ? e.message : String(e) });
    throw e;
  } finally {
    span.end();
  }
}
