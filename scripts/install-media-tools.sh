#!/usr/bin/env bash
# Installs what the media tests use: Debian's ffmpeg (ffmpeg and ffprobe, which
# make the test inputs and check the outputs), and nginx with its RTMP module
# (libnginx-mod-rtmp: the RTMP ingest + HLS server `quichub-lab live-video`
# compares MoQ with), with apt-get (as root, or through sudo). About half a
# minute the first time; nothing when already installed. The lab runs its own
# nginx (its own configuration, ports and temporary directory); a service the
# package may start (in a container policy-rc.d usually denies it) is not used.
set -euo pipefail

RTMP_MODULE=/usr/lib/nginx/modules/ngx_rtmp_module.so
PKGS=()
if ! command -v ffmpeg >/dev/null || ! command -v ffprobe >/dev/null; then
	PKGS+=(ffmpeg)
fi
if [ ! -x /usr/sbin/nginx ] || [ ! -f "$RTMP_MODULE" ]; then
	PKGS+=(nginx libnginx-mod-rtmp)
fi
if [ "${#PKGS[@]}" -gt 0 ]; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || {
			echo "install-media-tools: need root or sudo for apt-get install ${PKGS[*]}" >&2
			exit 1
		}
		SUDO="sudo"
	fi
	echo "install-media-tools: apt-get install ${PKGS[*]}" >&2
	$SUDO apt-get update -qq >/dev/null 2>&1 || true
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${PKGS[@]}" >/dev/null
fi
echo "media tools: $(ffmpeg -version | head -n1); $(/usr/sbin/nginx -v 2>&1) with $RTMP_MODULE"
