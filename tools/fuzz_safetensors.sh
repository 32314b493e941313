#!/usr/bin/env bash
# Fuzzes the safetensors parser for N seconds (default 60): tools/fuzz.sh's
# safetensors target (its header says how, and where crashes go).
#
#   tools/fuzz_safetensors.sh [seconds]
exec "$(dirname "${BASH_SOURCE[0]}")/fuzz.sh" "${1:-60}" safetensors
