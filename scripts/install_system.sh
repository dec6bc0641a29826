#!/usr/bin/env bash
# Debian packages the sandbox and tools use. Installed when we are root and they are
# missing; otherwise we say what is missing and the harness falls back (see env/sandbox.py).
set -u
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v rg    >/dev/null 2>&1 || need+=(ripgrep)
# setpriv + unshare: run as root, the bwrap sandbox drops to uid 65534 with them (env/sandbox.py);
# runuser: `make test-sandbox-user` runs the sandbox tests as a normal user
{ command -v setpriv && command -v unshare && command -v runuser; } >/dev/null 2>&1 || need+=(util-linux)
command -v useradd >/dev/null 2>&1 || need+=(passwd)
# reST sources of the CPython docs: the natural-language share of the code mix (data/build_corpus.py)
[ -d /usr/share/doc/python3.11/html/_sources ] || need+=(python3.11-doc)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages: ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
    || echo "WARNING: apt-get install ${need[*]} failed; the harness will fall back" >&2
else
  echo "WARNING: missing ${need[*]} (not root or no apt-get); the harness will fall back" >&2
fi
exit 0
