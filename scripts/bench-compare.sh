#!/usr/bin/env bash
# Side by side: quichub's relay and moq-dev's moq-relay (draft-18) under the
# same `quichub-bench run`, relay pinned to CPU 0, load generator to CPU 1
# (RELAY_CPU and LOADGEN_CPUS change that; see below).
# Prints one table: subscribers, loss, relay CPU per delivered object,
# latency, and the ratio ours/theirs.
#
#   scripts/bench-compare.sh [SUBSCRIBERS_S1] [SUBSCRIBERS_S2]      (defaults 1000 and 200)
#
# Needs moq-relay (scripts/install-moq-dev.sh --with-relay). Slow; not part of the tests.
#
# Environment (all optional; the defaults are the behaviour described above):
#   QUICHUB_BIN=PATH    prebuilt quichub binary; skips `cargo build`
#   QUICHUB_BENCH_BIN=PATH  prebuilt quichub-bench (default: beside QUICHUB_BIN;
#                       a quichub from before the split has none: its own
#                       `quichub bench` is used, to compare older commits)
#   MOQ_RELAY=PATH      moq-relay binary (default $QUICHUB_TOOLS/bin/moq-relay)
#   QUICHUB_TOOLS=DIR   tools folder (default ~/.cache/quichub/tools)
#   RELAY_CPU=LIST      taskset CPU list for the relay (default 0)
#   LOADGEN_CPUS=LIST   taskset CPU list for the load generator (default 1), e.g. 1-15
#   CERT_DIR=DIR        use DIR/cert.pem and DIR/key.pem instead of making them with openssl
#   BENCH_KEEP=DIR      copy the profiles, relay logs, bench output and JSON reports here
#   MOQ_RELAY_TLS=generate|files  generate (default): moq-relay makes its own certificate
#                       (--listen-tls-generate localhost); files: it loads cert.pem/key.pem.
#                       moq-relay 0.17.10 hot-reloads PEM files in a loop (its reads wake its
#                       own file watcher): about one core busy while idle, which would count in
#                       its CPU per object, so the fair comparison is the default.
set -euo pipefail
cd "$(dirname "$0")/.."
N1="${1:-1000}"
N2="${2:-200}"
TOOLS="${QUICHUB_TOOLS:-$HOME/.cache/quichub/tools}"
MOQ_RELAY="${MOQ_RELAY:-$TOOLS/bin/moq-relay}"
RELAY_CPU="${RELAY_CPU:-0}"
LOADGEN_CPUS="${LOADGEN_CPUS:-1}"
[ -x "$MOQ_RELAY" ] || { echo "moq-relay missing: QUICHUB_TOOLS=$TOOLS scripts/install-moq-dev.sh --with-relay" >&2; exit 1; }
if [ -n "${QUICHUB_BIN:-}" ]; then
	Q="$(realpath "$QUICHUB_BIN")"
	[ -x "$Q" ] || { echo "QUICHUB_BIN=$QUICHUB_BIN is not an executable" >&2; exit 1; }
	QB="${QUICHUB_BENCH_BIN:-$(dirname "$Q")/quichub-bench}"
	if [ -x "$QB" ]; then BENCH=("$(realpath "$QB")"); else BENCH=("$Q" bench); fi
else
	cargo build --release --quiet -p quichub -p quichub-bench
	Q="$PWD/target/release/quichub"
	BENCH=("$PWD/target/release/quichub-bench")
fi
WORK="$(mktemp -d)"
keep() {
	if [ -n "${BENCH_KEEP:-}" ]; then
		mkdir -p "$BENCH_KEEP" && cp -r "$WORK"/. "$BENCH_KEEP"/ 2>/dev/null || true
	fi
}
trap 'kill $(jobs -p) 2>/dev/null || true; keep; rm -rf "$WORK"' EXIT
ulimit -n 65536 2>/dev/null || true
# One certificate for both relays (moq-relay needs PEM files).
"$Q" relay --help >/dev/null
if [ -n "${CERT_DIR:-}" ]; then
	cp "$CERT_DIR/cert.pem" "$CERT_DIR/key.pem" "$WORK/"
