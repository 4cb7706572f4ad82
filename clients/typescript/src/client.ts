// The client API: submit, read, wait for, cancel and retry work, follow the
// results stream, and manage queues and schedules.
import { EventStream, type StreamOptions } from "./sse.js";
import { activeTraceContext, loadOpenTelemetry, type OpenTelemetryOption } from "./trace.js";
import { type ConnectionOptions, Transport } from "./transport.js";
import type {
  CancelResult,
  Cluster,
  QueueLimitsAnswer,
  QueueLimitsSet,
  QueueStatsList,
  ResultEvent,
  RetryResult,
  Schedule,
  ScheduleSet,
  SubmitBatch,
  SubmitBulkResult,
  SubmitItem,
  SubmitResult,
  TraceContext,
  Work,
  WorkEvent,
  WorkEvents,
  WorkList,
  WorkStatus,
} from "./types.js";
import { sleep, uuid4 } from "./util.js";

export interface ClientOptions extends ConnectionOptions {
  /**
   * `@opentelemetry/api`, to send the active span's context with each
   * submission that gives none; `false` not to. Default: imported when installed.
   */
  opentelemetry?: OpenTelemetryOption;
}

export interface SubmitOptions extends TraceContext {
  signal?: AbortSignal;
}

/** A bulk item; its own `traceparent`/`tracestate` win over the request's. */
export type SubmitManyItem = SubmitItem;

export interface ResultsOptions extends StreamOptions {
  /** Only events of this work item. */
  workId?: string;
  /** Only events of work in this queue. */
  queue?: string;
  /** Progress events of running work too. */
  progress?: boolean;
}

export interface WaitOptions {
  /** Give up after this many seconds (rejects with a TimeoutError). Default: wait as long as it takes. */
  timeout?: number;
  signal?: AbortSignal;
}

const FINISHED = new Set<WorkStatus>(["completed", "dead", "cancelled"]);
const GET_WAIT_MAX_S = 60;
// The pause (ms) after a long poll that came back early with the work open:
// doubled while they keep coming back early. A server answers early when the
// work changes; one that always does (a broken one, a proxy that does not
// hold long polls) is not asked again as fast as it answers.
const EARLY_PAUSE_MIN_MS = 100;
const EARLY_PAUSE_MAX_MS = 2000;

const enc = encodeURIComponent;

