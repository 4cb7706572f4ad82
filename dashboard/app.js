// The workd dashboard: live views of the cluster, the queues, finished work and
// single work items, plus submit/cancel/retry. Plain modern JavaScript (no
// framework, no bundler): workd-server embeds this file as it is and serves it
// at /dashboard/app.js. It talks to the public API of the node that served it:
//   GET /cluster (admin), GET /subscriptions (admin), GET /queues, GET /activity,
//   GET /queues/{q}/keys, GET /schedules, GET /work, GET /work/{id}[/events],
//   GET /batches/{id}, GET /results (EventSource), POST /work, DELETE /work/{id},
//   POST /work/{id}/retry, and (admin) PUT /queues/{q}, POST /queues/{q}/pause|resume.
// Everything user-supplied (payloads, results, errors, ids) is put into the page
// as text nodes, never as HTML.

const TOKEN_KEY = 'workd.token';
const FINAL = new Set(['completed', 'dead', 'cancelled']);
const STATUSES = ['waiting', 'pending', 'scheduled', 'running', 'completed', 'dead', 'cancelled'];
const FEED_MAX = 200;
const POLL_MS = 2000;
const LIST_POLL_MS = 5000;

// ------------------------------------------------------------------ helpers

const $ = (id) => document.getElementById(id);

/** h('a', {href: '#/'}, 'text', child...) builds an element; children are
 *  nodes or text (arrays are flattened, null/false skipped). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  for (const c of children.flat(Infinity)) {
    if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** Replaces el's children (flattening arrays, skipping null/false, like h()). */
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

const SVG_NS = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  for (const c of children.flat(Infinity)) {
    if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k === 'className' ? 'class' : k, v === true ? '' : String(v));
  }
}

const enc = encodeURIComponent;
const workHref = (id) => `#/work/${enc(id)}`;
const workLink = (id, text) => h('a', {href: workHref(id), class: 'mono', 'data-id': id}, text ?? id);
const badge = (status) => h('span', {class: `badge ${status}`}, status);

/** A value as text: strings as they are, everything else as JSON. */
function asText(v, pretty = false) {
  if (typeof v === 'string') return v;
  if (v === undefined) return '';
  return JSON.stringify(v, null, pretty ? 2 : undefined);
}

function toMs(t) {
  if (t === null || t === undefined || t === '') return null;
  if (typeof t === 'number') return t;
  const ms = Date.parse(t);
  return Number.isNaN(ms) ? null : ms;
}

function pad(n, w = 2) { return String(n).padStart(w, '0'); }

function fmtClock(t) {
  const ms = toMs(t);
  if (ms === null) return '—';
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** The browser's offset from UTC at that time, as "+01:00" (summer time included). */
function fmtZone(d) {
  const off = -d.getTimezoneOffset();
  return `${off < 0 ? '-' : '+'}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
}

/** A full time stamp in the browser's zone, never ambiguous:
 *  "2026-11-23 08:35:57.482 +01:00" (the zone's name is in the page header). */
function fmtDateTime(t) {
  const ms = toMs(t);
  if (ms === null) return '—';
  const d = new Date(ms);
  const clock = `${fmtClock(ms)}.${pad(d.getMilliseconds(), 3)}`;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock} ${fmtZone(d)}`;
}

function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  const a = Math.abs(ms);
  if (a < 1000) return `${Math.round(ms)} ms`;
  if (a < 60000) return `${(ms / 1000).toFixed(a < 10000 ? 1 : 0)} s`;
  const two = (big, bigUnit, small, smallUnit) => (small ? `${big} ${bigUnit} ${small} ${smallUnit}` : `${big} ${bigUnit}`);
  if (a < 3600000) return two(Math.floor(a / 60000), 'min', Math.floor((a % 60000) / 1000), 's');
  if (a < 86400000) return two(Math.floor(a / 3600000), 'h', Math.floor((a % 3600000) / 60000), 'min');
  return two(Math.floor(a / 86400000), 'd', Math.floor((a % 86400000) / 3600000), 'h');
}

const fmtAgo = (ms) => (ms === null || ms === undefined ? '—' : `${fmtDuration(Math.max(0, ms))} ago`);
const ago = (t) => { const ms = toMs(t); return ms === null ? '—' : fmtAgo(Date.now() - ms); };
/** A <time> showing "3 s ago" with the exact time as its tooltip. */
const agoEl = (t, msAgo) => h('time', {title: fmtDateTime(t)}, msAgo !== undefined ? fmtAgo(msAgo) : ago(t));

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, kind, detail) {
    super(detail);
    this.status = status;
    this.kind = kind;
  }
}

let token = localStorage.getItem(TOKEN_KEY) || '';

/** Calls the API; returns the parsed JSON body or throws ApiError (status 0:
 *  the server could not be reached). A 401 asks for a token (once, unless
 *  the call is `interactive`, i.e. the user clicked something). */
async function api(method, path, body, {interactive = false} = {}) {
  const headers = {Accept: 'application/json'};
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = {method, headers, cache: 'no-store'};
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'network', `cannot reach the server (${e.message})`);
  }
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (resp.ok) return data;
  const kind = data && typeof data.type === 'string' ? data.type.replace(/.*\//, '') : 'http';
  const detail = data && data.detail ? data.detail : `${resp.status} ${resp.statusText}`;
  if (resp.status === 401) {
    auth.needed(token ? 'The server refused this token.' : 'This server wants a bearer token.',
                interactive);
  }
  throw new ApiError(resp.status, kind, detail);
}

/** A message for an ApiError shown in place of a panel's content. */
function errorBox(e, scope = 'client') {
  if (e.status === 401) {
    return h('p', {class: 'message'}, 'Sign in with a token to see this. ',
             h('button', {type: 'button', class: 'link', onclick: () => auth.prompt()}, 'Sign in'));
  }
  if (e.status === 403) {
    return h('p', {class: 'message error'},
             `This token lacks the ${scope} scope this view needs (${e.message}).`);
  }
  return h('p', {class: 'message error'}, e.status ? `${e.status}: ${e.message}` : e.message);
}

// ------------------------------------------------------------ authentication

const auth = {
  dismissed: false, // the user said "not now": background refreshes stop asking
  required: false,  // a 401 was seen: the header offers "Sign in"

  needed(reason, interactive) {
    this.required = true;
    this.header();
    $('token-reason').textContent = reason;
    if (!this.dismissed || interactive) this.prompt();
  },

  prompt() {
    const d = $('token-dialog');
    if (!d.open) {
      $('token-input').value = '';
      d.returnValue = '';
      d.showModal();
    }
    $('token-input').focus();
  },

  set(tok) {
    token = tok;
    if (tok) localStorage.setItem(TOKEN_KEY, tok);
    else localStorage.removeItem(TOKEN_KEY);
    this.dismissed = false;
    this.header();
    feed.restart();
    views.refresh();
  },

  header() {
    $('signout').hidden = !token;
    $('signin').hidden = !!token || !this.required;
  },

  init() {
    $('token-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const tok = $('token-input').value.trim();
      if (!tok) return;
      $('token-dialog').close('ok');
      this.set(tok);
    });
    $('token-cancel').addEventListener('click', () => $('token-dialog').close());
    $('token-dialog').addEventListener('close', () => {
      if (!$('token-dialog').returnValue) this.dismissed = true;
    });
    $('signin').addEventListener('click', () => this.prompt());
    $('signout').addEventListener('click', () => this.set(''));
    this.header();
  },
};

