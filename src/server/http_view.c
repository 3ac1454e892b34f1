/* http_view.c: the live view of the VMU at GET / (one page, no external
 * assets), the JSON of the daemon's STATS it draws: GET /v1/djinn/stats, and
 * the same pushed as server-sent events by GET /v1/djinn/events. */
#include <inttypes.h>
#include "djinn/alloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/http_impl.h"
#include "djinn/kv.h"

static void add_u64(cJSON *o, const char *k, uint64_t v) { cJSON_AddNumberToObject(o, k, (double)v); }

static void add_seg(cJSON *segs, const char *name, const dj_vmu_seg_stats *s) {
    cJSON *o = cJSON_AddObjectToObject(segs, name);
    add_u64(o, "capacity", s->capacity);
    add_u64(o, "used", s->used);
    add_u64(o, "peak", s->peak);
}

/* The worker's snapshot as JSON. One without the admin role holds only
 * page_bytes and its own sessions: the rest writes as zeros. */
char *dj__http_stats_json(const dj__stats_snap *st, double at, size_t *len) {
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    const bool all = st->admin;
    const dj_vmu_stats *vs = &st->vs;
    cJSON_AddStringToObject(r, "object", "djinn.stats");
    cJSON_AddNumberToObject(r, "at_s", at);
    cJSON *segs = cJSON_AddObjectToObject(r, "segments");
    add_seg(segs, "text", &vs->text);
    add_seg(segs, "data", &vs->data);
    add_seg(segs, "stack", &vs->stack);
    cJSON *pg = cJSON_AddObjectToObject(r, "pages");
    add_u64(pg, "total", vs->pages_total);
    add_u64(pg, "free", vs->pages_free);
    add_u64(pg, "bytes", st->page_bytes);
    const dj_prefix_stats *ps = &st->prefix;
    cJSON *px = cJSON_AddObjectToObject(r, "prefix_cache");
    cJSON_AddBoolToObject(px, "enabled", ps->enabled);
    add_u64(px, "blocks", ps->blocks);
    add_u64(px, "blocks_unreferenced", ps->blocks_unreferenced);
    add_u64(px, "pages", ps->pages);
    add_u64(px, "pages_unreferenced", ps->pages_unreferenced);
    add_u64(px, "hits", ps->hits);
    add_u64(px, "tokens_mapped", ps->tokens_mapped);
    add_u64(px, "evictions", ps->evictions);
    cJSON *ms = cJSON_AddArrayToObject(r, "models");
    for (size_t i = 0; i < st->n_models; i++) {
        const dj__stats_model *m = &st->models[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", m->name);
        add_u64(o, "refs", m->refs);
        add_u64(o, "layers", m->pl.n_layers);
        add_u64(o, "streamed_layers", m->pl.n_streamed);
        add_u64(o, "resident_bytes", m->pl.resident_bytes);
        add_u64(o, "ring_bytes", m->pl.ring_bytes);
        cJSON_AddItemToArray(ms, o);
    }
    cJSON *ss = cJSON_AddArrayToObject(r, "sessions");
    for (size_t i = 0; i < st->n_sessions; i++) {
        const dj__stats_sess *s = &st->sessions[i];
        cJSON *o = cJSON_CreateObject();
        char id[20];
        snprintf(id, sizeof id, "%016" PRIx64, s->id);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "model", s->model);
        cJSON_AddStringToObject(o, "qos", dj_qos_name(s->qos));
        cJSON_AddStringToObject(o, "state", dj_sched_state_name(s->state));
        /* where its KV is: the host pool (swapped, or on its way) or the data segment */
        cJSON_AddStringToObject(o, "residency", s->pooled_bytes ? "swapped" : "resident");
        add_u64(o, "pos", s->pos);
        add_u64(o, "kv_bytes", s->kv_bytes);
        add_u64(o, "pooled_bytes", s->pooled_bytes);
        add_u64(o, "swaps", s->swaps);
        cJSON_AddBoolToObject(o, "generating", s->generating);
        cJSON_AddBoolToObject(o, "paused", s->paused);
        cJSON_AddItemToArray(ss, o);
    }
    cJSON *qs = cJSON_AddObjectToObject(r, "queues");
    for (int q = 0; q < DJ_QOS_COUNT; q++) {
        cJSON *o = cJSON_AddObjectToObject(qs, dj_qos_name((dj_qos)q));
        add_u64(o, "waiting", st->waiting[q]);
        add_u64(o, "running", st->running[q]);
    }
    const dj_swap_stats *sw = &st->swap;
    cJSON *swo = cJSON_AddObjectToObject(r, "swap");
    cJSON_AddStringToObject(swo, "policy", all ? dj_swap_policy_name(st->policy) : "");
    add_u64(swo, "pool_bytes", sw->capacity);
    add_u64(swo, "pool_used", sw->used);
    add_u64(swo, "swaps_out", sw->swaps_out);
    add_u64(swo, "swaps_in", sw->swaps_in);
    add_u64(swo, "bytes_out", sw->bytes_out);
    add_u64(swo, "bytes_in", sw->bytes_in);
    const dj_disk_stats *ds = &st->disk;
    cJSON *dk = cJSON_AddObjectToObject(r, "disk"); /* the KV disk tier below the pool */
    cJSON_AddBoolToObject(dk, "enabled", ds->enabled);
    add_u64(dk, "capacity", ds->capacity);
    add_u64(dk, "used", ds->used);
    add_u64(dk, "sessions", ds->sessions);
    add_u64(dk, "bytes_written", ds->bytes_written);
    add_u64(dk, "bytes_read", ds->bytes_read);
    add_u64(dk, "recoveries", st->sched.recoveries);
    cJSON *sp = cJSON_AddObjectToObject(r, "steps");
    add_u64(sp, "gen_steps", st->gen_steps);
    add_u64(sp, "batched_steps", st->batched_steps);
    add_u64(sp, "batched_rows", st->batched_rows);
    cJSON_AddNumberToObject(sp, "step_ms", st->step_ms);
    if (!all) cJSON_AddStringToObject(r, "scope", "own");
    char *body = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (body) *len = strlen(body);
    return body;
}

