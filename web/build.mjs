// Builds web/dist from web/src and web/pages: the two page scripts bundled
// (esbuild, uPlot included), the HTML, CSS and uPlot's CSS copied. The
// output is byte-for-byte reproducible from the locked packages, and is
// committed: `cargo build` embeds it and needs no npm.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync, rmSync } from 'node:fs';

// `node build.mjs [OUTDIR]`: web/dist by default; the freshness test builds
// into a temporary directory and compares.
process.chdir(new URL('.', import.meta.url).pathname);
const dist = process.argv[2] ? `${process.argv[2].replace(/\/$/, '')}/` : new URL('./dist/', import.meta.url).pathname;
rmSync(dist, { recursive: true, force: true });
mkdirSync(dist, { recursive: true });
await build({
  entryPoints: { player: 'src/player.js', dashboard: 'src/dashboard.js' },
  bundle: true,
  format: 'esm',
  target: 'es2022',
  minify: true,
  legalComments: 'eof',
  outdir: dist,
  logLevel: 'warning',
});
for (const f of ['index.html', 'watch.html', 'style.css']) copyFileSync(`pages/${f}`, `${dist}${f}`);
copyFileSync('node_modules/uplot/dist/uPlot.min.css', `${dist}uPlot.min.css`);
