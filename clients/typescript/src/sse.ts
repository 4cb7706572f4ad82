// Server-sent events over fetch streaming: a parser (the WHATWG rules that
// workd's streams use) and a stream that reconnects with Last-Event-ID, moves
// through the servers, and never yields an event twice. An event id is an
// opaque cursor: each shard's last seq, in shard order, joined by "." ("812"
// in a cluster of one shard, "812.0.77.1204" in one of four); order holds per
// shard only, so ids compare shard by shard (cursorLe).
import { BadAnswer, WorkdError } from "./errors.js";
import type { Transport } from "./transport.js";
import { sleep } from "./util.js";

/**
 * The longest line read, and the longest data of one event (its data lines
 * joined), in UTF-16 code units (never more than its UTF-8 bytes): a result's
 * data line is as large as a result the server accepts (a few MiB). A longer
 * one, or a stream that never sends a newline, throws BadAnswer instead of
 * taking all the memory.
 */
export const EVENT_MAX_BYTES = 16 * 1024 * 1024;

/** The shortest pause before a reconnection, whatever `retry:` says. */
const RECONNECT_MIN_MS = 100;

function tooLong(): BadAnswer {
  return new BadAnswer(
    `the stream sent an event longer than ${EVENT_MAX_BYTES} bytes, or a line that does not end; no workd event is`,
    { status: 200 },
  );
}

export interface SseMessage {
  /** The last `id:` seen so far (the block's own, or an earlier one). */
  id: string | undefined;
  event: string;
  data: string;
}

/**
 * The messages of an event stream. Comments and `retry:` are reported through
 * `onComment`/`onRetry`; every chunk read counts as activity (`onChunk`). A
 * line or an event's data longer than EVENT_MAX_BYTES throws BadAnswer.
 */
export async function* parseEventStream(
  body: ReadableStream<Uint8Array>,
  hooks: { onChunk?: () => void; onRetry?: (ms: number) => void } = {},
): AsyncGenerator<SseMessage> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let data: string[] = [];
  let size = 0; // of data
  let event = "";
  let id: string | undefined;
  try {
    for (let ended = false; !ended; ) {
      const { value, done } = await reader.read();
      ended = done;
      if (!done) {
        hooks.onChunk?.();
        buf += decoder.decode(value, { stream: true });
      }
      for (;;) {
        const m = /\r\n|\n|\r/.exec(buf);
        // A \r at the end may be the first half of \r\n: wait for more, unless the stream ended.
        if (!m || (m[0] === "\r" && m.index === buf.length - 1 && !ended)) {
          if (buf.length > EVENT_MAX_BYTES) throw tooLong();
          break;
        }
        const line = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        if (line.length > EVENT_MAX_BYTES) throw tooLong();
        if (line === "") {
          if (data.length > 0) yield { id, event: event || "message", data: data.join("\n") };
          data = [];
          size = 0;
          event = "";
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") {
          size += value.length + 1;
          if (size > EVENT_MAX_BYTES) throw tooLong();
          data.push(value);
        } else if (field === "event") event = value;
        else if (field === "id" && !value.includes("\0")) id = value;
        else if (field === "retry" && /^\d+$/.test(value)) hooks.onRetry?.(Number(value));
      }
    }
  } finally {
    // Not awaited: a browser may settle the cancel of a fetch body only once
    // the connection is gone, which the caller does next.
    reader.cancel().catch(() => {});
  }
}

/** A cursor's seqs, or undefined when its text is not numbers joined by dots. */
function cursorSeqs(cursor: string): bigint[] | undefined {
  const parts = cursor.split(".");
  if (!parts.every((p) => /^[0-9]+$/.test(p))) return undefined;
  return parts.map((p) => BigInt(p));
}

/**
 * Whether the event id (cursor) `a` is nothing new after `b`: every shard's
 * seq of `a` is at or below `b`'s, a missing trailing one counting as 0. An id
 * that is not numbers joined by dots is never below anything (it is new).
 */
export function cursorLe(a: string, b: string): boolean {
  const sa = cursorSeqs(a);
  const sb = cursorSeqs(b);
  if (sa === undefined || sb === undefined) return false;
  for (let i = 0; i < Math.max(sa.length, sb.length); i++) {
    if ((sa[i] ?? 0n) > (sb[i] ?? 0n)) return false;
  }
  return true;
}

export interface StreamOptions {
  /** Start after this event id (an opaque cursor, e.g. a `lastEventId`; `0`: from the beginning of the log). */
  after?: number | string;
  /** Stop the stream (the iterator then ends). */
  signal?: AbortSignal;
  /**
   * Reconnect when nothing, not even a keep-alive comment, arrived for this
   * long (ms; default 45 000, three times the server's default keep-alive).
   */
  idleTimeout?: number;
}

