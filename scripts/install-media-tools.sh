#!/usr/bin/env bash
# Installs what the media tests use: Debian's ffmpeg (ffmpeg and ffprobe, which
# make the test inputs and check the outputs), with apt-get (as root, or through
# sudo). About half a minute the first time; nothing when already installed.
set -euo pipefail

if ! command -v ffmpeg >/dev/null || ! command -v ffprobe >/dev/null; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || {
			echo "install-media-tools: need root or sudo for apt-get install ffmpeg" >&2
			exit 1
		}
		SUDO="sudo"
	fi
	echo "install-media-tools: apt-get install ffmpeg" >&2
	$SUDO apt-get update -qq >/dev/null 2>&1 || true
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq ffmpeg >/dev/null
fi
echo "media tools: $(ffmpeg -version | head -n1)"
