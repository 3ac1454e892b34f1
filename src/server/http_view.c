/* http_view.c: the live view of the VMU at GET / (one page, no external
 * assets) and the JSON it polls, GET /v1/djinn/stats (the daemon's STATS). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/http_impl.h"

static void add_u64(cJSON *o, const char *k, uint64_t v) { cJSON_AddNumberToObject(o, k, (double)v); }

static void add_seg(cJSON *segs, const char *name, const dj_client_seg *s) {
    cJSON *o = cJSON_AddObjectToObject(segs, name);
    add_u64(o, "capacity", s->capacity);
    add_u64(o, "used", s->used);
    add_u64(o, "peak", s->peak);
}

char *dj__http_stats_json(const dj_client_stats *st, size_t *len) {
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    cJSON_AddStringToObject(r, "object", "djinn.stats");
    cJSON *segs = cJSON_AddObjectToObject(r, "segments");
    add_seg(segs, "text", &st->text);
    add_seg(segs, "data", &st->data);
    add_seg(segs, "stack", &st->stack);
    cJSON *pg = cJSON_AddObjectToObject(r, "pages");
    add_u64(pg, "total", st->pages_total);
    add_u64(pg, "free", st->pages_free);
    add_u64(pg, "bytes", st->page_bytes);
    cJSON *px = cJSON_AddObjectToObject(r, "prefix_cache");
    cJSON_AddBoolToObject(px, "enabled", st->prefix.enabled);
    add_u64(px, "blocks", st->prefix.blocks);
    add_u64(px, "blocks_unreferenced", st->prefix.blocks_unreferenced);
    add_u64(px, "pages", st->prefix.pages);
    add_u64(px, "pages_unreferenced", st->prefix.pages_unreferenced);
    add_u64(px, "hits", st->prefix.hits);
    add_u64(px, "tokens_mapped", st->prefix.tokens_mapped);
    add_u64(px, "evictions", st->prefix.evictions);
    cJSON *ms = cJSON_AddArrayToObject(r, "models");
    for (size_t i = 0; i < st->n_models; i++) {
        const dj_client_model *m = &st->models[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", m->name);
        add_u64(o, "refs", m->refs);
        add_u64(o, "layers", m->layers);
        add_u64(o, "streamed_layers", m->streamed_layers);
        add_u64(o, "resident_bytes", m->resident_bytes);
        add_u64(o, "ring_bytes", m->ring_bytes);
        cJSON_AddItemToArray(ms, o);
    }
    cJSON *ss = cJSON_AddArrayToObject(r, "sessions");
    for (size_t i = 0; i < st->n_sessions; i++) {
        const dj_client_session_info *s = &st->sessions[i];
        cJSON *o = cJSON_CreateObject();
        char id[20];
        snprintf(id, sizeof id, "%016" PRIx64, s->id);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "model", s->model);
        cJSON_AddStringToObject(o, "qos", s->qos);
        cJSON_AddStringToObject(o, "state", s->state);
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
    cJSON *sw = cJSON_AddObjectToObject(r, "swap");
    cJSON_AddStringToObject(sw, "policy", st->swap.policy);
    add_u64(sw, "pool_bytes", st->swap.pool_bytes);
    add_u64(sw, "pool_used", st->swap.pool_used);
    add_u64(sw, "swaps_out", st->swap.swaps_out);
    add_u64(sw, "swaps_in", st->swap.swaps_in);
    add_u64(sw, "bytes_out", st->swap.bytes_out);
    add_u64(sw, "bytes_in", st->swap.bytes_in);
    cJSON *sp = cJSON_AddObjectToObject(r, "steps");
    add_u64(sp, "gen_steps", st->gen_steps);
    add_u64(sp, "batched_steps", st->batched_steps);
    add_u64(sp, "batched_rows", st->batched_rows);
    cJSON_AddNumberToObject(sp, "step_ms", st->step_ms);
    char *body = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (body) *len = strlen(body);
    return body;
}

/* The page: three segment bars to scale, tables of models, sessions and
 * queues; polls /v1/djinn/stats every second (a bearer token, when the
 * daemon wants one, comes from the URL's #token=... and is sent as a header). */
