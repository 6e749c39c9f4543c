#!/usr/bin/env bash
# What MoQT authentication costs the relay per object: the fan-out load of
# scripts/bench-fanout.sh (one publisher, N subscribers, each its own QUIC
# connection) against `quichub relay` without auth and with `--auth-key` (an
# ES256 key; the publisher and every subscriber send a JWT as `?jwt=`), runs
# alternating, ROUNDS of each. Prints the relay's CPU per delivered object
# (its process CPU time from /proc/PID/stat) for both and the difference.
# The relay is pinned to CPU 0, the load generator to CPU 1.
#
#   scripts/bench-auth.sh [SUBSCRIBERS] [PROFILE] [SECONDS]
#   scripts/bench-auth.sh 1000 audio 20       # the issue's figure
#   ROUNDS=3 scripts/bench-auth.sh 200 audio 10
#
# QUICHUB_BIN=path skips the release build and uses that binary, and the
# quichub-bench beside it (or QUICHUB_BENCH_BIN=path).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000}"
PROFILE="${2:-audio}"
SECS="${3:-20}"
ROUNDS="${ROUNDS:-2}"
PORT="${PORT:-14443}"
if [ -z "${QUICHUB_BIN:-}" ]; then
	cargo build --release --quiet -p quichub -p quichub-bench
	QUICHUB_BIN="${CARGO_TARGET_DIR:-target}/release/quichub"
fi
BIN="$QUICHUB_BIN"
BENCH="${QUICHUB_BENCH_BIN:-$(dirname "$BIN")/quichub-bench}"
DIR="$(mktemp -d)"
RELAY=""
cleanup() {
	if [ -n "$RELAY" ]; then kill "$RELAY" 2>/dev/null || true; fi
	rm -rf "$DIR"
}
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || true

"$BIN" token generate-key --algorithm ES256 --out "$DIR/bench.jwk" 2>/dev/null
TOKEN="$("$BIN" token sign --key "$DIR/bench.jwk" --root bench --put "" --get "" --expires 1d)"

# run LABEL [RELAY FLAGS...]: one measurement; appends "LABEL us_per_object loss_pct" to $DIR/results.
run() {
	local label="$1"
	shift
	QUICHUB_THREADS=1 taskset -c 0 "$BIN" relay --config contrib/bench-relay.toml --bind "127.0.0.1:$PORT" --metrics off --mqtt off \
		--http off --data-dir off "$@" >"$DIR/relay-$label.log" 2>&1 &
	RELAY=$!
	sleep 1
	local jwt=()
	# The relay on loopback is ours: its certificate is not pinned.
	if [ "$label" = auth ]; then jwt=(--jwt "$TOKEN" --insecure); fi
	taskset -c 1 "$BENCH" fanout --relay "moqt://127.0.0.1:$PORT/bench" --relay-pid "$RELAY" \
		--subscribers "$N" --profile "$PROFILE" --duration "$SECS" "${jwt[@]}" --json >"$DIR/out.json"
	kill "$RELAY" 2>/dev/null || true
	wait "$RELAY" 2>/dev/null || true
	RELAY=""
	python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r["relay_us_per_object"], r["loss_pct"], r["received"])' \
		"$DIR/out.json" "$label" | tee -a "$DIR/results"
}

echo "subscribers $N profile $PROFILE ${SECS}s, $ROUNDS rounds each (label us_per_object loss_pct received)"
for _ in $(seq "$ROUNDS"); do
	run off
	run auth --auth-key "$DIR/bench.pub.jwk"
done
python3 - "$DIR/results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {k: statistics.median(float(r[1]) for r in rows if r[0] == k) for k in ("off", "auth")}
print(f"relay CPU per delivered object (median): auth off {med['off']:.3f} us, "
      f"auth on {med['auth']:.3f} us, difference {100 * (med['auth'] / med['off'] - 1):+.1f}%")
EOF
