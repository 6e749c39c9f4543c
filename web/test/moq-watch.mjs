// moq-dev's <moq-watch> (npm @moq/watch, pinned in package.json) against a
// quichub relay, beside quichub's own player on the same broadcast:
//   node test/moq-watch.mjs RELAY_HTTP QUIC_PORT BROADCAST OUT_DIR [PAGE_PORT]
// Bundles test/moq-watch/entry.js with esbuild into OUT_DIR, serves it on
// 127.0.0.1:PAGE_PORT (a secure context; any free port without it: the
// relay must allow that origin, [http] allowed_origins, for D's WebSocket),
// and opens three pages in two Chromiums:
//   A. quichub's player (RELAY_HTTP/watch/BROADCAST), which must play, in a
//      browser of its own: Chromium's renderer (or its network service) now
//      and then dies in the <moq-watch> tab when the relay closes its
//      session, and a browser fault must not pass for the relay's;
//   B. <moq-watch> as shipped (reload on: it waits for the broadcast to be
//      announced through SUBSCRIBE_NAMESPACE before subscribing);
//   C. <moq-watch reload="false"> (subscribes to catalog.json at once);
//   D. <moq-watch> in a page without WebTransport (as Safari), over a
//      WebSocket to the relay's HTTP port (@moq/qmux, qmux-01.moqt-18).
// Prints one JSON line with what each page saw (see crates/moqt/INTEROP.md,
// "@moq/watch"); the Rust test (e2e_web.rs) asserts on it. Exits 0 when the
// script itself ran; the verdict is the Rust test's.
import { launch, report, waitFor } from './browser.mjs';
import * as esbuild from 'esbuild';
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const [relayHttp, quicPort, name, outDir, pagePort] = process.argv.slice(2);
const bundle = join(outDir, 'moq-watch.js');
await esbuild.build({
  entryPoints: [new URL('./moq-watch/entry.js', import.meta.url).pathname],
  bundle: true,
  format: 'esm',
  target: 'chrome120',
  outfile: bundle,
  logLevel: 'warning',
});
const hash = (await (await fetch(`http://${relayHttp}/certificate.sha256`)).text()).trim();
const server = http.createServer((req, res) => {
  if (req.url.startsWith('/moq-watch.js')) {
    res.setHeader('content-type', 'text/javascript');
    res.end(readFileSync(bundle));
    return;
  }
  res.setHeader('content-type', 'text/html');
  res.end('<!doctype html><html><body><script type="module" src="/moq-watch.js"></script></body></html>');
});
await new Promise((r) => server.listen(Number(pagePort || 0), '127.0.0.1', r));
const watchUrl = (reload, ws) => {
  const q = new URLSearchParams({ url: `https://127.0.0.1:${quicPort}/`, name, hash });
  if (reload !== undefined) q.set('reload', reload);
  if (ws) q.set('ws', `ws://${relayHttp}/`);
  return `http://127.0.0.1:${server.address().port}/?${q}`;
};

const playerBrowser = await launch();
const browser = await launch();
const result = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function open(url, logs, on = browser, noWebTransport = false) {
  const page = await on.newPage({ viewport: { width: 800, height: 500 } });
  if (noWebTransport) {
    await page.addInitScript(() => {
      delete window.WebTransport;
    });
  }
  page.on('console', (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`));
  page.on('crash', () => logs.push('crash: this page\'s renderer died'));
  await page.goto(url);
  return page;
}
// What a <moq-watch> page shows, or null (and `crashed` set) once its
// renderer is gone: its logs so far still tell how far it got.
async function look(page, rec, shot) {
  try {
    const state = await page.evaluate(() => window.moqWatchState());
    if (shot) await page.screenshot({ path: join(outDir, shot) });
    return state;
  } catch (e) {
    rec.crashed = true;
    rec.logs.push(`look: ${e}`);
    return null;
  }
}
const hasLog = (logs, re) => logs.some((l) => re.test(l));
async function untilLog(logs, re, ms) {
  const end = Date.now() + ms;
  while (!hasLog(logs, re)) {
    if (Date.now() > end) return false;
    await sleep(100);
  }
  return true;
}
try {
  // A: quichub's player, playing before the others arrive.
  const a = { logs: [] };
  result.player = a;
  const pa = await open(`http://${relayHttp}/watch/${name}`, a.logs, playerBrowser);
  await waitFor(pa, () => window.quichubPlayer && window.quichubPlayer.stats.renderedFrames > 10, null, 20000, 'player frames');
  a.framesBefore = await pa.evaluate(() => window.quichubPlayer.stats.renderedFrames);

  // B: <moq-watch> as shipped.
  const b = { logs: [] };
  result.watch = b;
  const pb = await open(watchUrl(), b.logs);
  b.alpnLogged = await untilLog(b.logs, /negotiated ALPN: moqt-18/, 10000);
  b.subscribeNamespaceLogged = await untilLog(b.logs, /subscribe_namespace written/, 5000);
  await sleep(3000);
  b.state = await look(pb, b, 'moq-watch.png');

  // C: <moq-watch reload="false">: its SUBSCRIBE reaches the relay.
  const c = { logs: [] };
  result.watchNoReload = c;
  const pc = await open(watchUrl('false'), c.logs);
  c.alpnLogged = await untilLog(c.logs, /negotiated ALPN: moqt-18/, 10000);
  c.subscribeWritten = await untilLog(c.logs, /subscribe written: .*track=catalog\.json/, 5000);
  c.subscribeError = await untilLog(c.logs, /subscribe error: .*track=catalog\.json/, 5000);
  await sleep(1500);
  c.state = await look(pc, c, 'moq-watch-no-reload.png');
  await pc.close().catch(() => {});

  // D: <moq-watch> without WebTransport: MoQT over WebSocket.
  const d = { logs: [] };
  result.watchWebSocket = d;
  const pd = await open(watchUrl(undefined, true), d.logs, browser, true);
  d.webSocketLogged = await untilLog(d.logs, /connected via WebSocket/, 10000);
  d.alpnLogged = await untilLog(d.logs, /negotiated ALPN: moqt-18/, 5000);
  d.subscribeNamespaceLogged = await untilLog(d.logs, /subscribe_namespace written/, 5000);
  d.announcedLogged = await untilLog(d.logs, /announced: broadcast=.* active=true/, 5000);
  d.subscribeWritten = await untilLog(d.logs, /subscribe written: .*track=catalog\.json/, 5000);
  await sleep(1500);
  d.state = await look(pd, d, 'moq-watch-websocket.png');
  await pd.close().catch(() => {});

  // The other sessions outlived C's and D's: A still plays, B is still connected.
  await sleep(1500);
  a.framesAfter = await pa.evaluate(() => window.quichubPlayer.stats.renderedFrames);
  a.stats = await pa.evaluate(() => window.quichubPlayer.stats);
  await pa.screenshot({ path: join(outDir, 'moq-watch-beside-player.png') });
  b.stateAfter = await look(pb, b);
  report(result);
} catch (e) {
  result.error = String(e);
  report(result, false);
} finally {
  await browser.close();
  await playerBrowser.close();
  server.close();
}
