// What @moq/net 0.2.8 (the MoQT session of @moq/watch 0.4.6) gets wrong at
// draft 18, with its own codec, no browser and no relay:
//   node test/moq-net-draft18.mjs SUBSCRIBE_OK_HEX
// 1. The SUBSCRIBE it writes for @moq/watch's catalog (request 0, broadcast
//    `live/demo`, track `catalog.json`, the catalog's priority): printed as
//    hex, type byte first.
// 2. How it reads SUBSCRIBE_OK_HEX, a draft-18 SUBSCRIBE_OK as quichub writes
//    it (Length (16) and body, without the type byte): the error, if any.
// Prints one JSON line; the Rust test (moq_dev.rs) pins the bytes. Its
// modules are imported by path: the package exports only its API.
import { Reader, Writer } from '../node_modules/@moq/net/stream.js';
import { Subscribe, SubscribeOk } from '../node_modules/@moq/net/ietf/subscribe.js';
import { Version } from '../node_modules/@moq/net/ietf/version.js';
import { toWire } from '../node_modules/@moq/net/ietf/priority.js';
import { PRIORITY } from '../node_modules/@moq/hang/catalog/priority.js';
import * as Path from '../node_modules/@moq/net/path.js';
import { report } from './browser.mjs';

const [subscribeOkHex] = process.argv.slice(2);
const hex = (b) => Buffer.from(b).toString('hex');
const result = {};
try {
  const chunks = [];
  const w = new Writer(new WritableStream({ write: (c) => chunks.push(new Uint8Array(c)) }), Version.DRAFT_18);
  await w.u53(Subscribe.id);
  // As @moq/net's ietf subscriber (`#openSubscribe`) writes it for
  // @moq/watch's catalog, at @moq/hang's catalog priority.
  await new Subscribe({
    requestId: 0n,
    trackNamespace: Path.from('live/demo'),
    trackName: 'catalog.json',
    subscriberPriority: toWire(PRIORITY.catalog),
  }).encode(w, Version.DRAFT_18);
  w.close();
  await w.closed;
  result.subscribe = chunks.map(hex).join('');
  const r = new Reader(undefined, new Uint8Array(Buffer.from(subscribeOkHex, 'hex')), Version.DRAFT_18);
  try {
    const ok = await SubscribeOk.decode(r, Version.DRAFT_18);
    result.subscribeOk = { trackAlias: String(ok.trackAlias) };
  } catch (e) {
    result.subscribeOkError = String(e.message ?? e);
  }
  report(result);
} catch (e) {
  result.error = String(e.stack ?? e);
  report(result, false);
}