// ------------------------------------------------------------------- polling

/** Calls fn every ms (slower while the tab is hidden) from start(), which
 *  also calls it at once, until stop(); now() calls it at once if started.
 *  Never two calls at a time: a call asked for meanwhile runs right after. */
function poller(fn, ms) {
  let on = false, busy = false, again = false, timer = null;
  async function tick() {
    clearTimeout(timer);
    if (!on) return;
    if (busy) { again = true; return; }
    busy = true;
    try { await fn(); } catch (e) { console.debug('refresh failed', e); }
    busy = false;
    if (!on) return;
    if (again) { again = false; tick(); return; }
    timer = setTimeout(tick, document.hidden ? ms * 5 : ms);
  }
  return {
    start() { on = true; tick(); },
    stop() { on = false; clearTimeout(timer); },
    now() { if (on) tick(); },
  };
}

// ------------------------------------------------------------------ cluster

async function loadCluster() {
  const box = $('cluster');
  let c;
  try {
    c = await api('GET', '/cluster');
  } catch (e) {
    fill(box, errorBox(e, 'admin'));
    $('cluster-summary').textContent = '';
    return;
  }
  $('cluster-summary').textContent = `term ${c.term} · ${c.open_total} open`;
  const nodes = c.nodes || [];
  const workers = (c.workers || []).slice().sort((a, b) => a.id.localeCompare(b.id));
  const busy = workers.reduce((n, w) => n + (w.running ? w.running.length : 0), 0);
  const slots = workers.reduce((n, w) => n + w.capacity, 0);

  const nodeRows = nodes.map((n) => h('tr', {'data-node': n.id},
    h('td', {}, h('strong', {}, n.id), ' ', n.url === c.leader ? badge('leader') : null),
    h('td', {class: 'mono'}, n.url),
    h('td', {}, n.roles),
    h('td', {}, agoEl(n.last_seen))));
  const workerRows = workers.map((w) => {
    const running = w.running || [];
    return h('tr', {'data-worker': w.id},
      h('td', {}, h('strong', {}, w.id)),
      h('td', {class: 'num'}, `${running.length} / ${w.capacity}`),
      h('td', {}, running.length
        ? running.slice(0, 4).map((r, i) => [i ? ', ' : '', workLink(r.id, `${r.id} #${r.attempt}`)])
        : h('span', {class: 'muted'}, 'idle'),
        running.length > 4 ? ` +${running.length - 4}` : null),
      h('td', {}, w.queues && w.queues.length ? w.queues.join(', ') : h('span', {class: 'muted'}, 'all')),
      h('td', {}, agoEl(w.last_heartbeat, w.silent_ms)));
  });
  fill(box,
    h('dl', {class: 'kv'},
      h('dt', {}, 'Leader'), h('dd', {class: 'mono', id: 'cluster-leader'}, c.leader || 'none'),
      h('dt', {}, 'Term'), h('dd', {id: 'cluster-term'}, c.term),
      h('dt', {}, 'Workers'), h('dd', {}, `${workers.length} (${busy} of ${slots} slots busy)`),
      h('dt', {}, 'Open work'), h('dd', {}, c.open_total),
      ...storageRows(c.storage)),
    ...shardsTable(c.shards || [], nodes),
    h('h3', {}, `Front-end nodes (${nodes.length})`),
    h('div', {class: 'scroll'}, h('table', {id: 'nodes'},
      h('thead', {}, h('tr', {}, h('th', {}, 'Node'), h('th', {}, 'URL'), h('th', {}, 'Roles'),
                                 h('th', {}, 'Last seen'))),
      h('tbody', {}, nodeRows))),
    h('h3', {}, `Workers (${workers.length})`),
    workers.length
      ? h('div', {class: 'scroll'}, h('table', {id: 'workers'},
          h('thead', {}, h('tr', {}, h('th', {}, 'Worker'), h('th', {class: 'num'}, 'Busy'),
                                     h('th', {}, 'Running attempts'), h('th', {}, 'Queues'),
                                     h('th', {}, 'Last heartbeat'))),
          h('tbody', {}, workerRows)))
      : h('p', {class: 'muted', id: 'workers'},
          'No worker is registered. Start one: workd-worker --server URL --demo'));
}

/** The shards of the manager (a cluster of several): each one's leader,
 * term, open work, and its writer over the last 10 s. */
function shardsTable(shards, nodes) {
  if (shards.length < 2) return [];
  const nodeOf = (url) => (nodes.find((n) => n.url === url) || {}).id || url;
  const rows = shards.map((x) => h('tr', {'data-shard': x.shard},
    h('td', {class: 'num'}, x.shard),
    h('td', {class: 'mono'}, nodeOf(x.leader)),
    h('td', {class: 'num'}, x.term),
    h('td', {class: 'num'}, x.open_total),
    h('td', {class: 'num', title: 'share of the last 10 s with a commit out'},
      `${Math.round(x.writer_busy * 100)} %`),
    h('td', {class: 'num'}, `${x.commit_mean_ms.toFixed(1)} / ${x.commit_p99_ms.toFixed(1)} ms`)));
  return [
    h('h3', {}, `Shards (${shards.length})`),
    h('div', {class: 'scroll'}, h('table', {id: 'shards'},
      h('thead', {}, h('tr', {}, h('th', {class: 'num'}, 'Shard'), h('th', {}, 'Leader'),
                                 h('th', {class: 'num'}, 'Term'), h('th', {class: 'num'}, 'Open'),
                                 h('th', {class: 'num'}, 'Writer busy'),
                                 h('th', {class: 'num'}, 'Commit mean / p99'))),
      h('tbody', {}, rows))),
  ];
}

// ----------------------------------------------------------------- webhooks

