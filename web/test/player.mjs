// Drives the built-in player: `node test/player.mjs PAGE_URL SCREENSHOT [no-webtransport]`.
// Waits for decoded and shown frames, reads the latency on screen, checks
// the canvas' pixels change, and saves a screenshot. Prints one JSON line.
// `no-webtransport` removes WebTransport from the page before it runs, as
// in Safari: the player must fall back to MoQT over WebSocket.
import { launch, report, waitFor } from './browser.mjs';

const [url, shot, mode] = process.argv.slice(2);
const browser = await launch();
const result = { url };
try {
  // An https: page is on the relay's own certificate: accepted here as a
  // CA-signed one would be (WebSocket has no serverCertificateHashes).
  const page = await browser.newPage({ viewport: { width: 1000, height: 600 }, ignoreHTTPSErrors: url.startsWith('https:') });
  const logs = [];
  page.on('console', (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`));
  result.logs = logs;
  if (mode === 'no-webtransport') {
    await page.addInitScript(() => {
      delete window.WebTransport;
    });
  }
  await page.goto(url);
  result.webTransportInPage = await page.evaluate(() => 'WebTransport' in window);
  await waitFor(page, () => window.quichubPlayer && window.quichubPlayer.stats.renderedFrames > 30, null, 20000, 'frames shown').catch((e) => {
    result.error = e.message;
  });
  const pixels = () => {
    const c = document.getElementById('video');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let h = 0;
    for (let i = 0; i < d.length; i += 97) h = (h * 31 + d[i]) >>> 0;
    return h;
  };
  const p1 = await page.evaluate(pixels);
  await new Promise((r) => setTimeout(r, 1500));
  const p2 = await page.evaluate(pixels);
  result.pixelsChanged = p1 !== p2;
  result.latencyText = await page.textContent('#latency');
  const m = /^(-?\d+) ms$/.exec(result.latencyText.trim());
  result.latencyMs = m ? Number(m[1]) : null;
  result.broadcastText = await page.textContent('#broadcast');
  result.stats = await page.evaluate(() => window.quichubPlayer.stats);
  await page.screenshot({ path: shot });
  // A hostile broadcast name is shown as text, never parsed as HTML.
  const evil = '<img src=x onerror="window.pwned=1">/"><script>window.pwned=2</script>';
  const page2 = await browser.newPage({ ignoreHTTPSErrors: url.startsWith('https:') });
  await page2.goto(new URL(`/watch/${encodeURIComponent(evil)}`, url).href);
  await page2.waitForFunction(() => document.getElementById('broadcast').textContent.length > 0, null, { timeout: 5000 });
  result.hostile = await page2.evaluate(() => ({
    text: document.getElementById('broadcast').textContent,
    imgs: document.querySelectorAll('img').length,
    scripts: document.querySelectorAll('script').length,
    pwned: window.pwned || 0,
  }));
  result.hostileSafe = result.hostile.text === evil && result.hostile.imgs === 0 && result.hostile.scripts === 1 && result.hostile.pwned === 0;
  const s = result.stats;
  const ok = !result.error && s.decodedFrames > 30 && s.renderedFrames > 30 && result.pixelsChanged
    && result.latencyMs !== null && result.latencyMs < 1000 && result.hostileSafe;
  report(result, ok);
} catch (e) {
  result.error = String(e);
  report(result, false);
} finally {
  await browser.close();
}
