#!/usr/bin/env bash
# python_package_test.sh: the djinn Python package installs as a user would -
# a wheel built offline (python3 -m build --no-isolation) and `pip install ./python`,
# each into a fresh virtual environment, where `import djinn` gives this version.
# usage: python_package_test.sh REPO_ROOT EXPECTED_VERSION
set -euo pipefail
root=$1
want=$2
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Build from a copy: setuptools writes build/ and *.egg-info beside the sources.
cp -r "$root/python" "$tmp/src"
rm -rf "$tmp/src/tests"

# The numpy and msgpack the package needs come from Debian (no index is reached):
# --system-site-packages, and the import is checked to come from the environment.
check_import() { # VENV
    local got
    got=$("$1/bin/python" -c 'import djinn, sys; print(djinn.__version__, djinn.__file__)')
    case "$got" in
        "$want $1/"*) echo "ok: $got" ;;
        *) echo "FAIL: import djinn in $1 gave '$got', want version $want from inside $1" >&2; exit 1 ;;
    esac
    # the installed package is whole: its client connects lazily, so this needs no daemon
    "$1/bin/python" -c 'import djinn; assert callable(djinn.connect) and djinn.RemoteTensor'
}

echo "== wheel, built offline"
"$py" -m build --no-isolation --wheel --outdir "$tmp/dist" "$tmp/src" >"$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log" >&2; echo "FAIL: python3 -m build --no-isolation" >&2; exit 1; }
whl=$(ls "$tmp"/dist/djinn-"$want"-*.whl 2>/dev/null | head -1 || true)
[ -n "$whl" ] || { ls "$tmp/dist" >&2; echo "FAIL: no djinn-$want wheel" >&2; exit 1; }
"$py" -m venv --system-site-packages "$tmp/venv1"
"$tmp/venv1/bin/pip" install -q --no-index --no-deps "$whl"
check_import "$tmp/venv1"

echo "== pip install ./python"
"$py" -m venv --system-site-packages "$tmp/venv2"
(cd "$tmp" && "$tmp/venv2/bin/pip" install -q --no-index --no-build-isolation ./src)
check_import "$tmp/venv2"
echo "python_package_test: passed"
