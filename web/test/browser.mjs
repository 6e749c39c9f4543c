// Launches Debian's Chromium (not the headless shell: it lacks WebTransport)
// for the web tests, headless, with a fresh profile, and with QUIC on.
import { chromium } from 'playwright-core';
import { existsSync } from 'node:fs';

export const CHROMIUM = process.env.QUICHUB_CHROMIUM || '/usr/bin/chromium';

/** `args`: further Chromium switches (e.g. fake media devices). */
export async function launch(args = []) {
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM} (apt-get install chromium)`);
  // playwright-core gives the browser a fresh temporary --user-data-dir.
  return chromium.launch({
    executablePath: CHROMIUM,
    ignoreDefaultArgs: ['--headless'],
    args: [
      '--headless=new',
      '--no-sandbox',
      '--disable-gpu',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--autoplay-policy=no-user-gesture-required',
      ...args,
    ],
  });
}

/** Prints one JSON line for the Rust test to read, then exits. */
export function report(obj, ok = true) {
  console.log(JSON.stringify(obj));
  process.exitCode = ok ? 0 : 1;
}

/** Polls `fn` (in the page) until it returns a truthy value or `ms` pass. */
export async function waitFor(page, fn, arg, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await page.evaluate(fn, arg);
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
