// The worker API (docs/worker-api.md) as a library: register and heartbeat,
// long-poll for as many jobs as there are free slots, run each in the
// handler of its queue, send progress, report outcomes until acknowledged
// (in the next pull when one is about to go: the worker's exchange),
// deliver cancellations through an AbortSignal, and stop gracefully.
import { PermanentError, WorkdError } from "./errors.js";
import { inConsumerSpan, loadOpenTelemetry, type OpenTelemetryApi, type OpenTelemetryOption } from "./trace.js";
import { type ConnectionOptions, Transport } from "./transport.js";
import type {
  HeartbeatRequest,
  HeartbeatResponse,
  ProgressBatchResponse,
  PulledJob,
  PullRequest,
  PullResponse,
  Report,
  ReportsResponse,
  RunningAttempt,
} from "./types.js";
import { cutUtf8, errorText, nodeProcess, settlesWithin, sleep } from "./util.js";
import { VERSION } from "./version.js";

/** Where the worker says what it does; `console` by default, `null` for silence. */
export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export interface WorkerOptions extends ConnectionOptions {
  /** The worker id, stable for this worker (default `WORKD_WORKER_ID`, or a random one). */
  id?: string;
  /** Jobs run at once (default 1): the worker pulls only for free slots. */
  capacity?: number;
  /** Queues to take work from (default: the queues that have a handler; every queue with a `"*"` handler). */
  queues?: string[];
  /** Seconds a pull waits for work (default 30, capped by the server's `--pull-wait-max`). */
  pollWait?: number;
  /** On stop, ms running jobs may still take before they are aborted and given back (default 30 000). */
  grace?: number;
  /** Stop gracefully on SIGTERM and SIGINT, at once on the second (Node.js; default true). */
  handleSignals?: boolean;
  /** ms between progress sends (default 200): updates in between are merged. */
  progressInterval?: number;
  logger?: Logger | null;
  /**
   * `@opentelemetry/api`, to run each handler in a span continuing the
   * producer's trace; `false` not to. Default: imported when installed.
   */
  opentelemetry?: OpenTelemetryOption;
}

/** What a handler may say about how far it is; send only what changed. */
export interface ProgressUpdate {
  /** 0 to 1. */
  fraction?: number;
  /** What it is doing now (at most 1024 bytes). */
  message?: string;
  /** A chunk of partial output (chunks are joined in order). */
  output?: string;
}

/** A job handler: its result (anything JSON) completes the attempt; a throw fails it. */
export type Handler = (job: Job) => unknown;

/** One attempt of a work item, as a handler gets it. */
export class Job {
  readonly id: string;
  readonly attempt: number;
  readonly queue: string;
  readonly priority: number;
  readonly payload: unknown;
  /** ms the attempt may run; the signal aborts when they are over. */
  readonly timeoutMs: number;
  /** When the server ends the attempt. */
  readonly deadline: Date;
  /** The producer's W3C trace context, when it sent one. */
  readonly traceparent: string | undefined;
  readonly tracestate: string | undefined;
  /**
   * Aborts when the attempt must stop: the work was cancelled, the timeout
   * passed, or the worker stops and the grace period is over. Its `reason`
   * says which. A handler should give up soon after; what it returns then is
   * not reported.
   */
  readonly signal: AbortSignal;
  private readonly sendProgress: (u: ProgressUpdate) => void;

  /** @internal */
  constructor(pulled: PulledJob, signal: AbortSignal, progress: (u: ProgressUpdate) => void) {
    this.id = pulled.id;
    this.attempt = pulled.attempt;
    this.queue = pulled.queue;
    this.priority = pulled.priority;
    this.payload = pulled.payload;
    this.timeoutMs = pulled.timeout_ms;
    this.deadline = new Date(pulled.deadline);
    this.traceparent = pulled.traceparent;
    this.tracestate = pulled.tracestate;
    this.signal = signal;
    this.sendProgress = progress;
  }

  /**
   * Reports progress. It returns at once: updates are merged and sent in the
   * background every `progressInterval`, and what is left is sent before the
   * result.
   */
  progress(update: ProgressUpdate | number): void {
    this.sendProgress(typeof update === "number" ? { fraction: update } : update);
  }
}

