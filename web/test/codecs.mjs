// Which codecs this Chromium decodes: `node test/codecs.mjs URL` (any page of
// the relay's HTTP port: WebCodecs needs a secure context, which
// http://127.0.0.1 is). Prints {"video": {...}, "audio": {...}}.
import { launch, report } from './browser.mjs';

const url = process.argv[2];
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(url);
  const r = await page.evaluate(async () => {
    const out = { video: {}, audio: {}, webtransport: typeof WebTransport === 'function' };
    for (const c of ['avc1.42c01e', 'avc1.42e01e', 'vp8', 'vp09.00.10.08']) {
      try {
        out.video[c] = (await VideoDecoder.isConfigSupported({ codec: c, codedWidth: 640, codedHeight: 360 })).supported;
      } catch {
        out.video[c] = false;
      }
    }
    for (const c of ['opus', 'mp4a.40.2']) {
      try {
        out.audio[c] = (await AudioDecoder.isConfigSupported({ codec: c, sampleRate: 48000, numberOfChannels: 2 })).supported;
      } catch {
        out.audio[c] = false;
      }
    }
    return out;
  });
  report(r);
} finally {
  await browser.close();
}
