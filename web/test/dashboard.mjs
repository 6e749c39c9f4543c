// Drives the dashboard: `node test/dashboard.mjs PAGE_URL SCREENSHOT TRACK...`
// (each TRACK as ns/.../name). Waits until every TRACK is listed, clicks the
// plot button of the first and waits for points, then saves a screenshot.
// Prints one JSON line.
import { launch, report, waitFor } from './browser.mjs';

const [url, shot, ...tracks] = process.argv.slice(2);
const browser = await launch();
const result = { url, tracks };
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  const logs = [];
  page.on('console', (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`));
  result.logs = logs;
  await page.goto(url);
  await waitFor(
    page,
    (want) => want.every((t) => document.querySelector(`tr[data-track="${CSS.escape(t)}"]`)),
    tracks,
    15000,
    'tracks listed',
  );
  result.rows = await page.$$eval('#tracks tr', (rows) => rows.map((r) => r.innerText.split('\t')));
  result.namespaces = await page.$$eval('#namespaces tr', (rows) => rows.map((r) => r.innerText));
  await page.click(`tr[data-track="${tracks[0]}"] button`);
  await waitFor(page, () => window.quichubDashboard.points > 100, null, 15000, 'plot points');
  result.points = await page.evaluate(() => window.quichubDashboard.points);
  result.plotted = await page.evaluate(() => window.quichubDashboard.plotted);
  await new Promise((r) => setTimeout(r, 1000));
  await page.screenshot({ path: shot, fullPage: true });
  report(result, true);
} catch (e) {
  result.error = String(e);
  report(result, false);
} finally {
  await browser.close();
}
