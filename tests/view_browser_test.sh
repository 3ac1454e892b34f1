#!/usr/bin/env bash
# view_browser_test.sh: the live VMU view (GET /) in headless Chromium against
# a djinnd --http of this build with a --token-file: a screenshot under load,
# then, the load done, the DOM after three pushed events (GET
# /v1/djinn/events) checked against `djinn stat` and GET /v1/djinn/stats.
# Skips (77) only when chromium is absent.
# usage: view_browser_test.sh DJINND DJINN SOURCE_DIR [PNG]  (PNG: keep the screenshot there)
set -u
DJINND=$1
DJINN=$2
SRC=$(cd "$3" && pwd)
KEEP=${4:-}
if ! command -v chromium >/dev/null 2>&1; then
    echo "SKIP: chromium is not installed (scripts/setup.sh installs it)"
    exit 77
fi
TMP=$(mktemp -d)
pid=
loaders=()
cleanup() {
    touch "$TMP/go" # a load held by $DJINN_TEST_LOAD_HOLD goes on (and its daemon can stop)
    for l in "${loaders[@]}"; do kill "$l" 2>/dev/null; done
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$TMP/store"
ln -s "$SRC/models/demo" "$TMP/store/demo"
echo "view-token admin" >"$TMP/tokens"
echo "view-token" >"$TMP/token"
"$DJINND" --models "$TMP/store" --listen 127.0.0.1:0 --http 127.0.0.1:0 --token-file "$TMP/tokens" \
    --port-file "$TMP/ports" --threads 1 --vmu-gb 256m >"$TMP/log" 2>&1 &
pid=$!
for _ in $(seq 400); do
    [ -f "$TMP/ports" ] && [ "$(wc -l <"$TMP/ports")" -ge 2 ] && break
    sleep 0.05
done
listen=$(sed -n 1p "$TMP/ports" 2>/dev/null)
port=$(sed -n 2p "$TMP/ports" 2>/dev/null)
[ -n "$port" ] || { cat "$TMP/log" >&2; fail "djinnd did not start"; }
base="http://127.0.0.1:$port"
auth="Authorization: Bearer view-token"

# the page needs no token (it holds no data); the stats and events do
code=$(curl -s -o "$TMP/page" -w '%{http_code} %{content_type}' "$base/")
[[ "$code" == "200 text/html"* ]] || fail "GET / without a token: $code"
grep -q "/v1/djinn/events" "$TMP/page" || fail "the page does not listen to /v1/djinn/events"
for u in /v1/djinn/stats "/v1/djinn/events?count=1"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$base$u")
    [ "$code" = 401 ] || fail "GET $u without the token: $code"
done

# Chromium, one profile per run (ctest -j): what it loads ends by itself
# (#events=N: the page's stream ends after N), so the virtual time budget is
# reached; timeout bounds a stuck browser.
browse() {
    timeout 60 chromium --headless=new --no-sandbox --disable-gpu --no-first-run --disable-extensions \
        --user-data-dir="$TMP/profile" --hide-scrollbars --virtual-time-budget=20000 "$@" 2>>"$TMP/chromium.log"
}

# load: 6 clients (4 interactive, 2 batch), each streaming completions of up
# to 200 tokens one after another until the screenshot is taken (at least
# one each, at most 50)
load() {
    local w=$1 r
    for r in $(seq 50); do
        [ "$r" -gt 1 ] && [ -f "$TMP/shot-done" ] && break
        curl -sN --max-time 120 "$base/v1/completions" -H "$auth" -H "X-Djinn-QoS: $2" -H "Content-Type: application/json" \
            -d "{\"model\": \"demo\", \"prompt\": \"Client $w, round $r: once upon a time\", \"max_tokens\": 200, \"stream\": true, \"seed\": $w$r}" \
            >"$TMP/load.$w.$r" || return 1
    done
}
for w in 1 2 3 4 5 6; do
    if [ "$w" -le 4 ]; then load "$w" interactive & else load "$w" batch & fi
    loaders+=($!)
done
# a screenshot while it runs (what it shows depends on timing: only that it is a picture)
browse --screenshot="$TMP/view.png" --window-size=1000,700 "$base/#token=view-token&events=4" >/dev/null
touch "$TMP/shot-done"
[ "$(head -c 8 "$TMP/view.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
    { tail -20 "$TMP/chromium.log" >&2; fail "no PNG screenshot"; }
[ "$(stat -c %s "$TMP/view.png")" -gt 10000 ] || fail "the screenshot is too small to show anything"
[ -n "$KEEP" ] && cp "$TMP/view.png" "$KEEP"
for l in "${loaders[@]}"; do wait "$l" || fail "a load client failed"; done
loaders=()
for f in "$TMP"/load.*; do grep -q "^data: \[DONE\]" "$f" || fail "a load stream did not finish: $(tail -c 300 "$f")"; done

# the load done, the daemon is still (finished sessions kept for reuse): the
# DOM after three events against djinn stat and GET /v1/djinn/stats, taken
# before and after the page (both the same, or the daemon was not still)
curl -sf "$base/v1/djinn/stats" -H "$auth" >"$TMP/stats0.json" || fail "GET /v1/djinn/stats"
"$DJINN" stat --server "127.0.0.1:$listen" --token-file "$TMP/token" >"$TMP/stat.txt" || fail "djinn stat"
browse --dump-dom "$base/#token=view-token&events=3" >"$TMP/dom.html" || { tail -20 "$TMP/chromium.log" >&2; fail "chromium --dump-dom"; }
curl -sf "$base/v1/djinn/stats" -H "$auth" >"$TMP/stats1.json" || fail "GET /v1/djinn/stats"
/usr/bin/python3 - "$TMP" <<'EOF' || exit 1
import html.parser, json, re, sys
tmp = sys.argv[1]
class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.el, self.text, self.open = {}, {}, []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if 'id' in a:
            self.el[a['id']] = a
            self.text[a['id']] = ''
        self.open.append(a.get('id'))
    def handle_endtag(self, tag):
        if self.open: self.open.pop()
    def handle_data(self, d):
        for i in self.open:
            if i: self.text[i] += d
dom = Dom()
dom.feed(open(f'{tmp}/dom.html').read())
st = json.load(open(f'{tmp}/stats1.json'))
stat = open(f'{tmp}/stat.txt').read()
failed = 0
def check(ok, what):
    global failed
    if not ok:
        failed += 1
        print(f'FAIL: {what}', file=sys.stderr)
def still(o):  # what does not move while the daemon is idle
    return {k: o[k] for k in ('segments', 'pages', 'models')} | {'sessions': [(s['id'], s['pos'], s['kv_bytes']) for s in o['sessions']]}
check(still(json.load(open(f'{tmp}/stats0.json'))) == still(st), 'the daemon changed while the page was open')
check(dom.text.get('events') == '3', f"events received: {dom.text.get('events')!r}, want 3")
check(dom.text.get('err', '') == '', f"error drawn: {dom.text.get('err')}")
# djinn stat: the VMU map's exact bytes, pages, models and sessions
for seg in ('text', 'data', 'stack'):
    m = re.search(rf'^  {seg}\s+capacity .*?\((\d+) B\)\s+used .*?\((\d+) B\)', stat, re.M)
    e = dom.el.get(f'seg-{seg}', {})
    check(m and e.get('data-capacity') == m[1] and e.get('data-used') == m[2],
          f"{seg}: page {e.get('data-capacity')}/{e.get('data-used')}, djinn stat {m and m.groups()}")
    check(int(e.get('data-capacity', -1)) == st['segments'][seg]['capacity'], f'{seg} capacity vs stats')
m = re.search(r'data pages: (\d+) of (\d+) free', stat)
check(m and dom.text.get('pages-total') == m[2] and dom.text.get('pages-used') == str(int(m[2]) - int(m[1])),
      f"pages: page {dom.text.get('pages-used')} of {dom.text.get('pages-total')}, djinn stat {m and m.groups()}")
m = re.search(r'^models \((\d+) served', stat, re.M)
names = re.findall(r'^  (\S+)\s+refs \d+;', stat, re.M)
check(m and dom.text.get('n-models') == m[1] and names and all(f'model-{n}' in dom.el for n in names),
      f"models: page {dom.text.get('n-models')}, djinn stat {names}")
m = re.search(r'^sessions \((\d+)\):', stat, re.M)
ids = re.findall(r'^  ([0-9a-f]{16})  ', stat, re.M)
check(m and int(m[1]) >= 6 and dom.text.get('n-sessions') == m[1] and len(ids) == int(m[1]) and
      all(f'session-{i}' in dom.el for i in ids),
      f"sessions: page {dom.text.get('n-sessions')}, djinn stat {m and m[1]} {ids}")
check(sorted(i for i in dom.el if i.startswith('session-')) == sorted(f"session-{s['id']}" for s in st['sessions']),
      'session rows vs stats')
for q in ('realtime', 'interactive', 'batch'):
    check(f'queue-{q}' in dom.el, f'queue {q} drawn')
# weights read in place (the CPU engine maps the checkpoint): drawn, and as djinn stat says
m = re.search(r'text: \d+ B pinned, (\d+) B mapped in place', stat)
mp = dom.el.get('seg-mapped', {}).get('data-bytes')
check(m and mp == m[1] and int(mp) == st['segments']['text']['mapped'] and int(mp) > 0,
      f"mapped weights: page {mp}, djinn stat {m and m[1]}, stats {st['segments']['text'].get('mapped')}")
# the page map: every cell once, each held by a listed session, the prefix cache or nobody, as the stats say
raw = open(f'{tmp}/dom.html').read()
pm = dom.el.get('page-map', {})
cells = re.findall(r'data-holder="([^"]+)" data-n="(\d+)"', raw)
ids = [s['id'] for s in st['sessions']]
check(pm.get('data-cells') == str(st['page_map']['cells']) and int(pm.get('data-cells', 0)) > 0, f"page map cells {pm}")
check(sum(int(n) for _, n in cells) == st['page_map']['cells'], 'the page map draws every cell once')
want = [(ids[h] if h >= 0 else 'free' if h == -1 else 'prefix', n) for h, n in st['page_map']['runs']]
check([(h, int(n)) for h, n in cells] == want, f'page map runs: page {cells[:6]}..., stats {want[:6]}...')
check(any(h in ids for h, _ in cells), 'no session holds a cell of the page map')
# the charts: one sample an event (rates from the second on)
for c, n in (('chart-tps', '2'), ('chart-queues', '3'), ('chart-swap', '2'), ('chart-mem', '3')):
    check(dom.el.get(c, {}).get('data-points') == n, f"{c}: {dom.el.get(c, {}).get('data-points')} points, want {n}")
print('view_browser_test: ' + (f'{failed} failed' if failed else
      f"ok ({dom.text['n-sessions']} sessions, {dom.text['pages-used']} pages, 3 events)"))
sys.exit(1 if failed else 0)
EOF

# a wrong token: the page says so (EventSource gives up on a 401)
browse --dump-dom "$base/#token=wrong-token&events=1" >"$TMP/dom_wrong.html" || fail "chromium --dump-dom (wrong token)"
grep -q 'id="err">events: refused (a wrong #token=?)' "$TMP/dom_wrong.html" ||
    fail "a wrong token: $(grep -o 'id="err">[^<]*' "$TMP/dom_wrong.html")"
grep -q 'id="events">0<' "$TMP/dom_wrong.html" || fail "a wrong token: events were drawn"

# djinnd stops with an event stream open (the stream ends; nothing leaks under ASan)
curl -sN --max-time 60 "$base/v1/djinn/events" -H "$auth" >"$TMP/held" &
held=$!
loaders+=($held)
for _ in $(seq 200); do grep -q '^data: ' "$TMP/held" && break; sleep 0.05; done
grep -q '^data: ' "$TMP/held" || fail "no event on a held stream"
kill -TERM "$pid"
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$pid" 2>/dev/null && fail "djinnd did not stop within 30 s with an event stream open"
wait "$pid"
rc=$?
pid=
wait "$held"
loaders=()
if [ "$rc" -ne 0 ] || grep -q "Sanitizer\|runtime error" "$TMP/log"; then
    tail -40 "$TMP/log" >&2
    fail "djinnd exited with $rc"
fi
echo "view_browser_test: djinnd stopped cleanly with an event stream open"

# a model load held half way ($DJINN_TEST_LOAD_HOLD): the page draws its bar from the I/O thread's STATS
DJINN_TEST_LOAD_HOLD="$TMP/go" "$DJINND" --models "$TMP/store" --listen 127.0.0.1:0 --http 127.0.0.1:0 --local-admin \
    --port-file "$TMP/ports2" --threads 1 --vmu-gb 256m >"$TMP/log2" 2>&1 &
pid=$!
for _ in $(seq 400); do
    [ -f "$TMP/ports2" ] && [ "$(wc -l <"$TMP/ports2")" -ge 2 ] && break
    sleep 0.05
done
listen=$(sed -n 1p "$TMP/ports2" 2>/dev/null)
port=$(sed -n 2p "$TMP/ports2" 2>/dev/null)
[ -n "$port" ] || { cat "$TMP/log2" >&2; fail "djinnd (held load) did not start"; }
"$DJINN" generate --server "127.0.0.1:$listen" --model demo --tokens 1,2 -n 2 --greedy >"$TMP/gen2" 2>&1 &
gen=$!
loaders+=($gen)
for _ in $(seq 600); do curl -s "http://127.0.0.1:$port/v1/djinn/stats" | grep -q '"busy":"loading"' && break; sleep 0.05; done
curl -s "http://127.0.0.1:$port/v1/djinn/stats" | grep -q '"loading":\[{"name":"demo","bytes_done":[1-9]' ||
    fail "stats during the load: $(curl -s "http://127.0.0.1:$port/v1/djinn/stats" | head -c 300)"
browse --dump-dom "http://127.0.0.1:$port/#events=1" >"$TMP/dom_load.html" || fail "chromium --dump-dom (load)"
grep -q 'id="load-demo" data-done="[1-9][0-9]*" data-total="[1-9][0-9]*"' "$TMP/dom_load.html" ||
    fail "no loading bar: $(grep -o 'id="loading">.\{0,200\}' "$TMP/dom_load.html")"
touch "$TMP/go"
wait "$gen" || fail "the held load's generate failed: $(cat "$TMP/gen2")"
loaders=()
browse --dump-dom "http://127.0.0.1:$port/#events=1" >"$TMP/dom_loaded.html" || fail "chromium --dump-dom (loaded)"
grep -q 'id="load-demo"' "$TMP/dom_loaded.html" && fail "the loading bar stayed after the load"
grep -q 'id="seg-data"' "$TMP/dom_loaded.html" || fail "the page is not drawn after the load"
kill -TERM "$pid"
wait "$pid" || fail "djinnd (held load) exited with $?"
pid=
echo "view_browser_test: a held load drawn as a bar, gone once loaded"
