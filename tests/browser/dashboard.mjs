// Drives Debian's Chromium through the workd dashboard with playwright-core.
// Run by tests/integration/test_dashboard.py against a real cluster (a server
// and a demo worker); installed by scripts/install-browser-test.
//
//   node dashboard.mjs --url http://127.0.0.1:PORT --worker ID --screenshot FILE.png
//                      [--token ADMIN_TOKEN] [--subscription NAME] [--chromium /usr/bin/chromium]
//
// Without --token the server is open: submit from the form, see the result in
// the live feed, open the work page, cancel, retry, page through the list.
// With --token the server wants one: the token prompt appears and, once the
// admin token is entered, the panels and the feed load.
// Exit status 0 when every step passed; 1 with the failed step otherwise (and
// FILE-failure.png next to the screenshot).
//
// With --rendezvous the script asks its caller to act at one point: it prints
// "@@restart-feed" and reads one JSON line from stdin ({"ids": [...]}: work the
// caller finished while it restarted the node the page is on), then checks that
// the live feed resumed and shows each of those results once.

import {mkdtemp, rm, mkdir} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {dirname, join} from 'node:path';
import {createInterface} from 'node:readline';
import {parseArgs} from 'node:util';
import {chromium} from 'playwright-core';

const {values: opt} = parseArgs({
  options: {
    url: {type: 'string'},
    worker: {type: 'string'},
    screenshot: {type: 'string'},
    token: {type: 'string'},
    rendezvous: {type: 'boolean', default: false},
    subscription: {type: 'string'},
    shards: {type: 'string', default: '1'},
    chromium: {type: 'string', default: '/usr/bin/chromium'},
  },
});
for (const k of ['url', 'worker', 'screenshot']) {
  if (!opt[k]) {
    console.error(`dashboard.mjs: --${k} is required`);
    process.exit(2);
  }
}
const sibling = (suffix) => opt.screenshot.replace(/(\.png)?$/, `${suffix}.png`);
const T = 20000; // per step: generous for two shared cores

let step = 'start';
const t0 = Date.now();
function log(msg) {
  console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`);
}
function begin(name) {
  step = name;
  log(name);
}
function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

const stdinLines = createInterface({input: process.stdin})[Symbol.asyncIterator]();
/** Prints @@tag and waits for the caller's answer: one JSON line on stdin. */
async function rendezvous(tag) {
  console.log(`@@${tag}`);
  const {value, done} = await stdinLines.next();
  check(!done, `stdin closed while waiting for the answer to @@${tag}`);
  return JSON.parse(value);
}

const userDataDir = await mkdtemp(join(tmpdir(), 'workd-chromium-'));
await mkdir(dirname(opt.screenshot), {recursive: true});
let context, page;
const problems = [];

async function main() {
  begin(`launch ${opt.chromium}`);
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: opt.chromium,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: {width: 1440, height: 1000},
    timeout: 60000,
  });
  context.setDefaultTimeout(T);
  page = context.pages()[0] || (await context.newPage());
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    const text = m.text();
    // The browser logs every non-2xx answer; the API answers 401/404 on purpose.
    if (/Failed to load resource/.test(text)) return;
    problems.push(`console error: ${text}`);
  });
  page.on('dialog', (d) => d.accept()); // confirm() of cancel and retry

  if (opt.token) await withToken();
  else await open();

  check(!problems.length, `the page reported problems:\n  ${problems.join('\n  ')}`);
  log('all steps passed');
}

/** Submits one item through the form; returns its id. */
async function submit(payload, fields = {}) {
  await page.fill('#submit-payload', payload);
  for (const [id, v] of Object.entries(fields)) await page.fill(`#submit-${id}`, String(v));
  const before = await page.evaluate(() => document.querySelector('#submit-result a')?.dataset.id ?? null);
  await page.click('#submit-form button[type=submit]');
  await page.waitForFunction((prev) => {
    const a = document.querySelector('#submit-result a');
    return a && a.dataset.id !== prev;
  }, before);
  for (const id of Object.keys(fields)) await page.fill(`#submit-${id}`, '');
  return page.locator('#submit-result a').getAttribute('data-id');
}

