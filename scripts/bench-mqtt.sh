#!/usr/bin/env bash
# MQTT side by side: quichub's broker (`quichub relay --mqtt`) and mosquitto,
# under the same `quichub-bench mqtt` load (100 publishers, 100 subscribers,
# each its own TCP connection), broker pinned to CPU 0, load generator to
# CPU 1. For each topology, QoS and mode the two brokers run back to back.
# Prints one table: delivered msgs/s, p50/p99 publish-to-deliver latency,
# lost, broker CPU (utime+stime from /proc/PID/stat over the publishing
# period), the CPU used by other processes meanwhile (a busy machine skews
# the figures), and the ratio quichub/mosquitto.
#
#   scripts/bench-mqtt.sh
#
# Environment (defaults):
#   DURATION=10      seconds of publishing per run
#   PUBS=100 SUBS=100 PAYLOAD=64 TOPICS=100
#   QOS="0 1"
#   MODES="max rate" max: --rate 0 (as fast as a window of WINDOW message per
#                    publisher in flight end to end allows: saturation);
#                    rate: RATE msgs/s per publisher (latency under load)
#   RATE=10 WINDOW=1
#   TOPOLOGIES=fanout  fanout: every subscriber subscribes bench/# (every
#                    message delivered SUBS times); pairs: subscriber i gets
#                    publisher i's topic only ("fanout pairs" runs both)
#   MQTT_VERSION=3   3 (3.1.1) or 5
#   MOSQUITTO=/usr/sbin/mosquitto
#   JSON_OUT=        file to which the raw JSON lines are appended
#
# Needs mosquitto (2.0; Debian: apt-get install mosquitto) and taskset. Not
# part of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-10}"
PUBS="${PUBS:-100}"
SUBS="${SUBS:-100}"
PAYLOAD="${PAYLOAD:-64}"
TOPICS="${TOPICS:-100}"
QOS="${QOS:-0 1}"
MODES="${MODES:-max rate}"
RATE="${RATE:-10}"
WINDOW="${WINDOW:-1}"
TOPOLOGIES="${TOPOLOGIES:-fanout}"
MQTT_VERSION="${MQTT_VERSION:-3}"
MOSQUITTO="${MOSQUITTO:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}"
[ -x "$MOSQUITTO" ] || { echo "mosquitto missing (apt-get install mosquitto)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "taskset missing (util-linux)" >&2; exit 1; }

cargo build --release --quiet -p quichub -p quichub-bench
Q="$PWD/target/release/quichub"
QB="$PWD/target/release/quichub-bench"
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n 65536 2>/dev/null || true

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_port() { # port
	for _ in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.05
	done
	echo "nothing listening on port $1" >&2
	return 1
}

QH_PORT="$(free_port)"
MQ_PORT="$(free_port)"
# The relay's other listeners off (UDP on an ephemeral port; MQTT over TLS
# only where this build has it); one runtime thread, as mosquitto has one.
TLS_OFF=()
"$Q" relay --help | grep -q -- '--mqtt-tls' && TLS_OFF=(--mqtt-tls off)
QUICHUB_THREADS=1 taskset -c 0 "$Q" relay --bind 127.0.0.1:0 --mqtt "127.0.0.1:$QH_PORT" "${TLS_OFF[@]}" \
	--data-dir off --metrics off --http off >"$WORK/quichub.log" 2>&1 &
QH_PID=$!
cat >"$WORK/mosquitto.conf" <<EOF
listener $MQ_PORT 127.0.0.1
allow_anonymous true
persistence false
log_dest stderr
log_type error
log_type warning
EOF
taskset -c 0 "$MOSQUITTO" -c "$WORK/mosquitto.conf" >"$WORK/mosquitto.log" 2>&1 &
MQ_PID=$!
wait_port "$QH_PORT"
wait_port "$MQ_PORT"
echo "quichub $("$Q" --version | awk '{print $2}') pid $QH_PID port $QH_PORT; $("$MOSQUITTO" -h | head -1) pid $MQ_PID port $MQ_PORT" >&2
echo "$(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

busy_ticks() { # all CPUs, jiffies not idle
	awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat
}

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
for topo in $TOPOLOGIES; do
	for qos in $QOS; do
		for mode in $MODES; do
			for broker in quichub mosquitto; do
				if [ "$broker" = quichub ]; then port=$QH_PORT pid=$QH_PID; else port=$MQ_PORT pid=$MQ_PID; fi
				rate=0
				[ "$mode" = rate ] && rate=$RATE
				topics=$TOPICS extra=()
				[ "$topo" = pairs ] && topics=$PUBS extra=(--pairs)
				echo "== $broker $topo qos $qos $mode" >&2
				b0=$(busy_ticks)
				taskset -c 1 "$QB" mqtt --broker "127.0.0.1:$port" --broker-pid "$pid" --label "$broker" \
					--publishers "$PUBS" --subscribers "$SUBS" --qos "$qos" --rate "$rate" --window "$WINDOW" \
					--duration "$DURATION" --payload "$PAYLOAD" --topics "$topics" --mqtt-version "$MQTT_VERSION" \
					"${extra[@]}" --json >"$WORK/run.out"
				b1=$(busy_ticks)
				cat "$WORK/run.out" >&2
				tail -1 "$WORK/run.out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
r["topology"], r["mode"], r["busy_ticks"] = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(json.dumps(r))' "$topo" "$mode" "$((b1 - b0))" >>"$RESULTS"
				[ -z "${JSON_OUT:-}" ] || tail -1 "$RESULTS" >>"$JSON_OUT"
				kill -0 "$pid" 2>/dev/null || { echo "$broker died; log:" >&2; cat "$WORK/$broker.log" >&2; exit 1; }
			done
		done
	done
done
if [ -s "$WORK/mosquitto.log" ] || grep -qiE 'warn|error' "$WORK/quichub.log"; then
	echo "-- broker logs (warnings/errors):" >&2
	grep -iE 'warn|error' "$WORK/quichub.log" | tail -5 >&2 || true
	tail -5 "$WORK/mosquitto.log" >&2 || true
fi

TCK="$(getconf CLK_TCK)"
python3 - "$RESULTS" "$TCK" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tck = float(sys.argv[2])
by = {(r["topology"], r["qos"], r["mode"], r["label"]): r for r in rows}
hdr = ("broker", "topology", "qos", "load", "publish/s", "delivered/s", "p50 ms", "p99 ms", "max ms",
       "lost", "dup", "broker CPU", "gen CPU", "other CPU", "ratio q/m msgs/s", "ratio q/m p99")
out = [hdr]
for r in rows:
    load = "max" if r["mode"] == "max" else f'{r["rate_per_publisher"]:g}/s/pub'
    # CPU of everything else on the machine during the run (other builds...).
    total = 100.0 * r["busy_ticks"] / tck / r["duration_s"]
    other = max(0.0, total - (r["broker_cpu_pct"] or 0) - r["generator_cpu_pct"])
    ratio_rate = ratio_p99 = ""
    m = by.get((r["topology"], r["qos"], r["mode"], "mosquitto"))
    if r["label"] == "quichub" and m:
        ratio_rate = f'{r["delivered_per_s"] / max(m["delivered_per_s"], 1e-9):.2f}'
        ratio_p99 = f'{r["latency_us_p99"] / max(m["latency_us_p99"], 1e-9):.2f}'
    out.append((r["label"], f'{r["topology"]} x{r["fanout"]}', str(r["qos"]), load,
                f'{r["publish_per_s"]:.0f}', f'{r["delivered_per_s"]:.0f}',
                f'{r["latency_us_p50"] / 1000:.2f}', f'{r["latency_us_p99"] / 1000:.2f}',
                f'{r["latency_us_max"] / 1000:.1f}', str(r["lost"]), str(r["duplicates"]),
                f'{r["broker_cpu_pct"]:.0f}%', f'{r["generator_cpu_pct"]:.0f}%', f'{other:.0f}%',
                ratio_rate, ratio_p99))
w = [max(len(row[i]) for row in out) for i in range(len(hdr))]
for row in out:
    print("  ".join(c.rjust(w[i]) if i > 1 else c.ljust(w[i]) for i, c in enumerate(row)).rstrip())
EOF
