#!/usr/bin/env bash
# Relay fan-out benchmark (the scenarios of draft-evens-moq-bench, on this machine): the relay pinned
# to CPU 0, the publisher and subscribers (one process) pinned to CPU 1.
#
#   scripts/bench-fanout.sh [SUBSCRIBERS] [PROFILE] [SECONDS]
#   scripts/bench-fanout.sh 1000 audio 20     # scenario 1: 120-byte datagram every 20 ms
#   scripts/bench-fanout.sh 200 video 20      # scenario 2 video profile on streams
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000}"
PROFILE="${2:-audio}"
SECS="${3:-20}"
PORT="${PORT:-14443}"
cargo build --release --quiet -p quichub -p quichub-bench
BIN=target/release/quichub
BENCH=target/release/quichub-bench
QUICHUB_THREADS=1 taskset -c 0 "$BIN" relay --config contrib/bench-relay.toml --bind "127.0.0.1:$PORT" --metrics off --mqtt off --http off >/tmp/quichub-bench-relay.log 2>&1 &
RELAY=$!
trap 'kill $RELAY 2>/dev/null || true' EXIT
sleep 1
ulimit -n 65536 2>/dev/null || true
taskset -c 1 "$BENCH" fanout --relay "moqt://127.0.0.1:$PORT/bench" --relay-pid "$RELAY" \
	--subscribers "$N" --profile "$PROFILE" --duration "$SECS" --json
