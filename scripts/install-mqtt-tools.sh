#!/usr/bin/env bash
# Installs the third-party MQTT and HTTP/3 clients the gateway tests use:
#   - Debian's mosquitto-clients (mosquitto_pub, mosquitto_sub), curl (the HTTP
#     API tests, HTTP/1.1 and HTTP/2), the mosquitto broker (the benchmark's
#     baseline; its mosquitto_passwd writes the auth tests' password files) and
#     openssl (the certificate tests' CA and client certificates), with apt-get
#     (as root, or through sudo);
#   - paho-mqtt, aioquic and PyJWT (an independent JWT implementation for the
#     auth tests) from PyPI, pinned, into a virtual environment at
#     $QUICHUB_TOOLS/py (default ~/.cache/quichub/tools/py);
#   - two MQTT-over-QUIC clients from crates.io, pinned, into $QUICHUB_TOOLS/bin:
#     `mqttv5` (crate mqttv5-cli: single-stream mode over quics://) and
#     `mqtt-quic-probe` (tools/mqtt-quic-probe: a command line around EMQX's
#     SDK flowsdk, for EMQX's multi-stream mode); several minutes on 2 cores
#     the first time. QUICHUB_SKIP_MQTT_QUIC=1 skips them (their tests then skip,
#     or fail where QUICHUB_MQTT_PYTHON is set, as in scripts/test.sh).
# Idempotent: what is already installed is kept.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${QUICHUB_TOOLS:-$HOME/.cache/quichub/tools}"
PAHO_VERSION="2.1.0"
AIOQUIC_VERSION="1.2.0"
PYJWT_VERSION="2.10.1"

if ! command -v mosquitto_pub >/dev/null || ! command -v mosquitto >/dev/null || ! command -v mosquitto_passwd >/dev/null || ! command -v curl >/dev/null || ! command -v openssl >/dev/null; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || {
			echo "install-mqtt-tools: need root or sudo for apt-get install mosquitto mosquitto-clients curl openssl" >&2
			exit 1
		}
		SUDO="sudo"
	fi
	echo "install-mqtt-tools: apt-get install mosquitto mosquitto-clients curl openssl" >&2
	$SUDO apt-get update -qq >/dev/null 2>&1 || true
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mosquitto mosquitto-clients curl openssl >/dev/null
fi

PY="$TOOLS/py/bin/python"
if ! "$PY" -c "import paho.mqtt, aioquic, jwt" 2>/dev/null ||
	[ "$("$PY" -c 'import paho.mqtt; print(paho.mqtt.__version__)' 2>/dev/null)" != "$PAHO_VERSION" ]; then
	echo "install-mqtt-tools: python venv with paho-mqtt $PAHO_VERSION, aioquic $AIOQUIC_VERSION, PyJWT $PYJWT_VERSION in $TOOLS/py" >&2
	mkdir -p "$TOOLS"
	python3 -m venv "$TOOLS/py"
	"$TOOLS/py/bin/pip" install -q --disable-pip-version-check \
		"paho-mqtt==$PAHO_VERSION" "aioquic==$AIOQUIC_VERSION" "PyJWT==$PYJWT_VERSION"
fi
echo "install-mqtt-tools: mosquitto $(mosquitto -h 2>/dev/null | head -1 | awk '{print $3}'), $("$PY" -c 'import paho.mqtt, aioquic; import jwt; print("paho-mqtt", paho.mqtt.__version__, "aioquic", aioquic.__version__, "PyJWT", jwt.__version__)')" >&2

# --- MQTT over QUIC clients (crates.io) ---
MQTTV5_CLI_VERSION="0.29.10"
# mqttv5-cli 0.29.10's Cargo.lock pins webpki-roots 1.0.11, which the crates.io
# index reachable here may not have; fall back to its lock with 1.0.10.
MQTTV5_WEBPKI_ROOTS_FALLBACK="1.0.10"
BIN="$TOOLS/bin"

install_mqttv5() {
	if [ "$("$BIN/mqttv5" --version 2>/dev/null | awk '{print $2}')" = "$MQTTV5_CLI_VERSION" ]; then
		return
	fi
	echo "install-mqtt-tools: mqttv5-cli $MQTTV5_CLI_VERSION into $BIN (about 6 min on 2 cores)" >&2
	if cargo install --locked --force --quiet --root "$TOOLS" "mqttv5-cli@$MQTTV5_CLI_VERSION"; then
		return
	fi
	echo "install-mqtt-tools: --locked install failed; building from the crate's lockfile with webpki-roots $MQTTV5_WEBPKI_ROOTS_FALLBACK" >&2
	local tmp src dest="$TOOLS/src/mqttv5-cli-$MQTTV5_CLI_VERSION"
	tmp="$(mktemp -d)"
	mkdir -p "$tmp/src"
	# A throwaway manifest makes cargo download and unpack the exact crate version.
	printf '[package]\nname = "fetch-mqttv5-cli"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\nmqttv5-cli = "=%s"\n' \
		"$MQTTV5_CLI_VERSION" >"$tmp/Cargo.toml"
	: >"$tmp/src/lib.rs"
	(cd "$tmp" && cargo fetch --quiet)
	rm -rf "$tmp"
	src="$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "mqttv5-cli-$MQTTV5_CLI_VERSION" | head -n1)"
	[ -n "$src" ] || {
		echo "install-mqtt-tools: mqttv5-cli-$MQTTV5_CLI_VERSION source not found after cargo fetch" >&2
		return 1
	}
	mkdir -p "$TOOLS/src"
	rm -rf "$dest"
	cp -r "$src" "$dest"
	(cd "$dest" && cargo update --quiet -p webpki-roots --precise "$MQTTV5_WEBPKI_ROOTS_FALLBACK")
	cargo install --locked --force --quiet --root "$TOOLS" --path "$dest"
}

# tools/mqtt-quic-probe: rebuilt when its sources change.
install_probe() {
	local dir="$ROOT/tools/mqtt-quic-probe" stamp="$BIN/.mqtt-quic-probe.sha256" want
	want="$(cat "$dir/Cargo.toml" "$dir/Cargo.lock" "$dir/src/main.rs" | sha256sum | awk '{print $1}')"
	if [ -x "$BIN/mqtt-quic-probe" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
		return
	fi
	echo "install-mqtt-tools: mqtt-quic-probe (on flowsdk) into $BIN (about 2 min on 2 cores)" >&2
	cargo install --locked --force --quiet --root "$TOOLS" \
		--path "$dir"
	echo "$want" >"$stamp"
}

if [ "${QUICHUB_SKIP_MQTT_QUIC:-0}" != 1 ]; then
	command -v cargo >/dev/null || {
		echo "install-mqtt-tools: cargo not found (needed for the MQTT-over-QUIC clients)" >&2
		exit 1
	}
	mkdir -p "$BIN"
	# The target directory install-moq-dev.sh builds in: these clients share
	# tokio, quinn, rustls and ring with moq-dev's tools.
	export CARGO_TARGET_DIR="${QUICHUB_TOOLS_TARGET:-$TOOLS/target/shared}"
	install_mqttv5
	install_probe
	echo "install-mqtt-tools: $("$BIN/mqttv5" --version), $("$BIN/mqtt-quic-probe" --version-info)" >&2
fi
