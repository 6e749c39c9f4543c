#!/usr/bin/env bash
# Real video through a relay: one 720p 30 fps H.264 broadcast at 8 Mbit/s (the
# rate Estupiñan-Cuesta et al. used), made here by ffmpeg, published in real time
# as hang objects (one group per GOP) to N subscribers; quichub's relay and
# moq-dev's moq-relay in the same run, each pinned to CPU 0, the load generator
# to CPU 1. Prints one table: relay CPU per delivered Mbit, egress one core
# carries at 95% busy, loss, send-to-receive latency, and the ratio.
#
#   scripts/bench-media.sh [SUBSCRIBER COUNTS...]     (default: 1 100 500)
#
# Needs ffmpeg (scripts/install-media-tools.sh) and moq-relay
# (scripts/install-moq-dev.sh --with-relay). Slow; not part of the tests.
# Environment: QUICHUB_BIN (prebuilt binary; quichub-bench beside it, or
# QUICHUB_BENCH_BIN), MOQ_RELAY, QUICHUB_TOOLS, SECS
# (measured seconds per run, default 20), RELAY_CPU, LOADGEN_CPUS, BENCH_KEEP (a
# directory that keeps the input, logs and JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNTS=("${@:-1 100 500}")
[ $# -eq 0 ] && COUNTS=(1 100 500)
SECS="${SECS:-20}"
TOOLS="${QUICHUB_TOOLS:-$HOME/.cache/quichub/tools}"
MOQ_RELAY="${MOQ_RELAY:-$TOOLS/bin/moq-relay}"
RELAY_CPU="${RELAY_CPU:-0}"
LOADGEN_CPUS="${LOADGEN_CPUS:-1}"
command -v ffmpeg >/dev/null || { echo "ffmpeg missing: scripts/install-media-tools.sh" >&2; exit 1; }
if [ -n "${QUICHUB_BIN:-}" ]; then
	Q="$(realpath "$QUICHUB_BIN")"
	QB="$(realpath "${QUICHUB_BENCH_BIN:-$(dirname "$Q")/quichub-bench}")"
else
	cargo build --release --quiet -p quichub -p quichub-bench
	Q="$PWD/target/release/quichub"
	QB="$PWD/target/release/quichub-bench"
fi
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${BENCH_KEEP:-}" ] && mkdir -p "$BENCH_KEEP" && cp -r "$WORK"/. "$BENCH_KEEP"/; rm -rf "$WORK"' EXIT
ulimit -n 65536 2>/dev/null || true

# 10 s of 720p30 at 8 Mbit/s CBR-ish, GOP 2 s, looped by the benchmark.
INPUT="$WORK/720p-8M.mp4"
echo "making $INPUT with ffmpeg" >&2
ffmpeg -hide_banner -loglevel error -f lavfi -i testsrc2=size=1280x720:rate=30 -t 10 \
	-c:v libx264 -preset veryfast -tune zerolatency -b:v 8M -minrate 8M -maxrate 8M -bufsize 4M \
	-x264-params nal-hrd=cbr -g 60 -pix_fmt yuv420p \
	-f mp4 -movflags cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame "$INPUT"

run() { # relay-name subscribers port
	local name="$1" n="$2" port="$3" pid
	case "$name" in
	quichub) QUICHUB_THREADS=1 taskset -c "$RELAY_CPU" "$Q" relay --bind "127.0.0.1:$port" --metrics off --mqtt off --http off --data-dir "$WORK/data" >"$WORK/$name-$n.log" 2>&1 & ;;
	moq-relay) taskset -c "$RELAY_CPU" "$MOQ_RELAY" --listen "127.0.0.1:$port" --listen-tls-generate localhost --auth-public '**' >"$WORK/$name-$n.log" 2>&1 & ;;
	esac
	pid=$!
	sleep 2
	taskset -c "$LOADGEN_CPUS" "$QB" media --relay "moqt://127.0.0.1:$port/anon" --relay-pid "$pid" \
		--subscribers "$n" --input "$INPUT" --duration "$SECS" --json >"$WORK/$name-$n.json" 2>"$WORK/$name-$n.txt" || true
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	sleep 1
}

relays=(quichub)
if [ -x "$MOQ_RELAY" ]; then relays+=(moq-relay); else echo "moq-relay missing ($MOQ_RELAY): quichub only" >&2; fi
for n in "${COUNTS[@]}"; do
	for r in "${relays[@]}"; do
		run "$r" "$n" $((15500 + ${#r}))
	done
done

python3 - "$WORK" "${COUNTS[@]}" <<'PY'
import json, os, sys
w, counts = sys.argv[1], sys.argv[2:]
def load(name, n):
    p = os.path.join(w, f"{name}-{n}.json")
    try:
        return json.load(open(p))
    except Exception:
        return None
f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"
print(f"{'relay':<10} {'subs':>5} {'loss %':>7} {'egress Mbit/s':>13} {'cpu %':>6} {'ms/Mbit':>8} {'Gbit/s @95%':>11} {'p50 ms':>7} {'p99 ms':>7}")
for n in counts:
    rows = {}
    for name in ["quichub", "moq-relay"]:
        r = rows[name] = load(name, n)
        if r is None:
            continue
        print(f"{name:<10} {r['subscribers']:>5} {f(r['loss_pct'],3):>7} {f(r['egress_mbps'],1):>13} {f(r['relay_cpu_pct'],1):>6} {f(r['relay_ms_per_mbit'],3):>8} {f(r['egress_gbps_at_95pct_core']):>11} {f(r['latency_p50_ms']):>7} {f(r['latency_p99_ms']):>7}")
    q, m = rows.get("quichub"), rows.get("moq-relay")
    if q and m and q.get("relay_ms_per_mbit") and m.get("relay_ms_per_mbit"):
        print(f"{'ratio':<10} {n:>5} moq-relay/quichub cpu per Mbit {m['relay_ms_per_mbit']/q['relay_ms_per_mbit']:.2f}x")
PY
