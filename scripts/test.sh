#!/usr/bin/env bash
# Runs every test of quichub on a fresh machine: installs the independent MoQT
# implementation used by the interop tests (moq-dev's moq-relay, moq-clock and
# moq-cli's `moq`, from crates.io, into ~/.cache/quichub/tools, built in one
# shared target directory; the longest step the first time, instant
# afterwards), aiomoqt (PyPI) for draft-14 interop, the third-party
# MQTT/HTTP clients (mosquitto from Debian, paho-mqtt and aioquic from
# PyPI), ffmpeg (Debian) for the media
# tests, what the web tests need (Chromium from Debian, web/node_modules
# with npm ci) and etcd (Debian) for the cluster tests, then the whole
# workspace's test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

# Tools are built once per machine and shared by every checkout.
export QUICHUB_TOOLS="${QUICHUB_TOOLS:-$HOME/.cache/quichub/tools}"
./scripts/install-moq-dev.sh --with-relay --with-cli
# aiomoqt (PyPI, in a venv): a draft-14 MoQT implementation for the
# draft-14 interop test.
./scripts/install-aiomoqt.sh
# mosquitto clients and broker (Debian), paho-mqtt and aioquic (PyPI, in a venv).
./scripts/install-mqtt-tools.sh
# ffmpeg and ffprobe (Debian) make and check the media tests' inputs and outputs;
# nginx + libnginx-mod-rtmp (Debian) are the RTMP/HLS server of lab live-video.
./scripts/install-media-tools.sh
# Chromium (Debian), web/node_modules (npm ci): the web tests.
./scripts/install-web-tools.sh
# etcd (Debian's etcd-server): the registry of the cluster tests.
./scripts/install-cluster-tools.sh
# The tools' shared build directory (several GB) is needed only while building them.
rm -rf "$QUICHUB_TOOLS/target"
echo "test.sh: tools ready after $((SECONDS - start)) s" >&2

# The interop test fails (rather than skips) when this is set and a tool is missing.
export QUICHUB_MOQ_DEV_BIN="$QUICHUB_TOOLS/bin"
# The draft-14 interop test likewise fails (rather than skips) without aiomoqt.
export QUICHUB_AIOMOQT_PYTHON="$QUICHUB_TOOLS/aiomoqt/bin/python"
# The MQTT/HTTP tests likewise fail (rather than skip) without their clients.
export QUICHUB_MQTT_PYTHON="$QUICHUB_TOOLS/py/bin/python"
# The media tests likewise fail (rather than skip) without ffmpeg (and lab live-video without nginx-rtmp).
export QUICHUB_MEDIA_TESTS=1
# And the web tests (player and dashboard in headless Chromium, the JS codec's
# unit tests, the committed web/dist against a fresh build).
export QUICHUB_WEB_TESTS=1
# And the cluster tests (relays registered in a real etcd).
export QUICHUB_CLUSTER_TESTS=1

# --no-fail-fast: one failing test binary does not hide the others' results.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log" || status=$?

# The failures, gathered from the whole run (cargo prints each binary's own
# list far up in the output).
echo
echo "test.sh: finished after $((SECONDS - start)) s"
if [ "$status" -ne 0 ]; then
	echo "test.sh: FAILED (cargo test exited with $status)"
	grep -E '^test .* \.\.\. FAILED$|^error: (test failed|[0-9]+ targets? failed)|^    `-p .*`$|^error(\[E[0-9]+\])?: ' "$log" | sed 's/^/  /' || true
	exit "$status"
fi
grep -E '^test result: ' "$log" | awk '{p += $4; f += $6; i += $8} END {printf "test.sh: all passed: %d passed, %d ignored\n", p, i}'
