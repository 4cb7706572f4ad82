// The request and answer types of the API, named once, from the types that
// scripts/generate-types.mjs generates out of openapi.yaml.
import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type { components, paths, operations } from "./generated/openapi.js";

/** One work item to submit (`POST /work`). */
export type SubmitItem = Schemas["SubmitItem"];
/** Items that open (or join) a batch. */
export type SubmitBatch = Schemas["SubmitBatch"];
export type SubmitResult = Schemas["SubmitResult"];
export type SubmitBulkResult = Schemas["SubmitBulkResult"];
export type Work = Schemas["Work"];
export type WorkStatus = Schemas["WorkStatus"];
export type WorkList = Schemas["WorkList"];
export type WorkEvent = Schemas["WorkEvent"];
export type WorkEvents = Schemas["WorkEvents"];
export type CancelResult = Schemas["CancelResult"];
export type RetryResult = Schemas["RetryResult"];
/** The `data` of one results-stream event (completed, dead, cancelled, progress, batch). */
export type ResultEvent = Schemas["ResultEvent"];
export type QueueStatsList = Schemas["QueueStatsList"];
export type QueueStats = Schemas["QueueStats"];
export type QueueLimitsSet = Schemas["QueueLimitsSet"];
export type QueueLimitsAnswer = Schemas["QueueLimitsAnswer"];
export type Schedule = Schemas["Schedule"];
export type ScheduleSet = Schemas["ScheduleSet"];
export type Cluster = Schemas["Cluster"];
export type Problem = Schemas["Problem"];

/** A job as a pull answers it; `traceparent`/`tracestate` when the producer sent them. */
export type PulledJob = Schemas["Job"];
export type HeartbeatRequest = Schemas["HeartbeatRequest"];
export type HeartbeatResponse = Schemas["HeartbeatResponse"];
export type PullRequest = Schemas["PullRequest"];
export type PullResponse = Schemas["PullResponse"];
export type Report = Schemas["Report"];
export type ReportsRequest = Schemas["ReportsRequest"];
export type ReportsResponse = Schemas["ReportsResponse"];
export type ProgressBatchRequest = Schemas["ProgressBatchRequest"];
export type ProgressBatchResponse = Schemas["ProgressBatchResponse"];
export type RunningAttempt = Schemas["RunningAttempt"];

/** W3C trace context of a submission, sent as the `traceparent`/`tracestate` headers. */
export interface TraceContext {
  traceparent?: string;
  tracestate?: string;
}
