// Drives the dashboard: `node test/dashboard.mjs PAGE_URL SCREENSHOT TRACK...`
// (each TRACK as ns/.../name; a leading `+` plots it too). Waits until every
// TRACK is listed, then for each `+` one clicks its plot button and waits for
// 50 points, then saves a screenshot (of the last plot). Prints one JSON line.
import { launch, report, waitFor } from './browser.mjs';

const [url, shot, ...args] = process.argv.slice(2);
const tracks = args.map((t) => t.replace(/^\+/, ''));
const plots = args.filter((t) => t.startsWith('+')).map((t) => t.slice(1));
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
  result.broadcasts = await page.$$eval('#namespaces tr', (rows) => rows.map((r) => r.innerText.split('\t')));
  result.plots = {};
  for (const t of plots) {
    await page.click(`tr[data-track="${t}"] button`);
    await waitFor(page, (t) => window.quichubDashboard.plotted === t && window.quichubDashboard.points >= 50, t, 15000, `points of ${t}`);
    await new Promise((r) => setTimeout(r, 500));
    result.plots[t] = await page.evaluate(() => ({ points: window.quichubDashboard.points, series: window.quichubDashboard.series }));
  }
  await page.screenshot({ path: shot, fullPage: true });
  report(result, true);
} catch (e) {
  result.error = String(e);
  report(result, false);
} finally {
  await browser.close();
}