/** GET /subscriptions: each one's target, cursor, lag, failures and last error. */
async function loadWebhooks() {
  const box = $('webhooks');
  let r;
  try {
    r = await api('GET', '/subscriptions');
  } catch (e) {
    fill(box, errorBox(e, 'admin'));
    $('webhooks-summary').textContent = '';
    return;
  }
  const subs = r.subscriptions || [];
  const failing = subs.filter((x) => x.failures > 0 || x.paused).length;
  $('webhooks-summary').textContent = subs.length
    ? `${subs.length} subscription${subs.length === 1 ? '' : 's'}${failing ? ` · ${failing} failing or paused` : ''}`
    : '';
  if (!subs.length) {
    fill(box, h('p', {class: 'muted', id: 'webhooks-none'},
      'No webhook subscription. PUT /subscriptions/NAME with a url and a secret (docs/webhooks.md).'));
    return;
  }
  const state = (x) => (x.paused ? badge('paused') : x.failures ? badge('failing') : badge('delivering'));
  const rows = subs.map((x) => h('tr', {'data-subscription': x.name},
    h('td', {}, h('strong', {}, x.name), ' ', state(x)),
    h('td', {class: 'mono'}, x.url),
    h('td', {}, `${x.queues ? x.queues.join(', ') : 'all queues'}: ${x.kinds.join(', ')}`),
    h('td', {class: 'num', title: `recorded cursor ${x.cursor}`}, `${x.delivered_upto}`),
    h('td', {class: 'num', 'data-lag': x.lag}, `${x.lag}`),
    h('td', {class: 'num'}, `${x.delivered}`),
    h('td', {class: 'error-text', 'data-error': x.last_error ? 'yes' : 'no'},
      x.paused_reason || x.last_error
        ? `${x.paused_reason || x.last_error}${x.failures ? ` (${x.failures} in a row)` : ''}`
        : h('span', {class: 'muted'}, 'none'))));
  fill(box, h('div', {class: 'scroll'}, h('table', {id: 'webhooks-table'},
    h('thead', {}, h('tr', {}, h('th', {}, 'Subscription'), h('th', {}, 'URL'), h('th', {}, 'Wants'),
                               h('th', {class: 'num'}, 'Delivered up to'), h('th', {class: 'num'}, 'Lag'),
                               h('th', {class: 'num'}, 'Delivered'), h('th', {}, 'Last error'))),
    h('tbody', {}, rows))));
}

/** Bytes as B, kB, MB, GB (powers of 1024). */
function fmtBytes(n) {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

/** The history kept and its retention, from /cluster's storage. */
function storageRows(st) {
  if (!st) return [];
  const days = st.retain_s >= 86400 ? `${+(st.retain_s / 86400).toFixed(1)} d` : `${st.retain_s} s`;
  return [
    h('dt', {}, 'History'),
    h('dd', {id: 'cluster-storage'},
      `${fmtBytes(st.events_bytes + st.done_bytes)} in ${st.parts} parts, open work ${fmtBytes(st.open_bytes)}`),
    h('dt', {}, 'Retention'),
    h('dd', {id: 'cluster-retention'}, `keeps ${days}; oldest part `,
      st.oldest_part_at ? agoEl(st.oldest_part_at) : 'none', '; last run ',
      st.retention_last_run_at ? agoEl(st.retention_last_run_at) : 'not yet',
      `; ${st.parts_dropped} dropped`),
  ];
}

// ------------------------------------------------------------------- queues

/** A stacked bar chart of finished work per bucket (oldest first), with the
 *  work accepted as a line; series holds arrays of n counts (GET /activity),
 *  the first bucket starting at startMs. */
function throughputChart(series, bucketSec, startMs) {
  const n = series.completed.length;
  const W = 640, H = 120, L = 30, B = 16, T = 6;
  const totals = series.completed.map((c, i) => c + series.dead[i] + series.cancelled[i]);
  const peak = Math.max(...totals, ...series.accepted, 0);
  const top = peak <= 4 ? 4 : Math.ceil(peak / 4) * 4;
  const bw = (W - L) / n, y = (v) => ((H - B - T) * v) / top;
  const bars = [];
  for (let i = 0; i < n; i++) {
    const x = L + i * bw + 0.5;
    let base = H - B;
    const parts = [];
    for (const kind of ['completed', 'dead', 'cancelled']) {
      const v = series[kind][i];
      if (!v) continue;
      const hgt = Math.max(1, y(v));
      base -= hgt;
      parts.push(svg('rect', {x: x.toFixed(1), y: base.toFixed(1), width: Math.max(1, bw - 1.5).toFixed(1),
                              height: hgt.toFixed(1), class: `c-${kind}`}));
    }
    const start = startMs + i * bucketSec * 1000;
    const tip = `${fmtClock(start)}–${fmtClock(start + bucketSec * 1000)}: ${series.accepted[i]} accepted, ` +
                `${series.completed[i]} completed, ${series.failed[i]} attempts failed, ` +
                `${series.dead[i]} dead, ${series.cancelled[i]} cancelled`;
    // A full-height transparent target so that the tooltip works on empty buckets too.
    bars.push(svg('g', {}, svg('title', {}, tip),
                  svg('rect', {x: x.toFixed(1), y: T, width: bw.toFixed(1), height: H - B - T, fill: 'transparent'}),
                  parts));
  }
  const minutes = Math.round((n * bucketSec) / 60);
  const line = series.accepted.some((v) => v) ? svg('polyline', {class: 'accepted', fill: 'none',
    points: series.accepted.map((v, i) => `${(L + (i + 0.5) * bw).toFixed(1)},${(H - B - y(v)).toFixed(1)}`).join(' ')})
    : null;
  const grid = [top, top / 2].map((v) => [
    svg('line', {x1: L, x2: W, y1: (H - B - y(v)).toFixed(1), y2: (H - B - y(v)).toFixed(1), class: 'axis',
                 'stroke-dasharray': '3 3'}),
    svg('text', {x: L - 4, y: (H - B - y(v) + 3).toFixed(1), 'text-anchor': 'end'}, String(v))]);
  return svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', id: 'throughput-chart',
                     'aria-label': `Finished work per ${bucketSec} seconds, last ${minutes} minutes`},
    grid,
    svg('line', {x1: L, x2: W, y1: H - B, y2: H - B, class: 'axis'}),
    svg('text', {x: L - 4, y: H - B + 3, 'text-anchor': 'end'}, '0'),
    bars,
    line,
    svg('text', {x: L, y: H - 3}, `−${minutes} min`),
    svg('text', {x: L + (W - L) / 2, y: H - 3, 'text-anchor': 'middle'}, `−${Math.round(minutes / 2)} min`),
    svg('text', {x: W, y: H - 3, 'text-anchor': 'end'}, 'now'));
}

