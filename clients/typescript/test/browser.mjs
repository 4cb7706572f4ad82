// The library in a browser: Debian's Chromium, driven by playwright-core
// (tests/browser's, installed by scripts/install-browser-test), loads dist/
// as ES modules from the server's own origin (files served by the test, so
// no CORS is needed) and runs a Worker and a Client in the page: submit,
// the results stream over fetch streaming, a work item's stream with its
// progress, wait, and the worker's graceful stop. Run by
// tests/integration/test_client_typescript.py:
//
//   node test/browser.mjs --url http://127.0.0.1:PORT --token TOKEN \
//        --playwright tests/browser/node_modules/playwright-core [--chromium /usr/bin/chromium]
//
// Prints what the page found as one JSON line; exit status 0 when every check
// passed, 1 with the reason otherwise.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values: opt } = parseArgs({
  options: {
    url: { type: "string" },
    token: { type: "string" },
    playwright: { type: "string" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
  },
});
const DIST = fileURLToPath(new URL("../dist/", import.meta.url));
const PREFIX = "/__workd-client/"; // a path the server does not have: the test answers it
const { chromium } = await import(pathToFileURL(path.join(opt.playwright, "index.mjs")).href);

const browser = await chromium.launch({ executablePath: opt.chromium, args: ["--no-sandbox"] });
let failed = false;
try {
  const page = await browser.newPage();
  page.on("console", (m) => console.log(`  page| ${m.text()}`));
  await page.route(`${opt.url}${PREFIX}**`, async (route) => {
    const rel = new URL(route.request().url()).pathname.slice(PREFIX.length);
    if (rel === "index.html") {
      await route.fulfill({ contentType: "text/html", body: "<!doctype html><title>workd</title>" });
      return;
    }
    const file = path.join(DIST, rel);
    if (!file.startsWith(DIST)) return route.abort();
    await route.fulfill({ contentType: "text/javascript", body: await readFile(file, "utf8") });
  });
  await page.goto(`${opt.url}${PREFIX}index.html`);
  const got = await page.evaluate(
    async ({ prefix, token }) => {
      const { Client, Worker } = await import(`${prefix}index.js`);
      const servers = location.origin;
      const queue = `browser-${Math.random().toString(16).slice(2, 10)}`;
      const client = new Client({ servers, token });
      const results = client.results({ queue });
      const it = results[Symbol.asyncIterator]();
      const first = it.next(); // connects; the stream starts from now
      const worker = new Worker({ servers, token, id: `${queue}-w`, capacity: 2, logger: null });
      worker.handle(queue, async (job) => {
        job.progress({ fraction: 0.5, message: `tripling ${job.payload}`, output: "x" });
        await new Promise((r) => setTimeout(r, 50));
        return job.payload * 3;
      });
      const running = worker.run();
      while (results.lastEventId === undefined) await new Promise((r) => setTimeout(r, 20));
      const { items } = await client.submitMany([1, 2, 3].map((n) => ({ queue, payload: n })));
      const seen = {};
      for (let next = first; ; next = it.next()) {
        const ev = (await next).value;
        seen[ev.id] = [ev.status, ev.result];
        if (Object.keys(seen).length === 3) break;
      }
      await it.return();
      const waited = await client.wait(items[0].id, { timeout: 20 });
      const stream = [];
      for await (const ev of client.stream(items[1].id)) stream.push([ev.status, ev.message ?? ev.result]);
      await worker.stop();
      await running;
      const listed = (await client.cluster()).workers.some((w) => w.id === `${queue}-w`);
      return {
        hasProcess: typeof process !== "undefined",
        seen: items.map((i) => seen[i.id]),
        waited: [waited.status, waited.result],
        stream,
        listedAfterStop: listed,
      };
    },
    { prefix: PREFIX, token: opt.token },
  );
  console.log(JSON.stringify(got));
  const want = {
    hasProcess: false,
    seen: [["completed", 3], ["completed", 6], ["completed", 9]],
    waited: ["completed", 3],
    stream: [["progress", "tripling 2"], ["completed", 6]],
    listedAfterStop: false,
  };
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    console.log(`the page found ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
    failed = true;
  }
} catch (e) {
  console.log(`browser test failed: ${e.stack ?? e}`);
  failed = true;
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
