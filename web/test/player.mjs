// Drives the built-in player: `node test/player.mjs PAGE_URL SCREENSHOT`.
// Waits for decoded and shown frames, reads the latency on screen, checks
// the canvas' pixels change, and saves a screenshot. Prints one JSON line.
import { launch, report, waitFor } from './browser.mjs';

const [url, shot] = process.argv.slice(2);
const browser = await launch();
const result = { url };
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 600 } });
  const logs = [];
  page.on('console', (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`));
  result.logs = logs;
  await page.goto(url);
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
  const s = result.stats;
  const ok = !result.error && s.decodedFrames > 30 && s.renderedFrames > 30 && result.pixelsChanged
    && result.latencyMs !== null && result.latencyMs < 1000;
  report(result, ok);
} catch (e) {
  result.error = String(e);
  report(result, false);
} finally {
  await browser.close();
}