/** A small bar chart of one queue's finished work per bucket. */
function sparkline(t) {
  const W = 96, H = 22, n = t.completed.length, bw = W / n;
  const totals = t.completed.map((c, i) => c + t.dead[i] + t.cancelled[i]);
  const peak = Math.max(1, ...totals);
  const bars = [];
  totals.forEach((total, i) => {
    let base = H - 1;
    for (const kind of ['completed', 'dead', 'cancelled']) {
      const v = t[kind][i];
      if (!v) continue;
      const hgt = Math.max(1.5, ((H - 3) * v) / peak);
      base -= hgt;
      bars.push(svg('rect', {x: (i * bw).toFixed(1), y: base.toFixed(1), width: Math.max(1, bw - 0.4).toFixed(1),
                             height: hgt.toFixed(1), class: `c-${kind}`}));
    }
  });
  const sum = (k) => t[k].reduce((a, b) => a + b, 0);
  return svg('svg', {viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', class: 'spark'},
    svg('title', {}, `${sum('completed')} completed, ${sum('dead')} dead, ${sum('cancelled')} cancelled; peak ${peak} per bucket`),
    svg('line', {x1: 0, x2: W, y1: H - 0.5, y2: H - 0.5, class: 'axis'}),
    bars);
}

const KINDS = ['accepted', 'completed', 'failed', 'dead', 'cancelled'];

function sumSeries(list, n) {
  const out = Object.fromEntries(KINDS.map((k) => [k, Array(n).fill(0)]));
  for (const t of list) {
    for (const k of Object.keys(out)) (t[k] || []).forEach((v, i) => { out[k][i] += v; });
  }
  return out;
}

async function loadQueues() {
  const box = $('queues');
  let q, act;
  try {
    [q, act] = await Promise.all([api('GET', '/queues'), api('GET', '/activity?minutes=10')]);
  } catch (e) {
    fill(box, errorBox(e));
    fill($('throughput'));
    $('queues-summary').textContent = '';
    return;
  }
  // The chart and the sparklines come from the log (GET /activity): the same
  // on every node, and after a restart.
  const activity = act.queues || {};
  const queues = (q.queues || []).slice().sort((a, b) => a.queue.localeCompare(b.queue));
  const bucket = act.bucket_seconds;
  const n = act.buckets;
  const total = sumSeries(Object.values(activity), n);
  // The newest bucket is still filling: "the last minute" is it and the ones before.
  const perMin = total.completed.slice(-Math.max(1, Math.round(60 / bucket))).reduce((a, b) => a + b, 0);
  $('queues-summary').textContent = `${perMin} completed in the last minute`;
  fill($('throughput'),
    throughputChart(total, bucket, Date.parse(act.start)),
    h('div', {class: 'legend'},
      h('span', {}, h('i', {class: 'c-completed'}), 'completed'),
      h('span', {}, h('i', {class: 'c-dead'}), 'dead'),
      h('span', {}, h('i', {class: 'c-cancelled'}), 'cancelled'),
      h('span', {}, h('i', {class: 'c-accepted'}), 'accepted'),
      h('span', {class: 'grow'}),
      h('span', {title: 'Counted by the leader as it writes the log: every node shows the same'},
        `per ${bucket} s, from the log`)));
  if (!queues.length) {
    fill(box, h('p', {class: 'muted'}, 'No work yet: submit some with the form.'));
    return;
  }
  const count = (x, st) => h('td', {class: 'num', 'data-status': st},
    x[st] ? h('a', {href: `#/work?status=${st}&queue=${enc(x.queue)}`}, x[st]) : h('span', {class: 'muted'}, '0'));
  // A queue's name and its flow control both open its panel (backlog per key,
  // pause, limits); the counts open its work list. Flow control comes right
  // after the name, so that a narrow window scrolls the counts, not it.
  const opener = (x, action, title, ...label) => h('button', {type: 'button', class: 'link small',
    'data-action': action, title, onclick: () => queuePanel.open(x.queue)}, ...label);
  fill(box, h('div', {class: 'scroll'}, h('table', {id: 'queues-table'},
    h('thead', {}, h('tr', {}, h('th', {}, 'Queue'), h('th', {}, 'Flow control'),
                               STATUSES.map((s) => h('th', {class: 'num', title: FINAL.has(s)
      ? `Counted at most ${q.finished_counts_age_s ?? 5} s ago` : 'Now'}, s)),
                               h('th', {title: 'Age of the oldest pending work'}, 'Oldest'), h('th', {}, `Last ${Math.round((n * bucket) / 60)} min`))),
    h('tbody', {}, queues.map((x) => h('tr', {'data-queue': x.queue, class: x.queue === queuePanel.name ? 'selected' : null},
      h('td', {}, opener(x, 'queue-name', 'Open the queue: backlog per key, pause and limits', h('strong', {}, x.queue))),
      h('td', {class: 'flow'}, opener(x, 'queue-open', 'Backlog per key, pause and limits', limitsText(x.limits))),
      STATUSES.map((st) => count(x, st)),
      h('td', {}, x.oldest_pending_at ? agoEl(x.oldest_pending_at) : h('span', {class: 'muted'}, '—')),
      h('td', {}, activity[x.queue] ? sparkline(activity[x.queue]) : h('span', {class: 'muted'}, '—'))))))));
  queuePanel.update(queues.find((x) => x.queue === queuePanel.name));
}

// ---------------------------------------------------------------- schedules

/** The schedules with their next and last runs (GET /schedules). */
async function loadSchedules() {
  const box = $('schedules');
  let r;
  try {
    r = await api('GET', '/schedules');
  } catch (e) {
    fill(box, errorBox(e));
    $('schedules-summary').textContent = '';
    return;
  }
  const list = r.schedules || [];
  $('schedules-summary').textContent = list.length ? `${list.length}` : '';
  if (!list.length) {
    fill(box, h('p', {class: 'muted'}, 'No schedules. PUT /schedules/{name} makes one.'));
    return;
  }
  fill(box, h('div', {class: 'scroll'}, h('table', {id: 'schedule-table'},
    h('thead', {}, h('tr', {}, ['Name', 'Cron', 'Zone', 'Queue', 'Next', 'Last run', ''].map((t) => h('th', {}, t)))),
    h('tbody', {}, list.map((x) => h('tr', {'data-name': x.name},
      h('td', {}, h('strong', {}, x.name)),
      h('td', {class: 'mono'}, x.cron),
      h('td', {}, x.timezone),
      h('td', {}, x.work ? x.work.queue : '—'),
      h('td', {}, x.paused ? badge('paused')
        : x.next && x.next.length ? h('time', {title: x.next.map(fmtDateTime).join('\n')}, fmtDateTime(x.next[0]))
          : '—'),
      h('td', {}, x.last_run ? [workLink(x.last_run.id, fmtClock(x.last_run.fired_at)), ' ', badge(x.last_run.status)]
        : h('span', {class: 'muted'}, 'never')),
      h('td', {class: 'error'}, x.error || '')))))));
}

/** A queue's flow control in a few words. */
function limitsText(l) {
  if (!l) return 'none';
  const parts = [];
  if (l.paused) parts.push('paused');
  if (l.max_running) parts.push(`≤ ${l.max_running} running`);
  if (l.max_running_per_key) parts.push(`≤ ${l.max_running_per_key} per key`);
  if (l.rate) parts.push(`${l.rate.limit} per ${l.rate.per} s`);
  const w = Object.keys(l.key_weights || {}).length;
  if (w) parts.push(`${w} weighted key${w > 1 ? 's' : ''}`);
  return parts.length ? parts.join(', ') : 'none';
}

/** One queue's backlog per key and (admin) its controls: pause or resume, the
 *  limits and the key weights (PUT /queues/{queue}). The form is built when
 *  the queue is opened and not redrawn by the refreshes, so typing is kept. */
const queuePanel = {
  name: null,
  limits: null,

  open(name) {
    this.name = name;
    this.limits = null;
    const box = $('queue-detail');
    box.hidden = false;
    fill(box,
      h('h3', {}, 'Queue ', h('strong', {id: 'queue-detail-name'}, name), ' ',
        h('span', {id: 'queue-detail-state', class: 'badge'}), h('span', {class: 'grow'}),
        h('a', {id: 'queue-detail-work', class: 'small', href: `#/work?queue=${enc(name)}`}, 'its work'),
        h('button', {type: 'button', id: 'queue-pause', class: 'small'}, 'Pause'),
        h('button', {type: 'button', class: 'link small', onclick: () => this.close()}, 'close')),
      h('p', {id: 'queue-message', class: 'message', hidden: true}),
      h('form', {id: 'queue-limits-form', class: 'form', autocomplete: 'off'},
        h('label', {}, 'Max running', h('input', {name: 'max_running', type: 'number', min: 1, step: 1, placeholder: 'no limit'})),
        h('label', {}, 'Max running per key', h('input', {name: 'max_running_per_key', type: 'number', min: 1, step: 1, placeholder: 'no limit'})),
        h('label', {}, 'Rate: starts', h('input', {name: 'rate_limit', type: 'number', min: 1, step: 1, placeholder: 'no limit'})),
        h('label', {}, 'per (s)', h('input', {name: 'rate_per', type: 'number', min: 0.001, step: 'any', placeholder: '1'})),
        h('label', {class: 'wide'}, h('span', {}, 'Key weights ', h('span', {class: 'hint'}, '(key=weight, one a line: a key of weight 3 gets 3 turns for the others\' one)')),
          h('textarea', {name: 'key_weights', rows: 2, spellcheck: 'false', placeholder: 'customer-42=3'})),
        h('div', {class: 'actions wide'}, h('button', {type: 'submit', class: 'primary'}, 'Set limits'),
          h('span', {class: 'muted small'}, 'Needs the admin scope. Empty fields clear their limit.'))),
      h('h4', {}, 'Backlog per key'),
      h('div', {id: 'queue-keys'}, h('p', {class: 'muted'}, 'Loading…')));
    $('queue-pause').addEventListener('click', () => this.pause());
    $('queue-limits-form').addEventListener('submit', (e) => { e.preventDefault(); this.save(); });
    overview.queues.now();
  },

  close() {
    this.name = null;
    $('queue-detail').hidden = true;
    fill($('queue-detail'));
    overview.queues.now();
  },

  message(text, error) {
    const m = $('queue-message');
    if (!m) return;
    m.hidden = !text;
    m.textContent = text || '';
    m.className = error ? 'message error' : 'message';
  },

  /** Fills the form from the queue's limits the first time they are known. */
  update(q) {
    if (!this.name || !$('queue-limits-form')) return;
    const l = (q && q.limits) || {paused: false, max_running: null, max_running_per_key: null, rate: null, key_weights: {}};
    $('queue-detail-state').textContent = l.paused ? 'paused' : 'running';
    $('queue-detail-state').className = `badge ${l.paused ? 'dead' : 'completed'}`;
    $('queue-pause').textContent = l.paused ? 'Resume' : 'Pause';
    if (!this.limits) {
      const f = $('queue-limits-form').elements;
      f.max_running.value = l.max_running ?? '';
      f.max_running_per_key.value = l.max_running_per_key ?? '';
      f.rate_limit.value = l.rate ? l.rate.limit : '';
      f.rate_per.value = l.rate ? l.rate.per : '';
      f.key_weights.value = Object.entries(l.key_weights || {}).map(([k, w]) => `${k}=${w}`).join('\n');
    }
    this.limits = l;
    this.loadKeys();
  },

  async loadKeys() {
    const name = this.name;
    let r;
    try {
      r = await api('GET', `/queues/${enc(name)}/keys?limit=10`);
    } catch (e) {
      if (name === this.name) fill($('queue-keys'), errorBox(e));
      return;
    }
    if (name !== this.name) return;
    const row = (k, label) => h('tr', {'data-key': label},
      h('td', {}, k.key === null ? h('span', {class: 'muted'}, label) : h('span', {class: 'mono'}, label)),
      h('td', {class: 'num', 'data-status': 'pending'}, k.pending), h('td', {class: 'num'}, k.scheduled),
      h('td', {class: 'num', 'data-status': 'running'}, k.running));
    if (!r.keys.length) {
      fill($('queue-keys'), h('p', {class: 'muted'}, 'No open work in this queue.'));
      return;
    }
    fill($('queue-keys'), h('table', {id: 'queue-keys-table'},
      h('thead', {}, h('tr', {}, h('th', {}, 'Key'), h('th', {class: 'num'}, 'pending'),
                       h('th', {class: 'num'}, 'scheduled'), h('th', {class: 'num'}, 'running'))),
      h('tbody', {}, r.keys.map((k) => row(k, k.key === null ? '(no key)' : k.key)),
        r.other.keys ? row({...r.other, key: null}, `${r.other.keys} other keys`) : null)));
  },

  async pause() {
    const paused = this.limits && this.limits.paused;
    try {
      await api('POST', `/queues/${enc(this.name)}/${paused ? 'resume' : 'pause'}`, undefined, {interactive: true});
      this.message(paused ? 'Resumed.' : 'Paused: it hands out no work; running work finishes.');
    } catch (e) {
      this.message(e.status === 403 ? `This needs the admin scope: ${e.message}` : e.message, true);
    }
    overview.queues.now();
  },

  async save() {
    const f = $('queue-limits-form').elements;
    const num = (v) => (v.trim() === '' ? null : Number(v));
    const weights = {};
    for (const line of f.key_weights.value.split(/[\n,]/).map((x) => x.trim()).filter(Boolean)) {
      const at = line.lastIndexOf('=');
      if (at < 1) {
        this.message(`"${line}": write key=weight`, true);
        return;
      }
      weights[line.slice(0, at).trim()] = Number(line.slice(at + 1));
    }
    const rate = num(f.rate_limit.value);
    const body = {max_running: num(f.max_running.value), max_running_per_key: num(f.max_running_per_key.value),
                  rate: rate === null ? null : {limit: rate, per: num(f.rate_per.value) ?? 1},
                  key_weights: Object.keys(weights).length ? weights : null};
    try {
      const l = await api('PUT', `/queues/${enc(this.name)}`, body, {interactive: true});
      this.limits = null; // refill the form from what the server now holds
      this.message(`Set: ${limitsText(l)}.`);
    } catch (e) {
      this.message(e.status === 403 ? `This needs the admin scope: ${e.message}` : e.message, true);
    }
    overview.queues.now();
  },
};

// --------------------------------------------------------------------- feed

/** Whether the event id `id` is nothing new after `last`: an id is each
 *  shard's seq joined by '.' (a plain seq in a cluster of one shard), and an
 *  event is new when one of its seqs is past the last id's. */
function idCovered(id, last) {
  const a = id.split('.').map(BigInt), b = last.split('.').map(BigInt);
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    if ((a[i] ?? 0n) > (b[i] ?? 0n)) return false;
  }
  return true;
}

