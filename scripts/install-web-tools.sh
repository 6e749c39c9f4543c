#!/usr/bin/env bash
# Installs what the web tests (crates/quichub/tests/web/) need:
#   - Debian's chromium (the full browser: the headless shell lacks
#     WebTransport) and ffmpeg (makes the test clips), with apt-get (as root,
#     or through sudo), when missing;
#   - web/node_modules from web/package-lock.json with `npm ci` (esbuild,
#     uPlot, playwright-core, @moq/watch, @moq/publish; npm's cache kept in
#     ~/.cache/quichub/npm).
# Idempotent; Node.js and npm must be installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v ffmpeg >/dev/null || missing+=(ffmpeg)
if [ ${#missing[@]} -gt 0 ]; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || {
			echo "install-web-tools: need root or sudo for apt-get install ${missing[*]}" >&2
			exit 1
		}
		SUDO="sudo"
	fi
	echo "install-web-tools: apt-get install ${missing[*]}" >&2
	$SUDO apt-get update -qq >/dev/null 2>&1 || true
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

command -v npm >/dev/null || {
	echo "install-web-tools: npm not found (install Node.js 20+ and npm)" >&2
	exit 1
}
cd "$ROOT/web"
npm ci --cache "$HOME/.cache/quichub/npm" --prefer-offline --no-audit --no-fund >/dev/null