/* The page: the segments drawn to scale (the data segment's KV in a colour
 * per session, the prefix cache's pages grey; the host pool with the swapped
 * sessions' KV), tables of models, sessions and queues, tokens/s and swap
 * traffic between events. It listens to /v1/djinn/events (EventSource); a
 * bearer token, when the daemon wants one, comes from the URL's #token=...
 * and goes as ?access_token= (EventSource sends no headers); #events=N ends
 * after N events (for a still page: tests, screenshots). The numbers the
 * tests read have stable ids: seg-{text,data,stack,pool} (data-capacity,
 * data-used bytes), pages-used, pages-total, n-models, model-NAME, n-sessions,
 * session-ID, queue-CLASS, events (events received). */
/* one literal, longer than C99's 4095-byte minimum: gcc and clang take it */
#pragma GCC diagnostic ignored "-Woverlength-strings"
const char dj__http_view_html[] =
    "<!doctype html>\n"
    "<html><head><meta charset=\"utf-8\"><title>djinnd: VMU</title>\n"
    "<style>\n"
    "body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}\n"
    "h1{font-size:1.3em;margin:.2em 0}h2{font-size:1.05em;margin:1em 0 .3em}\n"
    ".seg{display:flex;align-items:center;margin:.3em 0}.seg b{width:5.5em}\n"
    ".bar{position:relative;height:1.4em;background:#eee;border:1px solid #999;display:flex;overflow:hidden}\n"
    ".bar>div{height:100%}\n"
    ".lbl{margin-left:.6em;font-variant-numeric:tabular-nums}\n"
    "table{border-collapse:collapse}td,th{padding:.12em .7em;border-bottom:1px solid #ddd;text-align:left}\n"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
    ".sw{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:middle}\n"
    ".swapped{color:#a33}.resident{color:#273}#err{color:#a33}#live{color:#666}\n"
    "</style></head><body>\n"
    "<h1>djinnd &mdash; live view of the VMU</h1>\n"
    "<div id=\"live\">events received: <span id=\"events\">0</span>; <span id=\"tps\">-</span> tokens/s; PCIe (swap): <span id=\"pcie\">-</span></div><div id=\"err\"></div>\n"
    "<h2>Segments</h2><div id=\"segs\"></div><div id=\"pages\"></div>\n"
    "<h2>Models (text): <span id=\"n-models\">0</span></h2><table id=\"models\"></table>\n"
    "<h2>Sessions (data): <span id=\"n-sessions\">0</span></h2><table id=\"sessions\"></table>\n"
    "<h2>Queues</h2><table id=\"queues\"></table>\n"
    "<p id=\"swap\"></p>\n"
    "<script>\n"
    "'use strict';\n"
    "// #token=TOKEN: sent as ?access_token= (EventSource sends no headers); #events=N: stop after N\n"
    "const arg=k=>(location.hash.match(new RegExp('[#&]'+k+'=([^&]+)'))||[])[1];\n"
    "const tok=arg('token'),max=+arg('events')||0;\n"
    "const MiB=b=>(b/1048576).toFixed(1)+' MiB';\n"
    "const esc=s=>String(s).replace(/[&<>\"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','\"':'&quot;'}[c]));\n"
    "const $=id=>document.getElementById(id);\n"
    "function row(cells,head,attr){return '<tr'+(attr||'')+'>'+cells.map(c=>{const n=typeof c==='number';\n"
    " return (head?'<th>':n?'<td class=\"n\">':'<td>')+(c&&c.html?c.html:esc(c))+(head?'</th>':'</td>')}).join('')+'</tr>';}\n"
    "const colours={text:'#4a7fc1',data:'#d9822b',stack:'#6a9f4b'};\n"
    "const hue=i=>'hsl('+(i*67+20)%360+',60%,55%)';\n"
    "const part=(b,cap,col,t)=>'<div style=\"width:'+(cap?100*b/cap:0).toFixed(2)+'%;background:'+col+'\" title=\"'+esc(t)+'\"></div>';\n"
    "let n=0,prev=null;\n"
    "function draw(s){\n"
    " const g=s.segments,total=g.text.capacity+g.data.capacity+g.stack.capacity,p=s.pages,x=s.prefix_cache;let h='';\n"
    " for(const k of ['text','data','stack']){const c=g[k],w=Math.max(2,Math.round(600*c.capacity/total));let f;\n"
    "  if(k==='data'){f=s.sessions.map((e,i)=>e.residency==='resident'?part(e.kv_bytes,c.capacity,hue(i),e.id):'').join('')+\n"
    "   part(x.pages*p.bytes,c.capacity,'#999','prefix cache');}else f=part(c.used,c.capacity,colours[k],k);\n"
    "  h+='<div class=\"seg\" id=\"seg-'+k+'\" data-capacity=\"'+c.capacity+'\" data-used=\"'+c.used+'\"><b>'+k+'</b><div class=\"bar\" style=\"width:'+w+\n"
    "   'px\">'+f+'</div><span class=\"lbl\">'+MiB(c.used)+' of '+MiB(c.capacity)+' (peak '+MiB(c.peak)+')</span></div>';}\n"
    " const w=s.swap;\n"
    " h+='<div class=\"seg\" id=\"seg-pool\" data-capacity=\"'+w.pool_bytes+'\" data-used=\"'+w.pool_used+'\"><b>host pool</b><div class=\"bar\" style=\"width:300px\">'+\n"
    "  s.sessions.map((e,i)=>e.pooled_bytes?part(e.pooled_bytes,w.pool_bytes,hue(i),e.id):'').join('')+\n"
    "  '</div><span class=\"lbl\">'+MiB(w.pool_used)+' of '+MiB(w.pool_bytes)+' (swapped KV)</span></div>';\n"
    " $('segs').innerHTML=h;\n"
    " $('pages').innerHTML='data pages: <span id=\"pages-used\">'+(p.total-p.free)+'</span> of <span id=\"pages-total\">'+p.total+'</span> in use ('+\n"
    "  p.bytes+' B each); prefix cache: '+(x.enabled?x.blocks+' blocks, '+x.pages+' pages ('+x.pages_unreferenced+\n"
    "  ' unreferenced), '+x.hits+' hits, '+x.tokens_mapped+' prompt tokens not recomputed':'off');\n"
    " $('n-models').textContent=s.models.length;\n"
    " $('models').innerHTML=row(['model','refs','layers','streamed','resident'],1)+\n"
    "  s.models.map(m=>row([m.name,m.refs,m.layers,m.streamed_layers,MiB(m.resident_bytes)],0,' id=\"model-'+esc(m.name)+'\"')).join('');\n"
    " $('n-sessions').textContent=s.sessions.length;\n"
    " $('sessions').innerHTML=row(['session','model','qos','state','KV','pos','KV bytes','swaps'],1)+\n"
    "  s.sessions.map((e,i)=>row([{html:'<span class=\"sw\" style=\"background:'+hue(i)+'\"></span>'+esc(e.id)},e.model,e.qos,e.state,\n"
    "   {html:'<span class=\"'+e.residency+'\">'+e.residency+'</span>'},e.pos,MiB(e.kv_bytes),e.swaps],0,' id=\"session-'+esc(e.id)+'\"')).join('');\n"
    " $('queues').innerHTML=row(['class','waiting','running'],1)+\n"
    "  Object.entries(s.queues).map(([k,q])=>row([k,q.waiting,q.running],0,' id=\"queue-'+esc(k)+'\"')).join('');\n"
    " $('swap').textContent='swap ('+w.policy+'): pool '+MiB(w.pool_used)+' of '+MiB(w.pool_bytes)+', '+w.swaps_out+' out, '+\n"
    "  w.swaps_in+' in; '+s.steps.gen_steps+' steps, '+s.steps.step_ms.toFixed(2)+' ms each';\n"
    " // rates between two events: tokens = steps of one session + the rows of batched ones\n"
    " const t=s.at_s,k=s.steps.gen_steps-s.steps.batched_steps+s.steps.batched_rows;\n"
    " if(prev&&t>prev.t){const d=t-prev.t;$('tps').textContent=((k-prev.k)/d).toFixed(0);\n"
    "  $('pcie').textContent=MiB((w.bytes_out-prev.o)/d)+'/s out, '+MiB((w.bytes_in-prev.i)/d)+'/s in';}\n"
    " prev={t,k,o:w.bytes_out,i:w.bytes_in};\n"
    "}\n"
    "const es=new EventSource('/v1/djinn/events'+(max?'?count='+max:'')+(tok?(max?'&':'?')+'access_token='+encodeURIComponent(tok):''));\n"
    "es.onmessage=e=>{const j=JSON.parse(e.data);\n"
    " if(j.error){$('err').textContent='events: '+j.error.message;return;}\n"
    " $('events').textContent=++n;draw(j);$('err').textContent='';if(max&&n>=max)es.close();};\n"
    "es.onerror=()=>{if(!max||n<max)$('err').textContent='events: '+(es.readyState===2?\n"
    " 'refused (a wrong #token=?) or djinnd is gone: reload the page':'the connection broke; retrying');};\n"
    "</script></body></html>\n";