function query(params: Record<string, string | number | boolean | undefined>): string {
  const parts = Object.entries(params)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${enc(k)}=${enc(String(v))}`);
  return parts.length ? `?${parts.join("&")}` : "";
}

/**
 * A client of a workd cluster.
 *
 * ```ts
 * const workd = new Client({ servers: ["http://a:8080", "http://b:8080"] });
 * const { id } = await workd.submit({ queue: "email", payload: { to: "ann@example.com" } });
 * const work = await workd.wait(id);
 * ```
 */
export class Client {
  /** @internal */
  readonly transport: Transport;
  private readonly otel: OpenTelemetryOption;

  constructor(options: ClientOptions = {}) {
    this.transport = new Transport(options);
    this.otel = options.opentelemetry;
  }

  /** The servers this client uses, in the order it tries them. */
  get servers(): readonly string[] {
    return this.transport.servers;
  }

  private async traceHeaders(given: TraceContext): Promise<Record<string, string>> {
    let tc: TraceContext | undefined = given.traceparent ? given : undefined;
    if (!tc) {
      const api = await loadOpenTelemetry(this.otel);
      if (api) tc = activeTraceContext(api);
    }
    const h: Record<string, string> = {};
    if (tc?.traceparent) h["traceparent"] = tc.traceparent;
    if (tc?.traceparent && tc.tracestate) h["tracestate"] = tc.tracestate;
    return h;
  }

  /**
   * Submits one work item. An item without `id` is given a random one here,
   * so that a retried request (after a dropped connection or a failover)
   * cannot submit it twice. `traceparent`/`tracestate` go as the W3C headers
   * (default: the active OpenTelemetry span's, when there is one).
   */
  async submit(item: SubmitItem, options: SubmitOptions = {}): Promise<SubmitResult> {
    const body = { ...item, id: item.id ?? uuid4() };
    const headers = await this.traceHeaders(options);
    const res = await this.transport.request<SubmitResult>("POST", "/work", {
      body,
      headers,
      signal: options.signal,
    });
    return res.data;
  }

  /**
   * Submits items all together or none of them; the answer has one result
   * per item, in order. Pass `{items, batch}` to open a batch. Items may
   * carry their own `traceparent`/`tracestate`; the options' context (or the
   * active span's) is sent as the headers.
   */
  async submitMany(items: SubmitManyItem[] | SubmitBatch, options: SubmitOptions = {}): Promise<SubmitBulkResult> {
    const withIds = (list: SubmitManyItem[]) => list.map((it) => ({ ...it, id: it.id ?? uuid4() }));
    const body = Array.isArray(items) ? withIds(items) : { ...items, items: withIds(items.items) };
    const headers = await this.traceHeaders(options);
    const res = await this.transport.request<SubmitBulkResult>("POST", "/work", {
      body,
      headers,
      signal: options.signal,
    });
    return res.data;
  }

  /** Reads a work item; with `wait` (seconds) the server answers once it finished or the wait ran out. */
  async get(id: string, options: { wait?: number; signal?: AbortSignal } = {}): Promise<Work> {
    const wait = options.wait;
    const res = await this.transport.request<Work>("GET", `/work/${enc(id)}${query({ wait })}`, {
      signal: options.signal,
      timeout: ((wait ?? 0) + 30) * 1000,
    });
    return res.data;
  }

  /**
   * Resolves with the work once it has finished (completed, dead or
   * cancelled), long-polling the server. With `timeout` (seconds) it
   * rejects with a `TimeoutError` DOMException when that passes first.
   */
  async wait(id: string, options: WaitOptions = {}): Promise<Work> {
    const end = options.timeout === undefined ? Infinity : Date.now() + options.timeout * 1000;
    let pause = 0;
    for (;;) {
      const left = (end - Date.now()) / 1000;
      const wait = Math.max(0, Math.min(GET_WAIT_MAX_S, left));
      const asked = Date.now();
      const work = await this.get(id, { wait, ...(options.signal ? { signal: options.signal } : {}) });
      if (FINISHED.has(work.status)) return work;
      if (Date.now() >= end) throw new DOMException(`work ${id} is still ${work.status}`, "TimeoutError");
      if (Date.now() - asked >= (wait * 1000) / 2) {
        pause = 0;
        continue;
      }
      pause = Math.min(EARLY_PAUSE_MAX_MS, pause ? pause * 2 : EARLY_PAUSE_MIN_MS);
      await sleep(Math.min(pause, end - Date.now()), options.signal);
    }
  }

  /** Cancels open work (pending, scheduled or running: its worker is told to stop it). */
  async cancel(id: string): Promise<CancelResult> {
    return (await this.transport.request<CancelResult>("DELETE", `/work/${enc(id)}`)).data;
  }

  /** Reopens dead work for one more attempt. */
  async retry(id: string): Promise<RetryResult> {
    return (await this.transport.request<RetryResult>("POST", `/work/${enc(id)}/retry`)).data;
  }

  /** One page of work, newest first (pass the answer's `next_before` as `before` for the next). */
  async list(
    filter: { status?: WorkStatus; queue?: string; limit?: number; before?: number | string } = {},
  ): Promise<WorkList> {
    return (await this.transport.request<WorkList>("GET", `/work${query(filter)}`)).data;
  }

  /** The event history of a work item, oldest first, every page. */
  async *history(id: string): AsyncGenerator<WorkEvent> {
    let after: number | null = 0;
    while (after !== null) {
      const path = `/work/${enc(id)}/events${query({ after })}`;
      const page: WorkEvents = (await this.transport.request<WorkEvents>("GET", path)).data;
      yield* page.events;
      after = page.next_after;
    }
  }

  /**
   * The results stream: finished work (and progress, with `progress: true`)
   * as it happens, from `after` (an event id, opaque, such as a stream's
   * `lastEventId`; `0` for the whole log) or from now.
   * It reconnects across dropped connections and server restarts, resuming
   * with Last-Event-ID, and never yields an event twice. Break out of the
   * loop, call `close()`, or abort `signal` to end it.
   *
   * ```ts
   * for await (const ev of workd.results({ queue: "email" })) console.log(ev.id, ev.status);
   * ```
   */
  results(options: ResultsOptions = {}): EventStream<ResultEvent> {
    const q = query({
      after: options.after,
      work_id: options.workId,
      queue: options.queue,
      progress: options.progress ? "true" : undefined,
    });
    return new EventStream<ResultEvent>(this.transport, `/results${q}`, options, false);
  }

  /**
   * One work item's stream: its progress from the start (or `after`), then
   * its end (completed, dead or cancelled), after which the iteration ends.
   */
  stream(id: string, options: StreamOptions = {}): EventStream<ResultEvent> {
    return new EventStream<ResultEvent>(
      this.transport,
      `/work/${enc(id)}/stream${query({ after: options.after })}`,
      options,
      true,
    );
  }

  // ---- queues

  /** Per-queue counts, the oldest ready job and recent throughput. */
  async queues(): Promise<QueueStatsList> {
    return (await this.transport.request<QueueStatsList>("GET", "/queues")).data;
  }

  /** Sets a queue's flow control (what is given changes, the rest is kept). */
  async setQueue(queue: string, limits: QueueLimitsSet): Promise<QueueLimitsAnswer> {
    return (await this.transport.request<QueueLimitsAnswer>("PUT", `/queues/${enc(queue)}`, { body: limits })).data;
  }

  async pauseQueue(queue: string): Promise<QueueLimitsAnswer> {
    return (await this.transport.request<QueueLimitsAnswer>("POST", `/queues/${enc(queue)}/pause`)).data;
  }

  async resumeQueue(queue: string): Promise<QueueLimitsAnswer> {
    return (await this.transport.request<QueueLimitsAnswer>("POST", `/queues/${enc(queue)}/resume`)).data;
  }

  // ---- schedules

  async schedules(): Promise<Schedule[]> {
    return (await this.transport.request<{ schedules: Schedule[] }>("GET", "/schedules")).data.schedules;
  }

  async schedule(name: string): Promise<Schedule> {
    return (await this.transport.request<Schedule>("GET", `/schedules/${enc(name)}`)).data;
  }

  /** Creates or replaces a schedule. */
  async setSchedule(name: string, schedule: ScheduleSet): Promise<Schedule> {
    return (await this.transport.request<Schedule>("PUT", `/schedules/${enc(name)}`, { body: schedule })).data;
  }

  async deleteSchedule(name: string): Promise<void> {
    await this.transport.request<void>("DELETE", `/schedules/${enc(name)}`);
  }

  async pauseSchedule(name: string): Promise<Schedule> {
    return (await this.transport.request<Schedule>("POST", `/schedules/${enc(name)}/pause`)).data;
  }

  async resumeSchedule(name: string): Promise<Schedule> {
    return (await this.transport.request<Schedule>("POST", `/schedules/${enc(name)}/resume`)).data;
  }

  // ---- operations

  /** The cluster: nodes, the leader, workers and the database. */
  async cluster(): Promise<Cluster> {
    return (await this.transport.request<Cluster>("GET", "/cluster")).data;
  }
}