/** The live results: an EventSource on /results. The browser reconnects by
 *  itself after a dropped connection and sends Last-Event-ID; when the server
 *  refuses the stream (401, 503) the browser gives up and we reconnect with
 *  ?after= the last event seen, after checking the token. */
const feed = {
  es: null,
  lastId: null, // id of the last event shown (a seq, or a seq per shard joined by '.')
  timer: null,
  backoff: 1000,
  count: 0,

  state(st, text) {
    const el = $('feed-state');
    el.dataset.state = st;
    el.textContent = `feed: ${text || st}`;
  },

  start() {
    this.stop();
    const q = new URLSearchParams();
    if (this.lastId !== null) q.set('after', this.lastId);
    if (token) q.set('access_token', token);
    const qs = q.toString();
    const es = new EventSource(`/results${qs ? `?${qs}` : ''}`);
    this.es = es;
    this.state('connecting');
    es.onopen = () => {
      if (es !== this.es) return;
      this.backoff = 1000;
      this.state('live');
    };
    const onEvent = (ev) => this.event(ev);
    for (const type of ['completed', 'dead', 'cancelled', 'message']) es.addEventListener(type, onEvent);
    es.onerror = () => {
      if (es !== this.es) return;
      if (es.readyState === EventSource.CONNECTING) {
        this.state('reconnecting');
        return;
      }
      es.close();
      this.es = null;
      this.retry();
    };
  },

  stop() {
    clearTimeout(this.timer);
    if (this.es) this.es.close();
    this.es = null;
  },

  restart() {
    this.stop();
    this.backoff = 1000;
    this.probe();
  },

  retry() {
    const s = Math.round(this.backoff / 1000);
    this.state('offline', `offline, retrying in ${s} s`);
    this.timer = setTimeout(() => this.probe(), this.backoff);
    this.backoff = Math.min(this.backoff * 2, 15000);
  },

  /** Before (re)connecting: is there a token problem? (/work needs the
   *  scope /results needs.) */
  async probe() {
    clearTimeout(this.timer);
    try {
      await api('GET', '/work?limit=1');
    } catch (e) {
      if (e.status === 401 || e.status === 403) {
        this.state('offline', e.status === 401 ? 'needs a token' : 'token lacks the client scope');
        return; // a new token restarts the feed
      }
      if (e.status === 0 || e.status >= 500) { this.retry(); return; }
    }
    this.start();
  },

  event(ev) {
    const id = ev.lastEventId;
    if (this.lastId !== null && id && idCovered(id, this.lastId)) return; // seen already
    if (id) this.lastId = id;
    let d;
    try { d = JSON.parse(ev.data); } catch { return; }
    this.count++;
    $('feed-count').textContent = `${this.count} since this page loaded`;
    $('feed-empty').hidden = true;
    let detail = null;
    if (d.status === 'completed') detail = asText(d.result);
    else if (d.status === 'dead') detail = d.error || 'dead';
    else if (d.status === 'cancelled' && d.reason) detail = d.reason;
    else if (d.status === 'batch') {
      const c = d.counts || {};
      detail = `batch finished: ${c.completed} completed, ${c.dead} dead, ${c.cancelled} cancelled`;
    }
    const li = h('li', {class: 'fresh', 'data-id': d.id, 'data-seq': d.seq, 'data-status': d.status},
      h('time', {title: fmtDateTime(d.at)}, fmtClock(d.at)),
      h('span', {}, badge(d.status)),
      h('span', {class: 'what'}, d.status === 'batch' ? h('span', {class: 'mono'}, d.batch) : workLink(d.id),
        h('span', {class: 'queue'}, d.queue)),
      detail !== null ? h('code', {class: `detail${d.status === 'dead' ? ' error' : ''}`, title: detail}, detail) : null);
    const list = $('feed');
    list.prepend(li);
    while (list.children.length > FEED_MAX) list.lastElementChild.remove();
    if (views.current === 'work' && views.workId === d.id) workPage.poll.start(); // also after a retry elsewhere
  },

  init() {
    $('feed-clear').addEventListener('click', () => {
      fill($('feed'));
      this.count = 0;
      $('feed-count').textContent = '';
      $('feed-empty').hidden = false;
    });
    this.probe(); // an EventSource cannot tell a 401 from other failures: ask first
  },
};

