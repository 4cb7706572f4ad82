// HTTP to a workd cluster: several servers tried in turn, the bearer token,
// and retries while no server can answer (connection refused, 503).
import { BadAnswer, WorkdError } from "./errors.js";
import type { Problem } from "./types.js";
import { env, sleep } from "./util.js";

export interface ConnectionOptions {
  /**
   * The server(s) to talk to: a URL or a list, tried in turn (any node of a
   * cluster answers every request). Default: `WORKD_SERVER` (comma or space
   * separated) or `http://127.0.0.1:8080`.
   */
  servers?: string | readonly string[];
  /** Bearer token. Default: `WORKD_TOKEN`. */
  token?: string;
  /**
   * How long (ms) to keep retrying a request that no server could answer
   * (connection failed, `503`): default 30 000. The retries move through
   * `servers`, waiting as `Retry-After` says (at most RETRY_AFTER_MAX_MS).
   */
  retryFor?: number;
  /** The fetch to use (default: the global one). */
  fetch?: typeof globalThis.fetch;
}

export interface RequestOptions {
  body?: unknown;
  headers?: Record<string, string>;
  signal?: AbortSignal | undefined;
  /** ms one try may take before it counts as failed (default 30 000). */
  timeout?: number;
  /** Overrides ConnectionOptions.retryFor for this request (Infinity: until aborted). */
  retryFor?: number;
}

export interface Answer<T> {
  status: number;
  headers: Headers;
  data: T;
  /** The base URL of the server that answered. */
  server: string;
}

const DEFAULT_SERVER = "http://127.0.0.1:8080";
const BACKOFF_FIRST_MS = 100;
const BACKOFF_MAX_MS = 2000;

/**
 * The longest answer read, in bytes (a stream's events have their own bound,
 * EVENT_MAX_BYTES). No workd answer comes near it: the largest,
 * `GET /work/{id}`, holds a payload and a result of at most `--max-body` each
 * (1 MiB by default), and a node refuses to forward a reply over
 * `--max-reply-bytes` (16 MiB). A longer one is a broken or hostile server:
 * BadAnswer, not all the memory.
 */
export const MAX_ANSWER_BYTES = 64 * 1024 * 1024;

/**
 * The longest pause (ms) a `Retry-After` buys, whatever it says (a date next
 * year): the bound of every workd client. A request never waits past its
 * `retryFor`.
 */
export const RETRY_AFTER_MAX_MS = 60_000;

/**
 * `Retry-After` (RFC 9110: delta-seconds, or an HTTP-date) as seconds from
 * now, at most RETRY_AFTER_MAX_MS; undefined when there is none or it is
 * neither (a negative number, a fraction, words).
 */
export function retryAfter(h: Headers, now = Date.now()): number | undefined {
  const v = h.get("retry-after")?.trim() ?? "";
  const max = RETRY_AFTER_MAX_MS / 1000;
  if (/^\d+$/.test(v)) return Math.min(Number(v), max);
  // An HTTP-date names its day first ("Sun, 06 Nov 1994 08:49:37 GMT").
  if (!/^[A-Za-z]{3}/.test(v)) return undefined;
  const when = Date.parse(v);
  if (Number.isNaN(when)) return undefined;
  return Math.min(Math.max(0, (when - now) / 1000), max);
}

/**
 * The body of `res` as text, reading at most `max` bytes: a longer one (told
 * by its Content-Length, or found reading) throws BadAnswer and the rest is
 * not read.
 */
export async function readText(res: Response, max: number, what: string): Promise<string> {
  const tooLong = (size: string) =>
    new BadAnswer(`${what}: the answer is ${size}, more than the ${max} bytes a workd answer can be; not read further`, {
      status: res.status,
    });
  const length = Number(res.headers.get("content-length") ?? "");
  if (length > max) {
    res.body?.cancel().catch(() => {});
    throw tooLong(`${length} bytes long`);
  }
  if (!res.body) return "";
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > max) {
      reader.cancel().catch(() => {});
      throw tooLong("longer");
    }
    chunks.push(value);
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.byteLength;
  }
  return new TextDecoder().decode(all);
}