else
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$WORK/key.pem" \
		-out "$WORK/cert.pem" -days 10 -subj /CN=localhost \
		-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE 2>/dev/null
fi


run() { # relay-name profile subscribers port
	local name="$1" profile="$2" n="$3" port="$4" pid
	case "$name" in
	quichub) QUICHUB_THREADS=1 taskset -c "$RELAY_CPU" "$Q" relay --bind "127.0.0.1:$port" --metrics off --mqtt off --http off --cert "$WORK/cert.pem" --key "$WORK/key.pem" >"$WORK/$name.log" 2>&1 & ;;
	moq-relay)
		if [ "${MOQ_RELAY_TLS:-generate}" = generate ]; then
			set -- --listen-tls-generate localhost
		else
			set -- --listen-tls-cert "$WORK/cert.pem" --listen-tls-key "$WORK/key.pem"
		fi
		taskset -c "$RELAY_CPU" "$MOQ_RELAY" --listen "127.0.0.1:$port" "$@" --auth-public '**' >"$WORK/$name.log" 2>&1 &
		;;
	esac
	pid=$!
	sleep 2
	# Shorter than the draft's 35 s per run, same shape: 5 s start delay, 20 s of data.
	taskset -c "$LOADGEN_CPUS" "${BENCH[@]}" run "profiles/$profile.ini" --duration 25 --relay "moqt://127.0.0.1:$port/anon" -n "$n" \
		--relay-pid "$pid" --quiet --json "$WORK/$name-$profile.json" >"$WORK/$name-$profile.txt" 2>&1 || true
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	sleep 1
}

for profile in scenario1-audio scenario2-audio-video; do
	n=$N1
	[ "$profile" = scenario2-audio-video ] && n=$N2
	run quichub "$profile" "$n" 15443
	run moq-relay "$profile" "$n" 15444
done

python3 - "$WORK" <<'PY'
import json, sys, os
w = sys.argv[1]
def load(name, profile):
    p = os.path.join(w, f"{name}-{profile}.json")
    if not os.path.exists(p):
        return None
    d = json.load(open(p))
    a = d["report"]["aggregates"][-1]
    return dict(n=d["subscribers"], fail=d["failed_subscriptions"], tfail=a["failed"], tinc=a["incomplete"], lost=a["lost_objects"],
                loss=(a["loss_ratio"] or 0) * 100, us=d.get("relay_us_per_object"), cpu=d.get("relay_cpu_pct"),
                p50=a["latency"]["p50_ms"], p99=a["latency"]["p99_ms"], recv=a["received_objects"])
# failed: subscriptions that failed; trk f/i: tracks failed (e.g. DATA before START) / incomplete.
print(f"{'profile':<22} {'relay':<10} {'subs':>5} {'failed':>6} {'trk f/i':>9} {'lost':>8} {'loss %':>7} {'cpu %':>6} {'us/obj':>7} {'p50 ms':>7} {'p99 ms':>7}")
for profile in ["scenario1-audio", "scenario2-audio-video"]:
    rows = {}
    for name in ["quichub", "moq-relay"]:
        r = load(name, profile)
        rows[name] = r
        if r is None:
            print(f"{profile:<22} {name:<10} (no result)")
            continue
        f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"
        print(f"{profile:<22} {name:<10} {r['n']:>5} {r['fail']:>6} {str(r['tfail']) + '/' + str(r['tinc']):>9} {r['lost']:>8} {f(r['loss'],3):>7} {f(r['cpu'],1):>6} {f(r['us']):>7} {f(r['p50']):>7} {f(r['p99']):>7}")
    q, m = rows.get("quichub"), rows.get("moq-relay")
    if q and m and q["us"] and m["us"]:
        print(f"{profile:<22} {'ours/theirs':<10} cpu per object {q['us']/m['us']:.2f}x")
PY
