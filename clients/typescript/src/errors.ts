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
 * Thrown by a handler, fails the attempt without retries: the work is dead at
 * once (`retry: false`). Any other error is a failed attempt that is retried
 * until the work's `max_attempts`.
 */
export class PermanentError extends Error {
  override name = "PermanentError";
}