/** The body of an answer that is a refusal, "" when it cannot be read (or is too long). */
function refusalText(res: Response, what: string): Promise<string> {
  return readText(res, MAX_ANSWER_BYTES, what).catch(() => "");
}

/** True for what a fetch throws when no answer came (not an abort by the caller). */
function isNetworkError(e: unknown): boolean {
  return e instanceof TypeError || (e instanceof DOMException && e.name === "TimeoutError");
}

export class Transport {
  readonly servers: readonly string[];
  readonly token: string | undefined;
  readonly retryFor: number;
  private readonly fetchFn: typeof globalThis.fetch;
  private current = 0;

  constructor(opts: ConnectionOptions = {}) {
    let list: string[];
    if (typeof opts.servers === "string") list = [opts.servers];
    else if (opts.servers) list = [...opts.servers];
    else list = (env("WORKD_SERVER") ?? DEFAULT_SERVER).split(/[\s,]+/);
    list = list.map((s) => s.trim().replace(/\/+$/, "")).filter((s) => s !== "");
    if (list.length === 0) throw new TypeError("workd: no server given");
    this.servers = list;
    this.token = opts.token ?? env("WORKD_TOKEN");
    this.retryFor = opts.retryFor ?? 30_000;
    const f = opts.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("workd: no fetch available");
    this.fetchFn = f.bind(globalThis);
  }

  /** The base URL requests go to now. */
  get server(): string {
    return this.servers[this.current]!;
  }

  /** Moves on to the next server, unless another request did already. */
  private failover(from: number): void {
    if (this.current === from && this.servers.length > 1) this.current = (from + 1) % this.servers.length;
  }

  /** Moves on from `server` (a stream found it silent), unless requests did already. */
  passOver(server: string): void {
    this.failover(this.servers.indexOf(server));
  }

  headers(extra?: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { ...extra };
    if (this.token !== undefined) h["Authorization"] = `Bearer ${this.token}`;
    return h;
  }

  /**
   * Sends a request and gives back the answer that is not a connection
   * failure or a 503, trying the servers in turn with backoff until
   * `retryFor` has passed. A 2xx answer's JSON body is `data`; any other
   * answer is thrown as a WorkdError.
   */
  async request<T>(method: string, path: string, opts: RequestOptions = {}): Promise<Answer<T>> {
    const res = await this.send(method, path, opts);
    let text: string;
    try {
      text = await readText(res.response, MAX_ANSWER_BYTES, `${method} ${path}`);
    } finally {
      res.release();
    }
    let data: unknown = undefined;
    if (text !== "") {
      const type = res.response.headers.get("content-type") ?? "";
      try {
        data = /json/.test(type) ? JSON.parse(text) : text;
      } catch (e) {
        if (res.response.status >= 400) data = text;
        else throw new BadAnswer(`${method} ${path}: the answer is not JSON (${errorMessage(e)})`, { status: res.response.status });
      }
    }
    if (res.response.status >= 400) throw problemError(method, path, res.response, data);
    return { status: res.response.status, headers: res.response.headers, data: data as T, server: res.server };
  }

  /**
   * Like request, for a body the caller reads (a stream): `timeout` bounds
   * the wait for the answer's head only, and `signal` keeps aborting the
   * body until `release()` is called. A 2xx answer only.
   */
  async open(path: string, opts: RequestOptions = {}): Promise<{ response: Response; server: string; release: () => void }> {
    const res = await this.send("GET", path, opts, true);
    if (res.response.status >= 400) {
      const text = await refusalText(res.response, `GET ${path}`);
      res.release();
      let data: unknown = text;
      try {
        data = JSON.parse(text);
      } catch {
        // not a problem body
      }
      throw problemError("GET", path, res.response, data);
    }
    return res;
  }

