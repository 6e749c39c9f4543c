#!/usr/bin/env bash
# Side by side: quichub's relay and moq-dev's moq-relay (draft-18) under the
# same `quichub bench run`, relay pinned to CPU 0, load generator to CPU 1.
# Prints one table: subscribers, loss, relay CPU per delivered object,
# latency, and the ratio ours/theirs.
#
#   scripts/bench-compare.sh [SUBSCRIBERS_S1] [SUBSCRIBERS_S2]      (defaults 1000 and 200)
#
# Needs moq-relay (scripts/install-moq-dev.sh --with-relay). Slow; not part of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
N1="${1:-1000}"
N2="${2:-200}"
TOOLS="${QUICHUB_TOOLS:-$HOME/.cache/quichub/tools}"
MOQ_RELAY="$TOOLS/bin/moq-relay"
[ -x "$MOQ_RELAY" ] || { echo "moq-relay missing: QUICHUB_TOOLS=$TOOLS scripts/install-moq-dev.sh --with-relay" >&2; exit 1; }
cargo build --release --quiet -p quichub
Q="$PWD/target/release/quichub"
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n 65536 2>/dev/null || true
# One certificate for both relays (moq-relay needs PEM files).
"$Q" relay --help >/dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$WORK/key.pem" \
	-out "$WORK/cert.pem" -days 10 -subj /CN=localhost \
	-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE 2>/dev/null

# Shorter than the draft's 35 s per run, same shape: 5 s start delay, 20 s of data.
for s in scenario1-audio scenario2-audio-video; do
	sed -e 's/^total_transmit_time *=.*/total_transmit_time = 25000/' "profiles/$s.ini" >"$WORK/$s.ini"
done

run() { # relay-name profile subscribers port
	local name="$1" profile="$2" n="$3" port="$4" pid
	case "$name" in
	quichub) QUICHUB_THREADS=1 taskset -c 0 "$Q" relay --bind "127.0.0.1:$port" --metrics off --mqtt off --http off --cert "$WORK/cert.pem" --key "$WORK/key.pem" >"$WORK/$name.log" 2>&1 & ;;
	moq-relay) taskset -c 0 "$MOQ_RELAY" --listen "127.0.0.1:$port" --listen-tls-cert "$WORK/cert.pem" \
		--listen-tls-key "$WORK/key.pem" --auth-public '**' >"$WORK/$name.log" 2>&1 & ;;
	esac
	pid=$!
	sleep 2
	taskset -c 1 "$Q" bench run "$WORK/$profile.ini" --relay "moqt://127.0.0.1:$port/anon" -n "$n" \
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
    return dict(n=d["subscribers"], fail=d["failed_subscriptions"], lost=a["lost_objects"],
                loss=(a["loss_ratio"] or 0) * 100, us=d.get("relay_us_per_object"), cpu=d.get("relay_cpu_pct"),
                p50=a["latency"]["p50_ms"], p99=a["latency"]["p99_ms"], recv=a["received_objects"])
print(f"{'profile':<22} {'relay':<10} {'subs':>5} {'failed':>6} {'lost':>8} {'loss %':>7} {'cpu %':>6} {'us/obj':>7} {'p50 ms':>7} {'p99 ms':>7}")
for profile in ["scenario1-audio", "scenario2-audio-video"]:
    rows = {}
    for name in ["quichub", "moq-relay"]:
        r = load(name, profile)
        rows[name] = r
        if r is None:
            print(f"{profile:<22} {name:<10} (no result)")
            continue
        f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"
        print(f"{profile:<22} {name:<10} {r['n']:>5} {r['fail']:>6} {r['lost']:>8} {f(r['loss'],3):>7} {f(r['cpu'],1):>6} {f(r['us']):>7} {f(r['p50']):>7} {f(r['p99']):>7}")
    q, m = rows.get("quichub"), rows.get("moq-relay")
    if q and m and q["us"] and m["us"]:
        print(f"{profile:<22} {'ours/theirs':<10} cpu per object {q['us']/m['us']:.2f}x")
PY