const TERMINAL = new Set(["completed", "dead", "cancelled"]);

/**
 * One results stream (`/results` or `/work/{id}/stream`), iterated with
 * `for await`. It follows the stream across dropped connections and server
 * restarts: each reconnection sends the id of the last event it yielded as
 * `Last-Event-ID`, and an event whose id is not above it in some shard
 * (`cursorLe`) is never yielded again. `lastEventId` says where it is, to
 * resume a later stream from.
 */
export class EventStream<E extends { seq: number }> implements AsyncIterable<E> {
  /** The id of the last event yielded (or of the stream's start): an opaque cursor. */
  lastEventId: string | undefined;
  private readonly transport: Transport;
  private readonly path: string;
  private readonly opts: StreamOptions;
  private readonly untilFinished: boolean;
  private readonly stopper = new AbortController();

  /** @internal */
  constructor(transport: Transport, path: string, opts: StreamOptions, untilFinished: boolean) {
    this.transport = transport;
    this.path = path;
    this.opts = opts;
    this.untilFinished = untilFinished;
    if (opts.after !== undefined) this.lastEventId = String(opts.after);
    if (opts.signal?.aborted) this.stopper.abort(opts.signal.reason);
    else opts.signal?.addEventListener("abort", () => this.stopper.abort(opts.signal!.reason), { once: true });
  }

  /** Ends the stream: a pending or later `next()` finishes the iteration. */
  close(): void {
    this.stopper.abort();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<E> {
    const stop = this.stopper.signal;
    let retryMs = 1000;
    let failures = 0;
    while (!stop.aborted) {
      const conn = new AbortController();
      const onStop = () => conn.abort();
      stop.addEventListener("abort", onStop, { once: true });
      const idleMs = this.opts.idleTimeout ?? 45_000;
      let idle: ReturnType<typeof setTimeout> | undefined;
      let release: (() => void) | undefined;
      let server: string | undefined;
      let delivered = false; // this connection gave an event
      const touch = () => {
        clearTimeout(idle);
        idle = setTimeout(() => {
          // A node that sends nothing, not even keep-alives, is passed over.
          if (server !== undefined) this.transport.passOver(server);
          conn.abort(new DOMException("stream idle", "TimeoutError"));
        }, idleMs);
      };
      try {
        const headers: Record<string, string> = { Accept: "text/event-stream" };
        if (this.lastEventId !== undefined) headers["Last-Event-ID"] = this.lastEventId;
        // The wait for an answer's head is bounded by the same time, per server.
        const opened = await this.transport.open(this.path, {
          headers,
          signal: conn.signal,
          timeout: idleMs,
          retryFor: Infinity,
        });
        release = opened.release;
        server = opened.server;
        touch();
        const response = opened.response;
        if (!response.body) throw new WorkdError(`GET ${this.path}: the answer has no body`);
        const messages = parseEventStream(response.body, { onChunk: touch, onRetry: (ms) => (retryMs = ms) });
        for await (const msg of messages) {
          if (msg.event === "ready") {
            // The stream's start: resume from here if nothing comes before a drop.
            if (this.lastEventId === undefined && msg.id !== undefined) this.lastEventId = msg.id;
            continue;
          }
          if (msg.id === undefined) continue;
          if (this.lastEventId !== undefined && cursorLe(msg.id, this.lastEventId)) continue;
          const data = JSON.parse(msg.data) as E & { status?: string };
          this.lastEventId = msg.id;
          clearTimeout(idle); // the consumer's time is not the server's silence
          delivered = true;
          yield data;
          touch();
          if (this.untilFinished && TERMINAL.has(String(data.status))) return;
          if (stop.aborted) return;
        }
      } catch (e) {
        if (stop.aborted) return;
        // An answer no workd server gives, and a refusal that retrying cannot
        // mend (bad filter, token), end the stream.
        if (e instanceof BadAnswer) throw e;
        if (e instanceof WorkdError && e.status >= 400 && e.status < 500 && e.status !== 429) throw e;
      } finally {
        clearTimeout(idle);
        stop.removeEventListener("abort", onStop);
        conn.abort();
        release?.();
      }
      // A connection that failed, or ended without an event, makes the next
      // pause longer: a server that closes every stream at once (or says
      // `retry: 0`) is not asked again and again without end.
      failures = delivered ? 0 : failures + 1;
      try {
        await sleep(Math.min(Math.max(retryMs, RECONNECT_MIN_MS) * Math.max(1, failures), 10_000), stop);
      } catch {
        return;
      }
    }
  }
}