  private async send(
    method: string,
    path: string,
    opts: RequestOptions,
    headOnly = false,
  ): Promise<{ response: Response; server: string; release: () => void }> {
    const retryFor = opts.retryFor ?? this.retryFor;
    const giveUp = Date.now() + retryFor;
    const timeoutMs = opts.timeout ?? 30_000;
    const headers = this.headers(opts.headers);
    let body: string | undefined;
    if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers["Content-Type"] = "application/json";
    }
    let backoff = BACKOFF_FIRST_MS;
    for (let tries = 1; ; tries++) {
      if (opts.signal?.aborted) throw opts.signal.reason;
      const index = this.current;
      const base = this.servers[index]!;
      // One controller per try: the caller's signal and this try's timeout abort it.
      const ctrl = new AbortController();
      const onAbort = () => ctrl.abort(opts.signal!.reason);
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      const timer = setTimeout(
        () => ctrl.abort(new DOMException(`no answer within ${timeoutMs}ms`, "TimeoutError")),
        timeoutMs,
      );
      const release = () => {
        clearTimeout(timer);
        opts.signal?.removeEventListener("abort", onAbort);
      };
      let why: WorkdError;
      let wait = backoff;
      try {
        // A redirect is not followed: a workd server never sends one, and
        // following it would send the request and its body wherever it says.
        const init: RequestInit = { method, headers, signal: ctrl.signal, redirect: "manual" };
        if (body !== undefined) init.body = body;
        const response = await this.fetchFn(base + path, init);
        if (response.type === "opaqueredirect" || (response.status >= 300 && response.status < 400)) {
          response.body?.cancel().catch(() => {});
          const location = response.headers.get("location") ?? undefined;
          throw new BadAnswer(
            `${method} ${path}: ${base} answered ${response.status || "with"} a redirect` +
              `${location ? ` to ${location}` : ""}, which workd does not follow ` +
              "(a workd server never redirects: give the URL it names if you trust it)",
            location === undefined ? { status: response.status } : { status: response.status, location },
          );
        }
        if (response.status !== 503) {
          if (headOnly) clearTimeout(timer);
          return { response, server: base, release };
        }
        const text = await refusalText(response, `${method} ${path}`);
        let data: unknown = text;
        try {
          data = JSON.parse(text);
        } catch {
          // not JSON
        }
        why = problemError(method, path, response, data);
        if (why.retryAfter !== undefined) wait = Math.max(wait, why.retryAfter * 1000);
        release();
      } catch (e) {
        release();
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (!isNetworkError(e)) throw e;
        why = new WorkdError(`${method} ${path}: ${base} did not answer (${describe(e)})`, { cause: e });
      }
      this.failover(index);
      // Each server once without waiting, then back off between rounds.
      if (tries % this.servers.length !== 0) wait = 0;
      else backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
      if (Date.now() + wait > giveUp) throw why;
      await sleep(wait, opts.signal);
    }
  }
}

function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function describe(e: unknown): string {
  const cause = (e as { cause?: { code?: string; message?: string } }).cause;
  if (cause?.code) return cause.code;
  if (cause?.message) return cause.message;
  return e instanceof Error ? e.message : String(e);
}

function problemError(method: string, path: string, res: Response, data: unknown): WorkdError {
  const isProblem = typeof data === "object" && data !== null && "type" in data && "status" in data;
  const problem = isProblem ? (data as Problem) : undefined;
  const detail = problem?.detail ?? (typeof data === "string" ? data.slice(0, 500) : undefined);
  const init: ConstructorParameters<typeof WorkdError>[1] = { status: res.status };
  if (problem) init.problem = problem;
  if (detail !== undefined) init.detail = detail;
  const ra = retryAfter(res.headers);
  if (ra !== undefined) init.retryAfter = ra;
  return new WorkdError(`${method} ${path}: ${res.status} ${detail ?? res.statusText}`, init);
}
