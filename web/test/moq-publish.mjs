// moq-dev's <moq-publish> (npm @moq/publish, pinned in package.json)
// publishing Chromium's fake camera and microphone into a quichub relay:
//   node test/moq-publish.mjs RELAY_HTTP QUIC_PORT BROADCAST OUT_DIR PAGE_PORT MODE
// MODE `webtransport`: https://127.0.0.1:QUIC_PORT/ with the relay's
// certificate pinned (@moq/publish 0.2.17's @moq/net 0.1.9 offers
// moq-lite-04 first); `websocket`: a page without WebTransport, whose
// @moq/qmux 0.1.3 offers only bare `qmux-01`/`qmux-00`, so the version is
// chosen in a legacy CLIENT_SETUP (moq-lite-02).
// Bundles test/moq-publish/entry.js into OUT_DIR and serves it on
// 127.0.0.1:PAGE_PORT (the relay must allow that origin for the WebSocket).
// Prints `{"ready": true, ...}` once connected with both renditions in its
// catalog, then publishes until its standard input ends (or 5 minutes
// pass), and prints a last JSON line with what the page saw. Exits 0 when
// it got ready.
import { launch, report } from './browser.mjs';
import * as esbuild from 'esbuild';
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const [relayHttp, quicPort, name, outDir, pagePort, mode] = process.argv.slice(2);
if (mode !== 'webtransport' && mode !== 'websocket') throw new Error(`mode: ${mode}`);
// Read from the start: the end of input is the signal to stop.
const stdinEnded = new Promise((r) => {
  process.stdin.on('end', r);
  process.stdin.on('close', r);
  process.stdin.resume();
});
const bundle = join(outDir, 'moq-publish.js');
await esbuild.build({
  entryPoints: [new URL('./moq-publish/entry.js', import.meta.url).pathname],
  bundle: true,
  format: 'esm',
  target: 'chrome120',
  outfile: bundle,
  logLevel: 'warning',
});
const hash = (await (await fetch(`http://${relayHttp}/certificate.sha256`)).text()).trim();
const server = http.createServer((req, res) => {
  if (req.url.startsWith('/moq-publish.js')) {
    res.setHeader('content-type', 'text/javascript');
    res.end(readFileSync(bundle));
    return;
  }
  res.setHeader('content-type', 'text/html');
  res.end('<!doctype html><html><body><script type="module" src="/moq-publish.js"></script></body></html>');
});
await new Promise((r) => server.listen(Number(pagePort), '127.0.0.1', r));
const q = new URLSearchParams({ url: `https://127.0.0.1:${quicPort}/`, name, hash });
if (mode === 'websocket') q.set('ws', `ws://${relayHttp}/`);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const browser = await launch(['--use-fake-device-for-media-stream', '--use-fake-ui-for-media-stream']);
const logs = [];
const result = { mode };
let ok = false;
try {
  const context = await browser.newContext({ viewport: { width: 800, height: 500 } });
  await context.grantPermissions(['camera', 'microphone']);
  const page = await context.newPage();
  page.on('console', (m) => {
    if (m.type() !== 'debug') logs.push(`${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`));
  page.on('crash', () => logs.push("crash: this page's renderer died"));
  if (mode === 'websocket') {
    await page.addInitScript(() => {
      delete window.WebTransport;
    });
  }
  await page.goto(`http://127.0.0.1:${server.address().port}/?${q}`);
  result.webTransportInPage = await page.evaluate(() => 'WebTransport' in window);
  const look = () => page.evaluate(() => window.moqPublishState());
  const ready = (s) => s.connection === 'connected' && s.videoCatalog && s.audioCatalog;
  let s = await look();
  for (const end = Date.now() + 90000; !ready(s) && Date.now() < end; ) {
    await sleep(250);
    s = await look();
  }
  result.ready = !!ready(s);
  result.atReady = s;
  // The Rust test starts `quichub sub` on this line.
  console.log(JSON.stringify({ ready: result.ready, version: s.version }));
  ok = result.ready;
  if (ok) {
    // An unref'd timer: it must not keep the process alive once done.
    await Promise.race([stdinEnded, new Promise((r) => setTimeout(r, 300000).unref())]);
  }
  result.state = await look();
  await page.screenshot({ path: join(outDir, `moq-publish-${mode}.png`) });
  result.logs = logs.slice(-200);
  report(result, ok);
} catch (e) {
  result.error = String(e);
  result.logs = logs.slice(-200);
  report(result, false);
} finally {
  await browser.close();
  server.close();
  // stdin kept open would keep the process alive.
  process.stdin.destroy();
}