interface Running {
  key: string;
  pulled: PulledJob;
  ctrl: AbortController;
  /** Cancelled by the server: nothing is reported. */
  cancelled: boolean;
  /** Its outcome was reported already (timed out, or given back at stop). */
  reported: boolean;
  settled: Promise<void>;
}

const keyOf = (id: string, attempt: number) => `${id}\u0000${attempt}`;
const MESSAGE_MAX_BYTES = 1024;
const OUTPUT_PENDING_MAX = 256 * 1024;
const REPORT_BATCH_MAX = 1000;
const FLUSH_TIMEOUT_MS = 10_000;
const DEREGISTER_TIMEOUT_MS = 10_000;
/** Reports a pull carries at most (the worker's exchange). */
const CARRY_MAX = 100;
/**
 * While a pull is about to be sent (every slot is busy and the first to free
 * pulls, or a pull is out that is answered at once: it carries reports, or
 * the last one was given all the jobs it asked for; another follows its
 * answer), a new report waits this long (ms) for it rather than going on its
 * own.
 */
const CARRY_MS = 20;
/** Refusals of a report that are final: it is dropped. Any other is sent again. */
const FINAL_REFUSALS = new Set(["superseded", "cancelled", "not-found", "not-holder"]);

/** A pull that carries reports (docs/worker-api.md, the exchange), and its answer. */
type ExchangeRequest = PullRequest & { reports?: Report[] };
type ExchangeResponse = PullResponse & { results?: unknown };

