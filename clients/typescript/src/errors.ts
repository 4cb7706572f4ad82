// The errors the library throws: an answer of the server that is a problem
// (RFC 9457), no server reachable in time, and the error a handler throws to
// make its failure final.
import type { Problem } from "./types.js";

/** An answer that is an error: `status` and, when the body is a problem, its fields. */
export class WorkdError extends Error {
  override name = "WorkdError";
  /** The HTTP status, or 0 when no server answered. */
  readonly status: number;
  /** The problem's `type` (`https://workd.dev/problems/<kind>`), if any. */
  readonly type: string | undefined;
  /** The problem's detail (or the body's text). */
  readonly detail: string | undefined;
  /** Seconds the server asked to wait (`Retry-After`), if any. */
  readonly retryAfter: number | undefined;
  /** The whole problem body, when there was one. */
  readonly problem: Problem | undefined;

  constructor(
    message: string,
    init: { status?: number; problem?: Problem; detail?: string; retryAfter?: number; cause?: unknown } = {},
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.status = init.status ?? 0;
    this.problem = init.problem;
    this.type = init.problem?.type;
    this.detail = init.problem?.detail ?? init.detail;
    this.retryAfter = init.retryAfter;
  }

  /** The problem's kind: the last part of its `type` (`not-found`, `conflict`, ...). */
  get kind(): string | undefined {
    return this.type?.slice(this.type.lastIndexOf("/") + 1);
  }
}

/**
 * An answer that no workd server gives, thrown at once and never retried: a
 * body longer than the library reads (`MAX_ANSWER_BYTES`, or an event of a
 * stream over `EVENT_MAX_BYTES`), a body that is not JSON, or a redirect,
 * which the library does not follow (a workd server never redirects; following
 * one would send the request and its body wherever an answer says):
 * `location` is where it pointed. `status` is the answer's HTTP status (0 for
 * a browser's opaque redirect).
 */
export class BadAnswer extends WorkdError {
  override name = "BadAnswer";
  readonly location: string | undefined;

  constructor(message: string, init: { status?: number; location?: string } = {}) {
    super(message, { status: init.status ?? 0, detail: message });
    this.location = init.location;
  }
}

/**
 * Thrown by a handler, fails the attempt without retries: the work is dead at
 * once (`retry: false`). Any other error is a failed attempt that is retried
 * until the work's `max_attempts`.
 */
export class PermanentError extends Error {
  override name = "PermanentError";
}
