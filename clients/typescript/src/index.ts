// workd: the client and worker library of the workd work queue.
export { Client } from "./client.js";
export type { ClientOptions, ResultsOptions, SubmitManyItem, SubmitOptions, WaitOptions } from "./client.js";
export { Worker, Job } from "./worker.js";
export type { Handler, Logger, ProgressUpdate, WorkerOptions } from "./worker.js";
export { BadAnswer, WorkdError, PermanentError } from "./errors.js";
export { EVENT_MAX_BYTES, EventStream, cursorLe, parseEventStream } from "./sse.js";
export type { SseMessage, StreamOptions } from "./sse.js";
export { MAX_ANSWER_BYTES, RETRY_AFTER_MAX_MS } from "./transport.js";
export type { ConnectionOptions } from "./transport.js";
export { formatTraceContext, parseTraceparent } from "./trace.js";
export type { OpenTelemetryOption, SpanContextLike } from "./trace.js";
export { VERSION } from "./version.js";
export type * from "./types.js";
