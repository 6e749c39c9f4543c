// moq-dev's <moq-watch> (npm @moq/watch, pinned in package.json) playing a
// broadcast from a quichub relay:
//   node test/moq-watch.mjs RELAY_HTTP QUIC_PORT BROADCAST OUT_DIR PAGE_PORT MODE
// MODE `webtransport`: the element dials https://127.0.0.1:QUIC_PORT/ (the
// relay's self-signed certificate pinned with serverCertificateHashes);
// `websocket`: a page without WebTransport (as Safari), which falls back
// to a WebSocket to RELAY_HTTP (@moq/qmux). Either way @moq/net 0.2.8
// offers moq-lite-05 first, which quichub serves through its lite bridge.
// Bundles test/moq-watch/entry.js with esbuild into OUT_DIR and serves it
// on 127.0.0.1:PAGE_PORT (a secure context; the relay must allow that
// origin, [http] allowed_origins, for the WebSocket).
// Waits for decoded video frames and audio, checks that the picture
// changes (two screenshots of the element's canvas), saves
// OUT_DIR/moq-watch-MODE.png, and prints one JSON line; the Rust test
// (moq_dev.rs) asserts on it. Exits 0 when the page played.
import { launch, report } from './browser.mjs';
import * as esbuild from 'esbuild';
import http from 'node:http';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const [relayHttp, quicPort, name, outDir, pagePort, mode] = process.argv.slice(2);
if (mode !== 'webtransport' && mode !== 'websocket') throw new Error(`mode: ${mode}`);
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
await new Promise((r) => server.listen(Number(pagePort), '127.0.0.1', r));
const q = new URLSearchParams({ url: `https://127.0.0.1:${quicPort}/`, name, hash });
if (mode === 'websocket') q.set('ws', `ws://${relayHttp}/`);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const browser = await launch();
const logs = [];
const result = { mode };
try {
  const page = await browser.newPage({ viewport: { width: 800, height: 500 } });
  page.on('console', (m) => {
    // @moq/net logs every message at debug level: keep the rest.
    if (m.type() !== 'debug') logs.push(`${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`));
  page.on('crash', () => logs.push("crash: this page's renderer died"));
  await page.addInitScript((noWebTransport) => {
    if (noWebTransport) delete window.WebTransport;
    // Count what the WebCodecs decoders @moq/watch makes put out: decoded
    // audio is the proof that audio plays (the element's own stats count
    // only bytes received for audio).
    const counts = { audio: 0, video: 0, audioErrors: 0, videoErrors: 0 };
    window.decoderCounts = counts;
    for (const [cls, kind] of [['AudioDecoder', 'audio'], ['VideoDecoder', 'video']]) {
      const Base = window[cls];
      if (!Base) continue;
      window[cls] = class extends Base {
        constructor(init) {
          super({
            output: (x) => {
              counts[kind] += 1;
              init.output(x);
            },
            error: (e) => {
              counts[`${kind}Errors`] += 1;
              init.error(e);
            },
          });
        }
      };
    }
  }, mode === 'websocket');
  await page.goto(`http://127.0.0.1:${server.address().port}/?${q}`);
  result.webTransportInPage = await page.evaluate(() => 'WebTransport' in window);
  const look = () => page.evaluate(() => ({ state: window.moqWatchState(), decoded: { ...window.decoderCounts } }));
  // A loaded machine takes its time: wait for events, with a generous deadline.
  const playing = (s) => s.state.videoFrames > 30 && s.decoded.video > 30 && s.decoded.audio > 20;
  let seen = await look();
  for (const end = Date.now() + 60000; !playing(seen) && Date.now() < end; ) {
    await sleep(250);
    seen = await look();
  }
  result.playing = playing(seen);
  // The picture changes: two shots of the canvas, at least 15 frames apart.
  const canvas = page.locator('moq-watch canvas');
  const shot = async () => createHash('sha256').update(await canvas.screenshot()).digest('hex');
  const first = await shot();
  const framesAt = seen.state.videoFrames;
  for (const end = Date.now() + 20000; seen.state.videoFrames < framesAt + 15 && Date.now() < end; ) {
    await sleep(250);
    seen = await look();
  }
  result.pixelsChanged = first !== (await shot());
  await page.screenshot({ path: join(outDir, `moq-watch-${mode}.png`) });
  seen = await look();
  result.state = seen.state;
  result.decoded = seen.decoded;
  result.logs = logs.slice(-200);
  report(result, result.playing && result.pixelsChanged);
} catch (e) {
  result.error = String(e);
  result.logs = logs.slice(-200);
  report(result, false);
} finally {
  await browser.close();
  server.close();
}