const feedItem = (id, status) => page.locator(`#feed li[data-id="${id}"][data-status="${status}"]`);

async function open() {
  const extra = []; // work the caller submitted (and finished) at the rendezvous
  begin('load the dashboard');
  await page.goto(`${opt.url}/`);
  await page.locator('#feed-state[data-state="live"]').waitFor();
  check(!(await page.locator('#token-dialog').evaluate((d) => d.open)), 'an open server asked for a token');

  begin('the cluster panel lists the worker');
  await page.locator(`#workers tr[data-worker="${opt.worker}"]`).waitFor();
  const leader = await page.textContent('#cluster-leader');
  check(leader.startsWith('http://'), `the leader is shown: ${leader}`);
  await page.locator('#nodes tbody tr').first().waitFor();
  const shards = Number(opt.shards);
  if (shards > 1) {
    begin(`the cluster panel lists the ${shards} shards with their leaders`);
    await page.locator(`#shards tr[data-shard="${shards - 1}"]`).waitFor();
    const rows = await page.locator('#shards tbody tr').count();
    check(rows === shards, `${rows} rows in the shards table, not ${shards}`);
    const first = await page.textContent('#shards tr[data-shard="0"]');
    check(/%/.test(first) && / ms/.test(first), `a shard's writer and commit times: ${first}`);
  } else {
    check(!(await page.locator('#shards').count()), 'a cluster of one shard has no shards table');
  }
  const storage = await page.textContent('#cluster-storage');
  check(/ in \d+ parts, open work /.test(storage), `the history's size is shown: ${storage}`);
  const retention = await page.textContent('#cluster-retention');
  check(retention.startsWith('keeps 7 d'), `the retention window is shown: ${retention}`);

  begin('submit 6 from the form; its result arrives in the live feed');
  const id = await submit('6');
  log(`  accepted ${id}`);
  await feedItem(id, 'completed').filter({hasText: '6 * 6 = 36'}).waitFor();

  if (opt.subscription) {
    begin('the webhooks panel shows the subscription failing, with its error');
    const row = page.locator(`#webhooks-table tr[data-subscription="${opt.subscription}"]`);
    await row.locator('td[data-error="yes"]').waitFor();
    const text = await row.textContent();
    check(/failing|paused/.test(text) && /seq \d+/.test(text), `the subscription's state and error: ${text}`);
  } else {
    await page.locator('#webhooks-none').waitFor();
  }


  begin('work that dies (a payload the demo refuses) and work scheduled for later');
  const dead = await submit('"boom"', {'max-attempts': 1});
  await feedItem(dead, 'dead').waitFor();
  const later = await submit('3', {delay: 3600});

  begin('the queues panel counts them and charts the throughput');
  await page.waitForFunction(() => {
    const row = document.querySelector('#queues-table tr[data-queue="default"]');
    const n = (st) => Number(row?.querySelector(`td[data-status="${st}"]`)?.textContent || 0);
    return n('completed') >= 1 && n('dead') >= 1 && n('scheduled') >= 1;
  });
  check(await page.locator('#throughput-chart rect.c-completed').count() >= 1, 'no completed bar in the chart');
  check(await page.locator('#throughput-chart polyline.accepted').count() === 1, 'no line of accepted work');

  begin("a queue's panel: backlog per key, pause and resume, limits and weights");
  await page.click('#queues-table tr[data-queue="default"] button[data-action="queue-open"]');
  await page.locator('#queue-keys-table tr[data-key="(no key)"]').waitFor();
  await page.click('#queue-pause');
  await page.locator('#queue-detail-state', {hasText: 'paused'}).waitFor();
  await page.locator('#queues-table tr[data-queue="default"] button[data-action="queue-open"]', {hasText: 'paused'}).waitFor();
  await page.click('#queue-pause');
  await page.locator('#queue-detail-state', {hasText: 'running'}).waitFor();
  await page.fill('#queue-limits-form input[name=max_running]', '7');
  await page.fill('#queue-limits-form textarea[name=key_weights]', 'gold=3');
  await page.click('#queue-limits-form button[type=submit]');
  await page.locator('#queue-message', {hasText: '≤ 7 running, 1 weighted key'}).waitFor();
  await page.fill('#queue-limits-form input[name=max_running]', '');
  await page.fill('#queue-limits-form textarea[name=key_weights]', '');
  await page.click('#queue-limits-form button[type=submit]');
  await page.locator('#queue-message', {hasText: 'Set: none.'}).waitFor();

  begin('in a 1400-pixel window the queues fit, and clicking a queue opens its panel');
  await page.click('#queue-detail button:has-text("close")');
  await page.locator('#queue-detail').waitFor({state: 'hidden'});
  await page.setViewportSize({width: 1400, height: 1000});
  const fit = await page.evaluate(() => {
    const scroll = document.querySelector('#queues .scroll').getBoundingClientRect();
    const cut = [...document.querySelectorAll('#queues-table [data-action="queue-open"]')]
      .filter((b) => { const r = b.getBoundingClientRect(); return r.left < scroll.left || r.right > scroll.right + 0.5; });
    const t = document.querySelector('#queues .scroll');
    return {cut: cut.length, overflow: t.scrollWidth - t.clientWidth};
  });
  check(fit.cut === 0, `${fit.cut} Flow control cell(s) cut off at 1400 px`);
  check(fit.overflow <= 0, `the queues table is ${fit.overflow} px wider than its panel at 1400 px`);
  await page.click('#queues-table tr[data-queue="default"] button[data-action="queue-name"]');
  await page.locator('#queue-detail-name', {hasText: 'default'}).waitFor();
  await page.locator('#queue-pause').waitFor();
  const work = await page.getAttribute('#queue-detail-work', 'href');
  check(work === '#/work?queue=default', `the queue's panel links to its work: ${work}`);
  await page.setViewportSize({width: 1440, height: 1000});
  await page.evaluate(() => document.activeElement?.blur());
  await page.screenshot({path: opt.screenshot, fullPage: true});
  log(`  screenshot ${opt.screenshot}`);

  if (opt.rendezvous) {
    begin('the node restarts: the feed resumes where it was (Last-Event-ID)');
    const {ids} = await rendezvous('restart-feed');
    extra.push(...ids);
    for (const [i, wid] of ids.entries()) {
      const n = Number(i) + 11;
      await feedItem(wid, 'completed').filter({hasText: `${n} * ${n} = ${n * n}`}).waitFor({timeout: 30000});
    }
    await page.locator('#feed-state[data-state="live"]').waitFor();
    const seqs = await page.locator('#feed li').evaluateAll((lis) => lis.map((li) => li.dataset.seq));
    check(new Set(seqs).size === seqs.length, `an event was shown twice: ${seqs}`);
    check(seqs.length === 2 + ids.length, `the feed has ${seqs.length} results, not ${2 + ids.length}`);
  }

  begin('open the work page from the feed: result and history');
  await feedItem(id, 'completed').locator('a').click();
  await page.locator('#work-status.completed').waitFor();
  check((await page.textContent('#work-id')) === id, 'the page shows another work item');
  await page.locator('#work-result', {hasText: '6 * 6 = 36'}).waitFor();
  check((await page.textContent('#work-payload')).trim() === '6', 'the payload is shown');
  const types = await page.locator('#history tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.type));
  check(JSON.stringify(types) === JSON.stringify(['accepted', 'started', 'completed']),
        `the history is accepted, started, completed: ${types}`);
  check(await page.locator('#work-attempt-table tbody tr').count() === 1, 'one attempt is listed');
  // Times carry their date and zone: "2026-11-23 08:35:57.482 +01:00".
  const stamps = await page.locator('#history tbody tr td:nth-child(2)').allTextContents();
  check(stamps.length === 3 && stamps.every((t) => /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [+-]\d\d:\d\d$/.test(t.trim())),
        `history times lack a date or zone: ${stamps}`);
  check(/^times: .+ \(UTC[+-]\d\d:\d\d\)$/.test((await page.textContent('#zone')).trim()),
        'the header does not say which zone times are in');
  await page.screenshot({path: sibling('-work'), fullPage: true});

  begin('retry the dead work from its page');
  await page.goto(`${opt.url}/#/work/${encodeURIComponent(dead)}`);
  await page.locator('#work-status.dead').waitFor();
  await page.locator('#work-error', {hasText: 'wants a number'}).waitFor();
  await page.click('#work-retry');
  await page.locator('#history tbody tr[data-type="retried"]').waitFor();
  await page.locator('#work-attempts', {hasText: '2 of 2'}).waitFor(); // it ran (and died) again

  begin('cancel the scheduled work from its page');
  await page.goto(`${opt.url}/#/work/${encodeURIComponent(later)}`);
  await page.locator('#work-status.scheduled').waitFor();
  await page.click('#work-cancel');
  await page.locator('#work-status.cancelled').waitFor();
  await page.locator('#history tbody tr[data-type="cancelled"]').waitFor();

  begin('the work list: by state, and page by page');
  const completed = [id, ...extra];
  await page.goto(`${opt.url}/#/work?status=completed`);
  await page.locator(`#work-table tr[data-id="${id}"]`).waitFor();
  const listed = await page.locator('#work-table tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.id));
  check(JSON.stringify([...listed].sort()) === JSON.stringify([...completed].sort()),
        `the completed work is listed, only it: ${listed}`);
  // Two a page: Older walks through every item once (newest first by
  // acceptance; a retry counts as a new acceptance), Newer and Newest come back.
  const all = [id, dead, later, ...extra];
  await page.goto(`${opt.url}/#/work?limit=2`);
  // The list of the filter before may still be shown: wait for this one's.
  await page.waitForFunction(() => document.querySelector('#list-limit').value === '2');
  await page.locator('#work-list:not(:has-text("Loading…"))').waitFor();
  const rows = page.locator('#work-table tbody tr');
  const pages = [];
  let pastTheEnd = false; // the walk ended on the empty page after a full last one
  for (;;) {
    if (pages.length) {
      const prev = pages[pages.length - 1][0];
      await page.click('#list-older');
      // The next page, loaded: not the previous one, and not "Loading…" in between.
      await page.locator(`#work-list:not(:has(tr[data-id="${prev}"])):not(:has-text("Loading…"))`).waitFor();
      pastTheEnd = (await page.locator('#work-list', {hasText: 'No older work.'}).count()) > 0;
      if (pastTheEnd) break;
    }
    await rows.first().waitFor();
    pages.push(await rows.evaluateAll((trs) => trs.map((r) => r.dataset.id)));
    check(pages[pages.length - 1].length <= 2, 'at most two items a page');
    if (await page.locator('#list-older').isDisabled()) break;
  }
  log(`  pages ${JSON.stringify(pages)}`);
  const seen = pages.flat();
  check(JSON.stringify([...seen].sort()) === JSON.stringify([...all].sort()),
        `the pages show each item once: ${JSON.stringify(pages)}`);
  // A full last page still has a next_before: the end shows one click later.
  check(await page.locator('#list-older').isDisabled(), 'past the end, "Older" is disabled');
  // Newer: the last page (from past the end), or the one before it.
  await page.click('#list-newer');
  const newer = pages[Math.max(0, pages.length - (pastTheEnd ? 1 : 2))][0];
  await page.locator(`#work-table tbody tr[data-id="${newer}"]`).waitFor();
  if (!(await page.locator('#list-newest').isDisabled())) await page.click('#list-newest');
  await page.locator(`#work-table tbody tr[data-id="${pages[0][0]}"]`).waitFor();
  await page.goto(`${opt.url}/#/work`);
  await page.locator(`#work-table tbody tr[data-id="${dead}"]`).waitFor();
  await page.screenshot({path: sibling('-list'), fullPage: true});

  begin('a schedule in the overview; a waiting child with its parent, both ways');
  await page.evaluate(async () => {
    const send = (method, path, body) => fetch(path, {method, body: JSON.stringify(body),
                                                      headers: {'Content-Type': 'application/json'}});
    await send('PUT', '/schedules/dash-nightly', {cron: '0 3 * * *', timezone: 'Europe/Berlin',
                                                   work: {payload: 4}});
    await send('POST', '/work', [{id: 'dash-parent', payload: 2, delay: 3600},
                                 {id: 'dash-child', payload: 3, after: ['dash-parent']}]);
  });
  await page.goto(`${opt.url}/#/`);
  await page.locator('#schedule-table tr[data-name="dash-nightly"]', {hasText: 'Europe/Berlin'}).waitFor();
  await page.goto(`${opt.url}/#/work/dash-child`);
  await page.locator('#work-status.waiting').waitFor();
  await page.locator('#work-after a', {hasText: 'dash-parent'}).waitFor();
  await page.goto(`${opt.url}/#/work/dash-parent`);
  await page.locator('#work-children a', {hasText: 'dash-child'}).waitFor();
}

async function withToken() {
  begin('load the dashboard: it asks for a token');
  await page.goto(`${opt.url}/`);
  await page.locator('#token-dialog').waitFor({state: 'visible'});
  await page.screenshot({path: sibling('-prompt')});

  begin('a wrong token is refused and asked again');
  await page.fill('#token-input', 'not-the-token-0123456789');
  await page.press('#token-input', 'Enter');
  await page.locator('#token-dialog').waitFor({state: 'visible'});
  await page.locator('#token-reason', {hasText: 'refused'}).waitFor();

  begin('the admin token loads the panels and the feed');
  await page.fill('#token-input', opt.token);
  await page.click('#token-form button[type=submit]');
  await page.locator('#token-dialog').waitFor({state: 'hidden'});
  await page.locator(`#workers tr[data-worker="${opt.worker}"]`).waitFor();
  await page.locator('#feed-state[data-state="live"]').waitFor();
  await page.locator('#queues:not(:has(.message))').waitFor();

  begin('submit 7: the result comes through the EventSource with ?access_token=');
  const id = await submit('7');
  await feedItem(id, 'completed').filter({hasText: '7 * 7 = 49'}).waitFor();
  await page.locator('#queues-table tr[data-queue="default"] td[data-status="completed"] a').waitFor();
  await page.evaluate(() => document.activeElement?.blur());
  await page.screenshot({path: opt.screenshot, fullPage: true});
  log(`  screenshot ${opt.screenshot}`);

  begin('a reload keeps the token (localStorage)');
  await page.reload();
  await page.locator(`#workers tr[data-worker="${opt.worker}"]`).waitFor();
  await page.locator('#feed-state[data-state="live"]').waitFor();
  check(!(await page.locator('#token-dialog').evaluate((d) => d.open)), 'asked again after a reload');
  await page.goto(`${opt.url}/#/work/${encodeURIComponent(id)}`);
  await page.locator('#work-result', {hasText: '7 * 7 = 49'}).waitFor();

  begin('"Forget token" asks again');
  await page.click('#signout');
  await page.locator('#token-dialog').waitFor({state: 'visible'});
}

let failed = false;
try {
  await main();
} catch (e) {
  failed = true;
  console.error(`FAILED at step "${step}": ${e.message}`);
  if (problems.length) console.error(`the page reported:\n  ${problems.join('\n  ')}`);
  if (page) {
    await page.screenshot({path: sibling('-failure'), fullPage: true}).catch(() => {});
    console.error(`screenshot of the failure: ${sibling('-failure')}`);
    const text = await page.locator('main').innerText().catch(() => '');
    console.error(`visible text:\n${text.slice(0, 3000)}`);
  }
} finally {
  if (context) await context.close().catch(() => {});
  await rm(userDataDir, {recursive: true, force: true});
}
process.exit(failed ? 1 : 0);
