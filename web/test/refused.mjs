// Opens a page that must be refused (e.g. the player without the token a
// relay with auth on needs): `node test/refused.mjs PAGE_URL`. Waits for
// the player's error state and prints it as one JSON line.
import { launch, report, waitFor } from './browser.mjs';

const [url] = process.argv.slice(2);
const browser = await launch();
const result = { url };
try {
  const page = await browser.newPage();
  await page.goto(url);
  await waitFor(page, () => window.quichubPlayer && window.quichubPlayer.stats.state === 'error', null, 20000, 'the error state');
  result.error = await page.textContent('#error');
  result.stats = await page.evaluate(() => window.quichubPlayer.stats);
  report(result, true);
} catch (e) {
  result.error = String(e);
  report(result, false);
} finally {
  await browser.close();
}