function randomHex(bytes: number): string {
  const b = new Uint8Array(bytes);
  globalThis.crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/**
 * A worker: handlers per queue, run by `run()` until `stop()` (or SIGTERM).
 *
 * ```ts
 * const worker = new Worker({ capacity: 4 });
 * worker.handle("email", async (job) => {
 *   job.progress({ fraction: 0.5, message: "rendering" });
 *   return await send(job.payload, { signal: job.signal });
 * });
 * await worker.run();
 * ```
 */
export class Worker {
  readonly id: string;
  /** This process's instance (128 random bits), sent with every request. */
  readonly instance = randomHex(16);
  readonly capacity: number;
  private readonly transport: Transport;
  private readonly options: WorkerOptions;
  private readonly handlers = new Map<string, Handler>();
  private readonly log: Logger | null;
  private readonly running = new Map<string, Running>();
  private readonly reporter: Reporter;
  private readonly progress: ProgressHub;
  private otel: OpenTelemetryApi | undefined;
  private queues: string[] = [];
  private heartbeatMs = 2000;
  private heartbeatTimer: ReturnType<typeof setTimeout> | undefined;
  private heartbeating: Promise<void> | undefined;
  private slotWaiter: (() => void) | undefined;
  private readonly stopping = new AbortController();
  private readonly hurry = new AbortController();
  private pullCtrl = new AbortController();
  private fatal: unknown;
  private done: Promise<void> | undefined;

  constructor(options: WorkerOptions = {}) {
    this.options = options;
    this.transport = new Transport(options);
    this.id = options.id ?? nodeProcess()?.env?.["WORKD_WORKER_ID"] ?? `worker-${randomHex(4)}`;
    this.capacity = Math.max(1, Math.floor(options.capacity ?? 1));
    this.log = options.logger === undefined ? console : options.logger;
    const base = `/workers/${encodeURIComponent(this.id)}`;
    this.reporter = new Reporter(
      this.transport,
      `${base}/reports`,
      this.instance,
      this.stopping.signal,
      (m) => this.warn(m),
      (m) => this.info(m),
    );
    this.progress = new ProgressHub(
      this.transport,
      `${base}/progress`,
      this.instance,
      options.progressInterval ?? 200,
      (m) => this.warn(m),
    );
  }

  /** Registers the handler of a queue (`"*"`: of every queue without its own). */
  handle(queue: string, handler: Handler): this {
    if (this.done) throw new Error("workd: handlers must be registered before run()");
    this.handlers.set(queue, handler);
    return this;
  }

  /** True once stop() was called (or a signal came). */
  get stopped(): boolean {
    return this.stopping.signal.aborted;
  }

  /**
   * Registers, then pulls and runs jobs until stop(). Resolves once the
   * worker has stopped gracefully (running jobs finished or given back,
   * reports delivered, deregistered); rejects when the worker cannot go on
   * (its id is held by another live instance).
   */
  run(): Promise<void> {
    if (!this.done) this.done = this.main();
    return this.done;
  }

  /**
   * Stops gracefully: no new work is taken, running jobs get `grace` ms to
   * finish, then are aborted and given back. Resolves when the worker has
   * stopped (run() says whether it stopped because of an error).
   * `{ now: true }` skips the grace period.
   */
  stop(options: { now?: boolean } = {}): Promise<void> {
    if (options.now) this.hurry.abort();
    this.stopping.abort();
    this.pullCtrl.abort();
    this.slotWaiter?.();
    return (this.done ?? Promise.resolve()).then(
      () => {},
      () => {},
    );
  }

  private info(m: string) {
    this.log?.info(`workd worker ${this.id}: ${m}`);
  }

  private warn(m: string) {
    this.log?.warn(`workd worker ${this.id}: ${m}`);
  }

  private async main(): Promise<void> {
    if (this.handlers.size === 0) throw new Error("workd: no handler registered (worker.handle(queue, fn))");
    this.queues = this.options.queues ?? (this.handlers.has("*") ? [] : [...this.handlers.keys()]);
    this.otel = await loadOpenTelemetry(this.options.opentelemetry);
    const unlisten = this.listenForSignals();
    try {
      if (!this.stopped) {
        await this.heartbeat(true);
        this.info(`registered with ${this.transport.server} (capacity ${this.capacity})`);
        this.scheduleHeartbeat();
        this.progress.start();
        await this.pullLoop();
      }
    } catch (e) {
      if (!this.stopped) this.fatal = e;
    } finally {
      await this.shutdown();
      unlisten();
    }
    if (this.fatal !== undefined) throw this.fatal;
  }

  private listenForSignals(): () => void {
    const proc = nodeProcess();
    if (this.options.handleSignals === false || !proc?.on || !proc.off) return () => {};
    const onSignal = (sig: unknown) => {
      if (this.stopped) {
        this.info(`got ${String(sig)} again: stopping at once`);
        void this.stop({ now: true });
      } else {
        this.info(`got ${String(sig)}: stopping gracefully (send it again to stop at once)`);
        void this.stop();
      }
    };
    proc.on("SIGTERM", onSignal);
    proc.on("SIGINT", onSignal);
    return () => {
      proc.off!("SIGTERM", onSignal);
      proc.off!("SIGINT", onSignal);
    };
  }

  // ---- heartbeat

  private runningList(): RunningAttempt[] {
    const list = [...this.running.values()].map((r) => ({ id: r.pulled.id, attempt: r.pulled.attempt }));
    const seen = new Set(this.running.keys());
    for (const r of this.reporter.pendingAttempts()) if (!seen.has(keyOf(r.id, r.attempt))) list.push(r);
    return list;
  }

  /** One heartbeat; the first (registration) retries until it is answered or the worker stops. */
  private async heartbeat(first: boolean): Promise<void> {
    const body: HeartbeatRequest = {
      instance: this.instance,
      capacity: this.capacity,
      queues: this.queues,
    };
    if (!first) body.running = this.runningList();
    try {
      const res = await this.transport.request<HeartbeatResponse>("PUT", `/workers/${encodeURIComponent(this.id)}`, {
        body,
        signal: first ? this.stopping.signal : undefined,
        retryFor: first ? Infinity : this.heartbeatMs,
        timeout: Math.max(this.heartbeatMs, 5000),
      });
      this.heartbeatMs = res.data.heartbeat_interval_ms;
      for (const c of res.data.cancel ?? []) this.cancelAttempt(c.id, c.attempt);
    } catch (e) {
      if (first) throw e;
      if (e instanceof WorkdError && e.kind === "worker-id-taken") {
        this.fatal = e;
        this.warn(`${e.message}: stopping`);
        void this.stop({ now: true });
        return;
      }
      this.warn(`heartbeat failed: ${errorText(e)}`);
    }
  }

  private scheduleHeartbeat(): void {
    this.heartbeatTimer = setTimeout(() => {
      this.heartbeating = this.heartbeat(false).finally(() => {
        this.heartbeating = undefined;
        if (this.heartbeatTimer !== undefined) this.scheduleHeartbeat();
      });
    }, this.heartbeatMs);
  }

  private cancelAttempt(id: string, attempt: number): void {
    const r = this.running.get(keyOf(id, attempt));
    if (!r || r.cancelled) return;
    r.cancelled = true;
    this.progress.forget(r.key);
    this.info(`job ${id} attempt ${attempt} cancelled`);
    r.ctrl.abort(new DOMException(`work ${id} was cancelled`, "AbortError"));
  }

  // ---- pulling

  private waitForSlot(): Promise<void> {
    if (this.running.size < this.capacity || this.stopped) return Promise.resolve();
    return new Promise((resolve) => (this.slotWaiter = resolve));
  }

  private slotFreed(): void {
    const w = this.slotWaiter;
    this.slotWaiter = undefined;
    w?.();
  }

  private async pullLoop(): Promise<void> {
    const path = `/workers/${encodeURIComponent(this.id)}/pull`;
    const wait = this.options.pollWait ?? 30;
    let flowing = false; // the last pull was given all it asked for: the next is likely answered at once
    while (!this.stopped) {
      // Every slot busy: the first to free pulls at once, carrying its report.
      this.reporter.setPullComing(true);
      await this.waitForSlot();
      if (this.stopped) break;
      const carried = this.reporter.take(CARRY_MAX);
      // A pull that carries reports is answered at once, as one is while
      // work flows; another follows it, to carry what finishes meanwhile.
      this.reporter.setPullComing(carried.length > 0 || flowing);
      // It waits for no job: the results of its reports would be held.
      const body: ExchangeRequest = {
        instance: this.instance,
        max: this.capacity - this.running.size,
        wait: carried.length ? 0 : wait,
        queues: this.queues,
      };
      if (carried.length) body.reports = carried;
      let jobs: PulledJob[];
      try {
        const res = await this.transport.request<ExchangeResponse>("POST", path, {
          body,
          signal: this.pullCtrl.signal,
          timeout: ((body.wait ?? wait) + 15) * 1000,
          // Reports in it are not held up by retries: they go on their own.
          retryFor: carried.length ? 0 : Infinity,
        });
        jobs = (res.data.jobs ?? []) as PulledJob[];
        if (carried.length) this.reporter.settle(carried, res.data.results ?? null, true);
      } catch (e) {
        flowing = false;
        this.reporter.setPullComing(false);
        if (carried.length && this.reporter.refused(carried, e)) continue; // again, without them
        this.reporter.settle(carried, undefined, true); // no answer: sent again
        if (this.stopped) break;
        if (e instanceof WorkdError && e.kind === "worker-id-taken") throw e;
        this.warn(`pull failed: ${errorText(e)}`);
        await sleep(1000, this.stopping.signal).catch(() => {});
        continue;
      }
      flowing = jobs.length > 0 && jobs.length >= body.max!;
      for (const j of jobs) {
        if (this.stopped) this.reporter.add(giveBack(j, "worker stopping"));
        else this.start(j);
      }
    }
    this.reporter.setPullComing(false);
  }

  // ---- running a job

  private start(pulled: PulledJob): void {
    const key = keyOf(pulled.id, pulled.attempt);
    const ctrl = new AbortController();
    const r: Running = { key, pulled, ctrl, cancelled: false, reported: false, settled: Promise.resolve() };
    this.running.set(key, r);
    this.info(`job ${pulled.id} attempt ${pulled.attempt} started`);
    r.settled = this.execute(r);
  }

  private async execute(r: Running): Promise<void> {
    const { pulled, ctrl } = r;
    const job = new Job(pulled, ctrl.signal, (u) => {
      if (!r.cancelled && !r.reported) this.progress.update(r.key, pulled.id, pulled.attempt, u);
    });
    const timer = setTimeout(() => {
      // Reported now, so that the work is retried at once; the slot stays
      // taken until the handler gives up.
      const why = `timed out after ${pulled.timeout_ms}ms`;
      ctrl.abort(new DOMException(why, "TimeoutError"));
      if (!r.cancelled && !r.reported) {
        r.reported = true;
        this.info(`job ${pulled.id} attempt ${pulled.attempt} ${why}`);
        this.reporter.add({ id: pulled.id, attempt: pulled.attempt, outcome: "failed", error: why, retry: true });
      }
    }, pulled.timeout_ms);
    let report: Report;
    try {
      const handler = this.handlers.get(pulled.queue) ?? this.handlers.get("*");
      if (!handler) throw new Error(`no handler for queue ${pulled.queue}`);
      const run = async () => handler(job);
      let result = await (this.otel ? inConsumerSpan(this.otel, VERSION, pulled, run) : run());
      if (result === undefined) result = null;
      JSON.stringify(result); // a result that is not JSON fails here, as the handler's error
      report = { id: pulled.id, attempt: pulled.attempt, outcome: "completed", result };
      if (!r.cancelled && !r.reported) this.info(`job ${pulled.id} attempt ${pulled.attempt} completed`);
    } catch (e) {
      const error = cutUtf8(errorText(e), 64 * 1024);
      report = { id: pulled.id, attempt: pulled.attempt, outcome: "failed", error, retry: !(e instanceof PermanentError) };
      if (!r.cancelled && !r.reported) this.info(`job ${pulled.id} attempt ${pulled.attempt} failed: ${error}`);
    } finally {
      clearTimeout(timer);
    }
    if (!r.cancelled && !r.reported) {
      await this.progress.flush(r.key); // what the job said last goes before its result
      r.reported = true;
      this.reporter.add(report); // queued before the slot shows free: heartbeats list it meanwhile
    }
    this.progress.forget(r.key);
    this.running.delete(r.key);
    this.slotFreed();
  }

  // ---- stopping

  private async shutdown(): Promise<void> {
    this.stopping.abort();
    this.pullCtrl.abort();
    const graceMs = this.options.grace ?? 30_000;
    if (this.running.size > 0) {
      this.info(`stopping: waiting up to ${graceMs}ms for ${this.running.size} running job(s)`);
      const all = Promise.all([...this.running.values()].map((r) => r.settled));
      await settlesWithin(all, graceMs, this.hurry.signal);
    }
    if (this.running.size > 0) {
      this.warn(`grace period over: stopping and giving back ${this.running.size} job(s)`);
      for (const r of this.running.values()) {
        if (!r.reported && !r.cancelled) {
          r.reported = true;
          this.reporter.add(giveBack(r.pulled, "worker stopping: grace period over"));
        }
        r.ctrl.abort(new DOMException("the worker is stopping", "AbortError"));
      }
    }
    await this.progress.stop();
    // Heartbeats go on meanwhile: they keep the unacknowledged attempts' leases.
    const left = await this.reporter.flush(FLUSH_TIMEOUT_MS);
    if (left > 0) this.warn(`gave up delivering ${left} report(s) after ${FLUSH_TIMEOUT_MS}ms`);
    clearTimeout(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
    await this.heartbeating;
    this.reporter.close();
    if (this.fatal === undefined) await this.deregister();
    this.info("stopped");
  }

  private async deregister(): Promise<void> {
    const path = `/workers/${encodeURIComponent(this.id)}?instance=${encodeURIComponent(this.instance)}`;
    try {
      await this.transport.request<void>("DELETE", path, { retryFor: DEREGISTER_TIMEOUT_MS, timeout: 5000 });
      this.info(`deregistered from ${this.transport.server}`);
    } catch (e) {
      this.warn(`could not deregister: ${errorText(e)}`);
    }
  }
}

function giveBack(j: PulledJob, why: string): Report {
  return { id: j.id, attempt: j.attempt, outcome: "failed", error: why, retry: true };
}

/**
 * What a server's result for a report says (docs/worker-api.md, step 3):
 * undefined when the report is done with (accepted, or refused for good:
 * superseded, cancelled, not-found, not-holder), else why to send it again
 * (another refusal, or an entry that is not this report's).
 */
function reportVerdict(report: Report, result: unknown): string | undefined {
  if (typeof result !== "object" || result === null) return "no result for it in the answer";
  const r = result as { id?: unknown; attempt?: unknown; accepted?: unknown; reason?: unknown };
  if (r.id !== report.id || r.attempt !== report.attempt) return "the answer's entry is of another attempt";
  if (r.accepted === true) return undefined;
  if (r.accepted !== false) return "the answer's entry says nothing of it";
  if (typeof r.reason === "string" && FINAL_REFUSALS.has(r.reason)) return undefined;
  return `refused: ${typeof r.reason === "string" ? r.reason.slice(0, 80) : "no reason"}`;
}

interface PendingReport {
  report: Report;
  /** When it was added (ms). */
  added: number;
  /** In a request now (a pull's or the reporter's). */
  inFlight: boolean;
  /** Not to be carried by a pull: the reports route decides it. */
  ownRoute: boolean;
  /** A refusal of it was logged already. */
  warned: boolean;
}

/**
 * Delivers reports until each is acknowledged (accepted, or refused for a
 * reason that retrying cannot change), with capped backoff. A pull about to
 * be sent carries them (take, settle: the worker's exchange); the others go
 * in batches on the reports route, at once, or once a pull about to be sent
 * had CARRY_MS to carry them.
 */
class Reporter {
  private readonly pending = new Map<string, PendingReport>();
  private sending: Promise<void> | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private timerAt = 0;
  private retryAt = 0;
  private backoff = 100;
  private pullComing = false;
  /** The server takes reports in a pull (false once an older one refused them). */
  private exchange = true;
  private closed = false;
  private readonly idle: (() => void)[] = [];

  constructor(
    private readonly transport: Transport,
    private readonly path: string,
    private readonly instance: string,
    private readonly stopping: AbortSignal,
    private readonly warn: (m: string) => void,
    private readonly info: (m: string) => void,
  ) {}

  add(report: Report): void {
    this.pending.set(keyOf(report.id, report.attempt), {
      report,
      added: Date.now(),
      inFlight: false,
      ownRoute: false,
      warned: false,
    });
    this.schedule();
  }

  pendingAttempts(): RunningAttempt[] {
    return [...this.pending.values()].map((p) => ({ id: p.report.id, attempt: p.report.attempt }));
  }

  /** Whether a pull is about to be sent (reports then wait CARRY_MS for it). */
  setPullComing(coming: boolean): void {
    if (this.pullComing === coming) return;
    this.pullComing = coming;
    this.schedule();
  }

  /** Up to max reports no request carries now, for a pull to carry (hand them back with settle). */
  take(max: number): Report[] {
    const out: Report[] = [];
    if (!this.exchange || this.closed) return out;
    for (const p of this.pending.values()) {
      if (out.length >= max) break;
      if (p.inFlight || p.ownRoute) continue;
      p.inFlight = true;
      out.push(p.report);
    }
    return out;
  }

  /**
   * What an answer said of the reports sent (results undefined: no answer).
   * Accepted ones, and ones refused for good, are done; the others are sent
   * again (by the reports route when a pull carried them, so that no pull
   * waits on a report the server does not take yet). Returns whether all
   * are done.
   */
  settle(sent: Report[], results: unknown, pulled = false): boolean {
    if (sent.length === 0) return true;
    let answered = results !== undefined;
    if (pulled && answered && !Array.isArray(results)) {
      // Not a server of the exchange (a workd server answers them all).
      if (this.exchange) this.info("the server answered a pull that carried reports without their results: reports go on their own");
      this.exchange = false;
      answered = false;
    }
    const list = Array.isArray(results) ? (results as unknown[]) : [];
    let allDone = true;
    sent.forEach((report, i) => {
      const key = keyOf(report.id, report.attempt);
      const p = this.pending.get(key);
      const mine = p !== undefined && p.report === report;
      if (mine) p.inFlight = false;
      const why = answered ? reportVerdict(report, list[i]) : "no answer";
      if (why !== undefined) {
        allDone = false;
        if (mine && answered) {
          if (!p.warned) this.warn(`report of ${report.id} attempt ${report.attempt} not accepted (${why}); will retry`);
          p.warned = true;
          if (pulled) p.ownRoute = true;
        }
        return;
      }
      const r = list[i] as { accepted: boolean; reason?: string };
      if (!r.accepted) this.warn(`report of ${report.id} attempt ${report.attempt} refused: ${r.reason}`);
      if (mine) this.pending.delete(key);
    });
    this.schedule();
    return allDone;
  }

  /**
   * A pull that carried reports was refused as a whole with e: true when
   * that was for its reports, which then go on their own. A server older
   * than the exchange names the field 'reports' (400); a newer one refuses a
   * malformed report (400) or too many (413).
   */
  refused(carried: Report[], e: unknown): boolean {
    if (!(e instanceof WorkdError) || (e.status !== 400 && e.status !== 413)) return false;
    if ((e.detail ?? e.message).includes("'reports'")) {
      if (this.exchange) this.info("the server takes no reports in a pull (an older version): reports go on their own");
      this.exchange = false;
    } else {
      this.warn(`a pull carrying ${carried.length} report(s) was refused (${errorText(e)}): they go on their own`);
      for (const r of carried) {
        const p = this.pending.get(keyOf(r.id, r.attempt));
        if (p?.report === r) p.ownRoute = true;
      }
    }
    this.settle(carried, undefined);
    return true;
  }

  /** When a report may go on the reports route: at once, or once a pull about to be sent had CARRY_MS. */
  private dueAt(p: PendingReport): number {
    return p.added + (this.pullComing && this.exchange && !p.ownRoute ? CARRY_MS : 0);
  }

  /** Sets the timer for the first report due on the reports route (none while a batch is out). */
  private schedule(): void {
    if (this.pending.size === 0) this.idle.splice(0).forEach((f) => f());
    if (this.closed || this.sending) return;
    let at: number | undefined;
    for (const p of this.pending.values()) {
      if (p.inFlight) continue;
      const due = this.dueAt(p);
      if (at === undefined || due < at) at = due;
    }
    if (at === undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
      return;
    }
    at = Math.max(at, this.retryAt);
    if (this.timer !== undefined && this.timerAt <= at) return;
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.fire();
    }, Math.max(0, at - Date.now()));
  }

  /** Sends the reports that are due, in one batch. */
  private fire(): void {
    if (this.closed || this.sending) return;
    const now = Date.now();
    const batch: Report[] = [];
    for (const p of this.pending.values()) {
      if (batch.length >= REPORT_BATCH_MAX) break;
      if (p.inFlight || Math.max(this.dueAt(p), this.retryAt) > now) continue;
      p.inFlight = true;
      batch.push(p.report);
    }
    if (batch.length === 0) {
      this.schedule();
      return;
    }
    this.sending = this.send(batch).finally(() => {
      this.sending = undefined;
      this.schedule();
    });
  }

  private async send(batch: Report[]): Promise<void> {
    let ok: boolean;
    try {
      const res = await this.transport.request<ReportsResponse>("POST", this.path, {
        body: { instance: this.instance, reports: batch },
        retryFor: 0,
        timeout: 15_000,
      });
      const results = (res.data as { results?: unknown } | undefined)?.results;
      ok = this.settle(batch, Array.isArray(results) ? results : []);
    } catch (e) {
      if (e instanceof WorkdError && e.status === 400) {
        // Malformed: sending it again cannot help.
        this.warn(`reports refused (${errorText(e)}); dropping ${batch.length}`);
        for (const r of batch) {
          const key = keyOf(r.id, r.attempt);
          if (this.pending.get(key)?.report === r) this.pending.delete(key);
        }
        return;
      }
      if (!this.stopping.aborted || this.backoff < 1000) this.warn(`reports not delivered (${errorText(e)}); retrying`);
      this.settle(batch, undefined);
      ok = false;
    }
    if (ok) {
      this.backoff = 100;
      this.retryAt = 0;
    } else {
      this.retryAt = Date.now() + this.backoff;
      this.backoff = Math.min(this.backoff * 2, 5000);
    }
  }

  /** Waits until every report is acknowledged or `ms` passed; returns how many are left. */
  async flush(ms: number): Promise<number> {
    if (this.pending.size > 0) {
      await settlesWithin(new Promise<void>((resolve) => this.idle.push(resolve)), ms);
    }
    return this.pending.size;
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.idle.splice(0).forEach((f) => f());
  }
}