const char dj__http_view_html[] =
    "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>djinnd: VMU</title>\n"
    "<style>\n"
    "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}\n"
    "h1{font-size:1.3em}h2{font-size:1.05em;margin:1.2em 0 .4em}\n"
    ".seg{display:flex;align-items:center;margin:.3em 0}.seg b{width:4em}\n"
    ".bar{position:relative;height:1.4em;background:#eee;border:1px solid #999}\n"
    ".fill{position:absolute;top:0;bottom:0;left:0}\n"
    ".lbl{margin-left:.6em;font-variant-numeric:tabular-nums}\n"
    "table{border-collapse:collapse}td,th{padding:.15em .7em;border-bottom:1px solid #ddd;text-align:left}\n"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
    ".swapped{color:#a33}.resident{color:#273}#err{color:#a33}\n"
    "</style></head><body>\n"
    "<h1>djinnd &mdash; live view of the VMU</h1><div id=\"err\"></div>\n"
    "<h2>Segments</h2><div id=\"segs\"></div><div id=\"pages\"></div>\n"
    "<h2>Models (text)</h2><table id=\"models\"></table>\n"
    "<h2>Sessions (data)</h2><table id=\"sessions\"></table>\n"
    "<h2>Queues</h2><table id=\"queues\"></table>\n"
    "<p id=\"swap\"></p>\n"
    "<script>\n"
    "'use strict';\n"
    "const tok=(location.hash.match(/token=([^&]+)/)||[])[1];\n"
    "const MiB=b=>(b/1048576).toFixed(1)+' MiB';\n"
    "const esc=s=>String(s).replace(/[&<>\"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','\"':'&quot;'}[c]));\n"
    "function row(cells,head){return '<tr>'+cells.map(c=>{const n=typeof c==='number';"
    "return (head?'<th>':n?'<td class=\"n\">':'<td>')+esc(c)+(head?'</th>':'</td>')}).join('')+'</tr>';}\n"
    "const colours={text:'#4a7fc1',data:'#d9822b',stack:'#6a9f4b'};\n"
    "function draw(s){\n"
    " const g=s.segments,total=g.text.capacity+g.data.capacity+g.stack.capacity;let h='';\n"
    " for(const k of ['text','data','stack']){const c=g[k];\n"
    "  const w=Math.max(2,Math.round(600*c.capacity/total)),u=c.capacity?100*c.used/c.capacity:0;\n"
    "  h+='<div class=\"seg\" id=\"seg-'+k+'\"><b>'+k+'</b><div class=\"bar\" style=\"width:'+w+'px\">'+\n"
    "   '<div class=\"fill\" style=\"width:'+u.toFixed(1)+'%;background:'+colours[k]+'\"></div></div>'+\n"
    "   '<span class=\"lbl\">'+MiB(c.used)+' of '+MiB(c.capacity)+' (peak '+MiB(c.peak)+')</span></div>';}\n"
    " document.getElementById('segs').innerHTML=h;\n"
    " const p=s.pages,x=s.prefix_cache;\n"
    " document.getElementById('pages').textContent='data pages: '+(p.total-p.free)+' of '+p.total+' in use ('+\n"
    "  p.bytes+' B each); prefix cache: '+(x.enabled?x.blocks+' blocks, '+x.pages+' pages ('+x.pages_unreferenced+\n"
    "  ' unreferenced), '+x.hits+' hits, '+x.tokens_mapped+' prompt tokens not recomputed':'off');\n"
    " document.getElementById('models').innerHTML=row(['model','refs','layers','streamed','resident'],1)+\n"
    "  s.models.map(m=>row([m.name,m.refs,m.layers,m.streamed_layers,MiB(m.resident_bytes)])).join('');\n"
    " document.getElementById('sessions').innerHTML=row(['session','model','qos','state','KV','pos','KV bytes','swaps'],1)+\n"
    "  s.sessions.map(x=>row([x.id,x.model,x.qos,x.state,x.residency,x.pos,MiB(x.kv_bytes),x.swaps])"
    ".replace('<td>'+x.residency,'<td class=\"'+x.residency+'\">'+x.residency)).join('');\n"
    " document.getElementById('queues').innerHTML=row(['class','waiting','running'],1)+\n"
    "  Object.entries(s.queues).map(([k,q])=>row([k,q.waiting,q.running])).join('');\n"
    " const w=s.swap;document.getElementById('swap').textContent='swap ('+w.policy+'): pool '+MiB(w.pool_used)+\n"
    "  ' of '+MiB(w.pool_bytes)+', '+w.swaps_out+' out, '+w.swaps_in+' in; '+s.steps.gen_steps+' steps, '+\n"
    "  s.steps.step_ms.toFixed(2)+' ms each';\n"
    "}\n"
    "async function poll(){try{const r=await fetch('/v1/djinn/stats',{headers:tok?{Authorization:'Bearer '+tok}:{}});\n"
    " const j=await r.json();if(!r.ok)throw new Error(j.error?j.error.message:r.status);\n"
    " draw(j);document.getElementById('err').textContent='';}\n"
    " catch(e){document.getElementById('err').textContent='stats: '+e.message;}\n"
    " setTimeout(poll,1000);}\n"
    "poll();\n"
    "</script></body></html>\n";
