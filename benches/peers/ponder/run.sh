#!/bin/sh
# Ponder peer of the Keel index benchmark; see run.mjs and benches/README.md.
# Install once: (cd benches/peers/ponder && npm ci)
set -eu
cd "$(dirname "$0")"
exec node run.mjs
