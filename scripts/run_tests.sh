#!/usr/bin/env bash
# Installs the project's Python dependencies and runs the whole test suite.
# This is the README's test command, and CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt
python3 -m pytest tests -q "$@"
