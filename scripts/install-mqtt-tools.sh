#!/usr/bin/env bash
# Installs the third-party MQTT and HTTP/3 clients the gateway tests use:
#   - Debian's mosquitto-clients (mosquitto_pub, mosquitto_sub) and the mosquitto
#     broker (the benchmark's baseline), with apt-get (as root, or through sudo);
#   - paho-mqtt and aioquic from PyPI, pinned, into a virtual environment at
#     $QUICHUB_TOOLS/py (default ~/.cache/quichub/tools/py).
# Idempotent: what is already installed is kept.
set -euo pipefail

TOOLS="${QUICHUB_TOOLS:-$HOME/.cache/quichub/tools}"
PAHO_VERSION="2.1.0"
AIOQUIC_VERSION="1.2.0"

if ! command -v mosquitto_pub >/dev/null || ! command -v mosquitto >/dev/null; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || {
			echo "install-mqtt-tools: need root or sudo for apt-get install mosquitto mosquitto-clients" >&2
			exit 1
		}
		SUDO="sudo"
	fi
	echo "install-mqtt-tools: apt-get install mosquitto mosquitto-clients" >&2
	$SUDO apt-get update -qq >/dev/null 2>&1 || true
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mosquitto mosquitto-clients >/dev/null
fi

PY="$TOOLS/py/bin/python"
if ! "$PY" -c "import paho.mqtt, aioquic" 2>/dev/null ||
	[ "$("$PY" -c 'import paho.mqtt; print(paho.mqtt.__version__)' 2>/dev/null)" != "$PAHO_VERSION" ]; then
	echo "install-mqtt-tools: python venv with paho-mqtt $PAHO_VERSION, aioquic $AIOQUIC_VERSION in $TOOLS/py" >&2
	mkdir -p "$TOOLS"
	python3 -m venv "$TOOLS/py"
	"$TOOLS/py/bin/pip" install -q --disable-pip-version-check \
		"paho-mqtt==$PAHO_VERSION" "aioquic==$AIOQUIC_VERSION"
fi
echo "install-mqtt-tools: mosquitto $(mosquitto -h 2>/dev/null | head -1 | awk '{print $3}'), $("$PY" -c 'import paho.mqtt, aioquic; print("paho-mqtt", paho.mqtt.__version__, "aioquic", aioquic.__version__)')" >&2
