#!/usr/bin/env bash
# The sandbox's tests again as an unprivileged user (`make test` runs this after the suite, as root).
# env/sandbox.py promises different things to root and to a normal user, so both are tested.
#
# The user gets its own copy of what those tests need, in a temporary directory it owns: the checkout
# and the venv may sit where it cannot read them (a clone under /root, a pyenv interpreter), as in CI.
# It runs the system Python of the venv's version; pytest and its requirements (pure Python) are copied
# from the venv. Nothing is written into the checkout.
#   bash scripts/test_sandbox_user.sh [PY] [USER]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
TEST_USER=${2:-nanotest}
TESTS=(tests/test_sandbox.py tests/test_sandbox_attacks.py)

if [ "$(id -u)" != 0 ]; then
  echo "test_sandbox_user: not root, so the main suite already ran the sandbox tests as a normal user"
  exit 0
fi
id -u "$TEST_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$TEST_USER"
version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
user_py=$(command -v "/usr/bin/python$version" || true)
[ -n "$user_py" ] || { echo "test_sandbox_user: no /usr/bin/python$version for $TEST_USER to run" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/tests" "$tmp/src/data" "$tmp/site" "$tmp/home"
cp -r env pyproject.toml README.md "$tmp/src/"
cp data/__init__.py data/build_samples.py "$tmp/src/data/"  # tests/conftest.py imports it
cp tests/conftest.py "${TESTS[@]}" "$tmp/src/tests/"
"$PY" - "$tmp/site" <<'EOF'
"""Copy pytest and everything it requires (transitively) from this interpreter's site-packages."""
import importlib.metadata as md
import shutil
import sys
from pathlib import Path

from packaging.requirements import Requirement  # pytest requires packaging: it is in the venv

target, todo, done = Path(sys.argv[1]), ["pytest"], set()
while todo:
    name = todo.pop()
    if name in done:
        continue
    done.add(name)
    dist = md.distribution(name)
    for file in dist.files or []:
        source = Path(dist.locate_file(file))
        if source.is_file() and "__pycache__" not in file.parts and ".." not in file.parts:
            (target / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / file)
    for requirement in map(Requirement, dist.requires or []):
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            todo.append(requirement.name)
EOF
chown -R "$TEST_USER" "$tmp"
chmod 700 "$tmp"
echo "running ${TESTS[*]} as $TEST_USER with $user_py"
cd "$tmp/src"
runuser -u "$TEST_USER" -- env HOME="$tmp/home" TMPDIR="$tmp/home" PYTHONPATH="$tmp/site" \
  PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
  "$user_py" -m pytest -q -p no:cacheprovider -rs --basetemp="$tmp/home/pytest" "${TESTS[@]}"