// ------------------------------------------------------------------ submit

function initSubmit() {
  const out = $('submit-result');
  $('submit-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    out.className = '';
    let payload;
    try {
      payload = JSON.parse($('submit-payload').value);
    } catch {
      out.className = 'error';
      out.textContent = 'The payload is not JSON (quote text: "like this").';
      return;
    }
    const item = {payload};
    const text = (id) => $(id).value.trim();
    const num = (id) => (text(id) === '' ? undefined : Number(text(id)));
    if (text('submit-queue')) item.queue = text('submit-queue');
    if (text('submit-id')) item.id = text('submit-id');
    for (const [key, id] of [['priority', 'submit-priority'], ['delay', 'submit-delay'],
                             ['timeout', 'submit-timeout'], ['max_attempts', 'submit-max-attempts']]) {
      if (num(id) !== undefined) item[key] = num(id);
    }
    const button = e.submitter || $('submit-form').querySelector('button');
    button.disabled = true;
    try {
      const r = await api('POST', '/work', item, {interactive: true});
      fill(out, r.created ? 'Accepted ' : 'Already known: ', workLink(r.id), ' ', badge(r.status));
      $('submit-id').value = '';
      views.refresh();
    } catch (err) {
      out.className = 'error';
      out.textContent = err.status === 401 ? 'Sign in first.' : err.message;
    } finally {
      button.disabled = false;
    }
  });
}

// -------------------------------------------------------------- admin actions

async function cancelWork(id) {
  if (!window.confirm(`Cancel work ${id}? Only pending or scheduled work can be cancelled.`)) return null;
  return api('DELETE', `/work/${enc(id)}`, undefined, {interactive: true});
}

async function retryWork(id) {
  if (!window.confirm(`Retry dead work ${id}? It gets one more attempt.`)) return null;
  return api('POST', `/work/${enc(id)}/retry`, undefined, {interactive: true});
}

function actionButtons(w, after) {
  const run = (fn) => async (e) => {
    e.preventDefault();
    try {
      if (await fn(w.id)) after(null);
    } catch (err) {
      after(err);
    }
  };
  if (w.status === 'pending' || w.status === 'scheduled') {
    return h('button', {type: 'button', class: 'danger small', onclick: run(cancelWork)}, 'Cancel');
  }
  if (w.status === 'dead') return h('button', {type: 'button', class: 'small', onclick: run(retryWork)}, 'Retry');
  return null;
}

// ---------------------------------------------------------------- work list

