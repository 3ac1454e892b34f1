// view_check.mjs: runs the live view's script (GET /) under Node with a stub
// DOM against a running djinnd --http, for one poll, and checks what it drew
// against GET /v1/djinn/stats. usage: node view_check.mjs PORT TOKEN
const [port, token] = process.argv.slice(2);
const base = `http://127.0.0.1:${port}`;
let failed = 0;
const check = (ok, what) => { if (!ok) { failed++; console.error(`FAIL: ${what}`); } };
const page = await fetch(`${base}/`);
const html = await page.text();
check(page.status === 200 && page.headers.get('content-type').startsWith('text/html'), 'GET / without a token: the page');
check((await fetch(`${base}/v1/djinn/stats`)).status === 401, 'GET /v1/djinn/stats without the token: 401');
const js = html.split('<script>')[1].split('</script>')[0];
const els = {};
const document = { getElementById: id => (els[id] ??= { innerHTML: '', textContent: '' }) };
const location = { hash: `#token=${token}` };
let done;
const drawn = new Promise(r => { done = r; });
const later = (fn, ms) => done(); // one poll: the page's next one is not run
new Function('document', 'location', 'fetch', 'setTimeout', js)(document, location,
    (u, o) => fetch(`${base}${u}`, o), later);
await drawn;
const st = await (await fetch(`${base}/v1/djinn/stats`, { headers: { Authorization: `Bearer ${token}` } })).json();
const text = id => (els[id] || {}).innerHTML || (els[id] || {}).textContent || '';
check(text('err') === '', `no error drawn: ${text('err')}`);
for (const k of ['text', 'data', 'stack']) check(text('segs').includes(`id="seg-${k}"`), `segment ${k} drawn`);
check(text('pages').includes(`${st.pages.total - st.pages.free} of ${st.pages.total} in use`), `pages: ${text('pages')}`);
check(text('pages').includes(`${st.prefix_cache.hits} hits`), 'prefix cache hits');
check(st.models.length > 0 && st.models.every(m => text('models').includes(`<td>${m.name}</td>`)), 'every model drawn');
check(st.sessions.length > 0, 'a session to draw');
for (const s of st.sessions)
    check(text('sessions').includes(`<td>${s.id}</td>`) && text('sessions').includes(`class="${s.residency}"`),
          `session ${s.id} drawn ${s.residency}`);
check(text('queues').includes('<td>interactive</td>'), 'queues drawn');
console.log(failed ? `view_check: ${failed} failed` : 'view_check: ok');
process.exit(failed ? 1 : 0);
