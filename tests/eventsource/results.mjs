// Follows GET /results with npm's eventsource package, as a Node.js program
// would, and prints one JSON line per thing that happens: open, error, and
// each event with its type, lastEventId and data. The package reconnects by
// itself after a dropped connection, sending Last-Event-ID.
//
// Usage: node results.mjs URL
import {EventSource} from 'eventsource';

const out = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);
const es = new EventSource(process.argv[2]);
es.onopen = () => out({type: 'open'});
es.onerror = (e) => out({type: 'error', code: e.code ?? null, message: e.message ?? null});
for (const type of ['ready', 'completed', 'dead', 'cancelled', 'message']) {
  es.addEventListener(type, (ev) => out({type, lastEventId: ev.lastEventId, data: ev.data}));
}
process.stdin.on('end', () => { es.close(); process.exit(0); });
process.stdin.resume();