const workList = {
  history: [], // the `before` of each newer page, for "Newer"
  next: null,
  query: new URLSearchParams(),
  poll: null,

  href(params) {
    const q = new URLSearchParams();
    for (const k of ['status', 'queue', 'limit', 'before']) if (params[k]) q.set(k, params[k]);
    const qs = q.toString();
    return `#/work${qs ? `?${qs}` : ''}`;
  },

  params() { return Object.fromEntries(['status', 'queue', 'limit', 'before'].map((k) => [k, this.query.get(k) || ''])); },

  show(query) {
    const changedFilter = ['status', 'queue', 'limit'].some((k) => (query.get(k) || '') !== (this.query.get(k) || ''));
    if (changedFilter || !query.get('before')) this.history = [];
    this.query = query;
    const p = this.params();
    $('list-status').value = p.status;
    $('list-queue').value = p.queue;
    const limit = $('list-limit');
    if (p.limit && ![...limit.options].some((o) => o.value === p.limit)) limit.append(h('option', {}, p.limit));
    limit.value = p.limit || '50';
    fill($('work-list'), h('p', {class: 'muted'}, 'Loading…'));
    this.poll.start();
  },

  async load() {
    const p = this.params();
    const q = new URLSearchParams();
    for (const k of ['status', 'queue', 'limit', 'before']) if (p[k]) q.set(k, p[k]);
    const box = $('work-list');
    let r;
    try {
      r = await api('GET', `/work${q.toString() ? `?${q}` : ''}`);
    } catch (e) {
      fill(box, errorBox(e));
      return;
    }
    this.next = r.next_before;
    $('list-older').disabled = r.next_before === null || r.next_before === undefined;
    $('list-newer').disabled = !p.before;
    $('list-newest').disabled = !p.before;
    $('list-page').textContent = p.before ? `page ${this.history.length + 1}` : 'newest first';
    if (!r.items.length) {
      fill(box, h('p', {class: 'muted'}, p.before ? 'No older work.' : 'No work matches.'));
      return;
    }
    const after = (err) => {
      if (err) box.prepend(errorBox(err, 'admin'));
      this.poll.now();
    };
    fill(box, h('div', {class: 'scroll'}, h('table', {id: 'work-table'},
      h('thead', {}, h('tr', {}, ['Id', 'Status', 'Queue', 'Attempts', 'Priority', 'Created', 'Finished',
                                  'Worker', 'Last error', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, r.items.map((w) => h('tr', {'data-id': w.id},
        h('td', {}, workLink(w.id)),
        h('td', {}, badge(w.status)),
        h('td', {}, w.queue),
        h('td', {class: 'num'}, `${w.attempts} / ${w.max_attempts}`),
        h('td', {class: 'num'}, w.priority),
        h('td', {title: fmtDateTime(w.created_at)}, ago(w.created_at)),
        h('td', {title: fmtDateTime(w.finished_at)}, w.finished_at ? ago(w.finished_at) : '—'),
        h('td', {}, w.worker_id || '—'),
        h('td', {class: 'error'}, w.last_error ? h('span', {class: 'clip', title: w.last_error}, w.last_error) : ''),
        h('td', {}, actionButtons(w, after))))))));
  },

  init() {
    this.poll = poller(() => this.load(), LIST_POLL_MS);
    $('list-form').addEventListener('submit', (e) => {
      e.preventDefault();
      this.history = [];
      location.hash = this.href({status: $('list-status').value, queue: $('list-queue').value.trim(),
                                 limit: $('list-limit').value === '50' ? '' : $('list-limit').value});
    });
    $('list-older').addEventListener('click', () => {
      if (this.next === null || this.next === undefined) return;
      const p = this.params();
      this.history.push(p.before);
      location.hash = this.href({...p, before: String(this.next)});
    });
    $('list-newer').addEventListener('click', () => {
      const p = this.params();
      location.hash = this.href({...p, before: this.history.length ? this.history.pop() : ''});
    });
    $('list-newest').addEventListener('click', () => {
      this.history = [];
      location.hash = this.href({...this.params(), before: ''});
    });
  },
};

// ---------------------------------------------------------------- work page

const TIME_KEYS = new Set(['run_at', 'deadline', 'retry_at', 'at']);

/** The attempts of a work item, from its event history. */
function attemptsOf(events) {
  const byN = new Map();
  for (const e of events) {
    const d = e.data || {};
    if (d.attempt === undefined || e.type === 'retried') continue;
    if (e.type === 'started') {
      byN.set(d.attempt, {n: d.attempt, worker: d.worker_id, started: e.at, deadline: d.deadline});
      continue;
    }
    const a = byN.get(d.attempt) || {n: d.attempt};
    a.outcome = e.type;
    a.ended = e.at;
    a.error = d.error;
    a.retry_at = d.retry_at;
    byN.set(d.attempt, a);
  }
  return [...byN.values()].sort((x, y) => x.n - y.n);
}

function eventDetails(e) {
  const d = e.data || {};
  return Object.entries(d).filter(([, v]) => v !== null).map(([k, v]) => h('span', {class: 'detail'},
    h('span', {class: 'muted'}, `${k}: `),
    h('span', {class: 'mono'}, TIME_KEYS.has(k) && typeof v === 'number' ? fmtDateTime(v)
      : (() => { const t = asText(v); return t.length > 300 ? `${t.slice(0, 300)}…` : t; })()),
    '  '));
}

const workPage = {
  poll: null,
  final: false,

  show(id) {
    this.final = false;
    $('work-id').textContent = id;
    $('work-status').className = 'badge';
    $('work-status').textContent = '';
    $('work-cancel').hidden = $('work-retry').hidden = true;
    $('work-message').hidden = true;
    fill($('work-body'), h('p', {class: 'muted'}, 'Loading…'));
    this.poll.start();
  },

  message(text, error) {
    const m = $('work-message');
    m.hidden = !text;
    m.className = `message${error ? ' error' : ''}`;
    m.textContent = text || '';
  },

  async load() {
    const id = views.workId;
    let w, ev;
    try {
      [w, ev] = await Promise.all([api('GET', `/work/${enc(id)}`), api('GET', `/work/${enc(id)}/events`)]);
    } catch (e) {
      if (id !== views.workId) return;
      fill($('work-body'), e.status === 404 ? h('p', {class: 'message error'}, e.message) : errorBox(e));
      return;
    }
    if (id !== views.workId) return;
    this.final = FINAL.has(w.status);
    if (this.final) this.poll.stop(); // nothing changes any more, unless retried
    const st = $('work-status');
    st.className = `badge ${w.status}`;
    st.textContent = w.status;
    $('work-cancel').hidden = !(w.status === 'pending' || w.status === 'scheduled');
    $('work-retry').hidden = w.status !== 'dead';
    const events = ev.events || [];
    const attempts = attemptsOf(events);
    const field = (label, value, id) => [h('dt', {}, label), h('dd', id ? {id} : {}, value)];
    const when = (t) => (t ? h('span', {title: ago(t)}, fmtDateTime(t)) : '—');
    const links = (ids) => (ids && ids.length ? ids.map((x, i) => [i ? ', ' : '', workLink(x)]) : '—');
    let batch = null;
    if (w.batch) {
      try {
        batch = await api('GET', `/batches/${enc(w.batch)}`);
      } catch {
        batch = null;
      }
    }
    if (id !== views.workId) return;
    const batchText = (b) => (b.finished ? `finished ${fmtDateTime(b.finished_at)}`
      : Object.entries(b.counts).filter(([, n]) => n).map(([k, n]) => `${n} ${k}`).join(', '));
    fill($('work-body'),
      h('dl', {class: 'kv'},
        field('Queue', w.queue), field('Priority', w.priority),
        field('Attempts', `${w.attempts} of ${w.max_attempts}`, 'work-attempts'), field('Worker', w.worker_id || '—'),
        field('Created', when(w.created_at)), field('Timeout', fmtDuration(w.timeout_ms)),
        field('Run at', when(w.run_at)), field('Deadline', when(w.deadline)),
        field('Started', when(w.started_at)), field('Finished', when(w.finished_at)),
        field('After', links(w.after), 'work-after'), field('Children', links(w.children), 'work-children'),
        w.after && w.after.length ? field('If a parent fails', w.run_anyway ? 'runs anyway' : 'cancelled') : null,
        w.batch ? field('Batch', [h('span', {class: 'mono'}, w.batch), ' ',
                                  batch ? h('span', {class: 'muted'}, batchText(batch)) : null], 'work-batch') : null),
      h('h3', {}, 'Payload'),
      h('pre', {id: 'work-payload'}, asText(w.payload, true)),
      w.status === 'completed' ? [h('h3', {}, 'Result'), h('pre', {id: 'work-result'}, asText(w.result, true))] : null,
      w.last_error ? [h('h3', {}, 'Last error'), h('pre', {id: 'work-error', class: 'error'}, w.last_error)] : null,
      h('h3', {}, `Attempts (${attempts.length})`),
      attempts.length
        ? h('div', {class: 'scroll'}, h('table', {id: 'work-attempt-table'},
            h('thead', {}, h('tr', {}, ['#', 'Worker', 'Started', 'Ended', 'Took', 'Outcome', 'Error'].map((t) => h('th', {}, t)))),
            h('tbody', {}, attempts.map((a) => h('tr', {},
              h('td', {class: 'num'}, a.n), h('td', {}, a.worker || '—'), h('td', {}, fmtDateTime(a.started)),
              h('td', {}, a.ended ? fmtDateTime(a.ended) : '—'),
              h('td', {class: 'num'}, a.ended && a.started ? fmtDuration(toMs(a.ended) - toMs(a.started)) : '—'),
              h('td', {}, a.outcome ? badge(a.outcome) : badge('running')),
              h('td', {class: 'error'}, a.error || '',
                a.retry_at ? h('span', {class: 'muted'}, ` (retry at ${fmtDateTime(a.retry_at)})`) : null))))))
        : h('p', {class: 'muted'}, 'Not started yet.'),
      h('h3', {}, `History (${events.length} events)`),
      h('div', {class: 'scroll'}, h('table', {id: 'history'},
        h('thead', {}, h('tr', {}, ['Seq', 'Time', 'Event', 'Term', 'Details'].map((t) => h('th', {}, t)))),
        h('tbody', {}, events.map((e) => h('tr', {'data-type': e.type},
          h('td', {class: 'num'}, e.seq), h('td', {}, fmtDateTime(e.at)), h('td', {}, badge(e.type)),
          h('td', {class: 'num'}, e.term), h('td', {}, eventDetails(e))))))));
  },

  async act(fn, done) {
    try {
      const r = await fn(views.workId);
      if (!r) return;
      this.message(done);
    } catch (e) {
      this.message(e.status === 403 ? `This needs the admin scope: ${e.message}` : e.message, true);
    }
    this.poll.start();
  },

  init() {
    this.poll = poller(() => this.load(), POLL_MS);
    $('work-cancel').addEventListener('click', () => this.act(cancelWork, 'Cancelled.'));
    $('work-retry').addEventListener('click', () => this.act(retryWork, 'Retried: it is pending again.'));
  },
};

// ------------------------------------------------------------------- views

const overview = {
  cluster: null,
  queues: null,
  webhooks: null,
  schedules: null,
  init() {
    this.cluster = poller(loadCluster, POLL_MS);
    this.queues = poller(loadQueues, POLL_MS);
    this.webhooks = poller(loadWebhooks, POLL_MS);
    this.schedules = poller(loadSchedules, LIST_POLL_MS);
  },
};

const views = {
  current: null,
  workId: null,

  route() {
    const raw = location.hash.replace(/^#/, '') || '/';
    const [path, qs] = raw.split('?');
    let view = 'overview';
    if (path === '/work' || path === '/work/') view = 'work-list';
    else if (path.startsWith('/work/')) view = 'work';
    this.current = view;
    for (const v of ['overview', 'work-list', 'work']) $(`view-${v}`).hidden = v !== view;
    for (const a of document.querySelectorAll('[data-nav]')) {
      a.classList.toggle('active', a.dataset.nav === (view === 'overview' ? 'overview' : 'work'));
    }
    overview.cluster[view === 'overview' ? 'start' : 'stop']();
    overview.queues[view === 'overview' ? 'start' : 'stop']();
    overview.webhooks[view === 'overview' ? 'start' : 'stop']();
    overview.schedules[view === 'overview' ? 'start' : 'stop']();
    if (view !== 'work-list') workList.poll.stop();
    if (view !== 'work') workPage.poll.stop();
    if (view === 'work-list') workList.show(new URLSearchParams(qs || ''));
    if (view === 'work') {
      try { this.workId = decodeURIComponent(path.slice('/work/'.length)); } catch { this.workId = path.slice(6); }
      document.title = `${this.workId} · workd`;
      workPage.show(this.workId);
    } else {
      this.workId = null;
      document.title = 'workd';
    }
  },

  refresh() {
    overview.cluster.now();
    overview.queues.now();
    overview.webhooks.now();
    overview.schedules.now();
    workList.poll.now();
    if (this.current === 'work') workPage.poll.start();
  },
};

async function showNode() {
  try {
    const r = await api('GET', '/healthz');
    $('node').textContent = `node ${r.node}`;
    $('node').title = 'The server node that serves this page';
  } catch {
    $('node').textContent = '';
  }
}

/** Says in the header which zone the page's times are in. */
function showZone() {
  const name = Intl.DateTimeFormat().resolvedOptions().timeZone || 'local time';
  $('zone').textContent = `times: ${name} (UTC${fmtZone(new Date())})`;
}

function main() {
  showZone();
  auth.init();
  overview.init();
  workList.init();
  workPage.init();
  initSubmit();
  feed.init();
  window.addEventListener('hashchange', () => views.route());
  document.addEventListener('visibilitychange', () => { if (!document.hidden) views.refresh(); });
  views.route();
  showNode();
}

main();
