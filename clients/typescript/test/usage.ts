// Compiled (not run) by test/units.test.mjs against dist/'s declarations, as a
// user's TypeScript would be: the README's examples type-check, the answer
// types are the generated ones, and the OpenTelemetry API module fits the
// `opentelemetry` option.
import * as otel from "@opentelemetry/api";
import { Client, type Job, PermanentError, type ResultEvent, type Work, Worker, WorkdError } from "workd";

export async function usage(): Promise<void> {
  const workd = new Client({ servers: ["http://127.0.0.1:8080"], opentelemetry: otel });
  const { id, created } = await workd.submit({ queue: "email", payload: { to: "ann" }, max_attempts: 3 });
  const work: Work = await workd.wait(id, { timeout: 60 });
  const status: "pending" | "running" | "completed" | "dead" | "cancelled" | string = work.status;
  for await (const ev of workd.results({ queue: "email", after: 0 })) {
    const e: ResultEvent = ev;
    if (e.status === "completed") console.log(e.result, e.attempt, created, status);
    if (e.status === "progress") console.log(e.fraction, e.message);
  }
  try {
    await workd.cancel(id);
  } catch (e) {
    if (e instanceof WorkdError && e.kind === "not-cancellable") console.log(e.status, e.detail);
  }
  const worker = new Worker({ id: "mailer-1", capacity: 4, opentelemetry: otel });
  worker.handle("email", async (job: Job) => {
    job.progress({ fraction: 0.5, message: "rendering", output: "..." });
    if (job.signal.aborted) throw new PermanentError("no");
    return { sent: true, payload: job.payload, trace: job.traceparent };
  });
  await worker.run();
}