interface ProgressEntry {
  id: string;
  attempt: number;
  fraction?: number | undefined;
  message?: string | undefined;
  output: string;
  dirty: boolean;
  /** The server takes no more progress for this attempt. */
  closed: boolean;
}

/** Merges each running attempt's progress and sends all of it in one request per interval. */
class ProgressHub {
  private readonly entries = new Map<string, ProgressEntry>();
  private timer: ReturnType<typeof setInterval> | undefined;
  private sending: Promise<void> | undefined;
  private droppedWarned = false;

  constructor(
    private readonly transport: Transport,
    private readonly path: string,
    private readonly instance: string,
    private readonly intervalMs: number,
    private readonly warn: (m: string) => void,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.send(), this.intervalMs);
  }

  update(key: string, id: string, attempt: number, u: ProgressUpdate): void {
    let e = this.entries.get(key);
    if (!e) this.entries.set(key, (e = { id, attempt, output: "", dirty: false, closed: false }));
    if (e.closed) return;
    if (typeof u.fraction === "number" && Number.isFinite(u.fraction)) {
      e.fraction = Math.min(1, Math.max(0, u.fraction));
      e.dirty = true;
    }
    if (typeof u.message === "string") {
      e.message = cutUtf8(u.message, MESSAGE_MAX_BYTES);
      e.dirty = true;
    }
    if (typeof u.output === "string" && u.output !== "") {
      if (e.output.length + u.output.length > OUTPUT_PENDING_MAX) {
        if (!this.droppedWarned) this.warn(`job ${id}: more than ${OUTPUT_PENDING_MAX} bytes of output waiting; dropping output`);
        this.droppedWarned = true;
      } else {
        e.output += u.output;
        e.dirty = true;
      }
    }
  }

  forget(key: string): void {
    this.entries.delete(key);
  }

  /** Sends what an attempt said last (a few tries, a fraction of a second apart).
   * A send already in flight may hold it: that one is waited for too, so that
   * the result never overtakes the attempt's last progress. */
  async flush(key: string): Promise<void> {
    for (let i = 0; i < 4; i++) {
      while (this.sending) await this.sending;
      const e = this.entries.get(key);
      if (!e || !e.dirty || e.closed) return;
      await this.send();
      if (this.entries.get(key)?.dirty) await sleep(250);
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.sending;
  }

  /** One send of every dirty entry (waits for the one in flight, if any). */
  private async send(): Promise<void> {
    while (this.sending) await this.sending;
    const batch: { key: string; e: ProgressEntry; fraction?: number; message?: string; output: string }[] = [];
    for (const [key, e] of this.entries) {
      if (!e.dirty || e.closed) continue;
      const snap: (typeof batch)[number] = { key, e, output: e.output };
      if (e.fraction !== undefined) snap.fraction = e.fraction;
      if (e.message !== undefined) snap.message = e.message;
      e.fraction = e.message = undefined;
      e.output = "";
      e.dirty = false;
      batch.push(snap);
      if (batch.length >= REPORT_BATCH_MAX) break;
    }
    if (batch.length === 0) return;
    const putBack = (s: (typeof batch)[number]) => {
      s.e.fraction ??= s.fraction;
      s.e.message ??= s.message;
      s.e.output = s.output + s.e.output;
      s.e.dirty = true;
    };
    this.sending = (async () => {
      try {
        const progress = batch.map((s) => {
          const p: { id: string; attempt: number; fraction?: number; message?: string; output?: string } = {
            id: s.e.id,
            attempt: s.e.attempt,
          };
          if (s.fraction !== undefined) p.fraction = s.fraction;
          if (s.message !== undefined) p.message = s.message;
          if (s.output !== "") p.output = s.output;
          return p;
        });
        const res = await this.transport.request<ProgressBatchResponse>("POST", this.path, {
          body: { instance: this.instance, progress },
          retryFor: 0,
          timeout: 10_000,
        });
        res.data.results.forEach((result, i) => {
          const s = batch[i]!;
          if (result.accepted) return;
          if (result.reason === "progress-rate-limited") putBack(s);
          else s.e.closed = true; // not-found, superseded, not held, too large: no more for it
        });
      } catch {
        batch.forEach(putBack); // sent again at the next interval
      }
    })();
    try {
      await this.sending;
    } finally {
      this.sending = undefined;
    }
  }
}
