/* status.c: names and messages of dj_status, the thread-local error detail,
 * and the logger. */
#include "djinn/status.h"

#include "core/switches.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *dj_strerror(dj_status st) {
    switch (st) {
#define DJ__STATUS_MSG(name, code, msg) \
    case DJ_##name:                     \
        return msg;
        DJ_STATUS_MAP(DJ__STATUS_MSG)
#undef DJ__STATUS_MSG
    }
    return "unknown status";
}

const char *dj_status_name(dj_status st) {
    switch (st) {
#define DJ__STATUS_STR(name, code, msg) \
    case DJ_##name:                     \
        return "DJ_" #name;
        DJ_STATUS_MAP(DJ__STATUS_STR)
#undef DJ__STATUS_STR
    }
    return "DJ_UNKNOWN";
}

static _Thread_local char last_error[1024];

dj_status dj_fail(dj_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

const char *dj_last_error(void) { return last_error; }
void dj_clear_error(void) { last_error[0] = '\0'; }

/* -1 until read from $DJINN_LOG or set (djinnd --log-level, a SIGHUP's
 * reload on the daemon's loop while other threads log: hence atomic). */
static _Atomic int log_level = -1;

static int log_threshold(void) {
    int level = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (level < 0) {
        level = dj_switch_read(DJ_SW_LOG); /* debug|info|warn|error: dj_log_level's order */
        int unset = -1;
        atomic_compare_exchange_strong(&log_level, &unset, level);
    }
    return level;
}

void dj_log_set_level(dj_log_level lvl) { atomic_store(&log_level, (int)lvl); }

static _Atomic int log_json; /* dj_log_set_format */

void dj_log_set_format(dj_log_format f) { atomic_store(&log_json, f == DJ_LOG_JSON); }

bool dj_log_enabled(dj_log_level lvl) { return (int)lvl >= log_threshold(); }

/* RFC 3339, UTC, milliseconds: "2026-12-07T19:02:03.123Z" (out: 25 bytes). */
static void rfc3339_now(char out[32]) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 24, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03uZ", (unsigned)(ts.tv_nsec / 1000000) % 1000u);
}

size_t dj__log_escape(const char *in, char *out, size_t cap) {
    size_t n = 0;
    if (!cap) return 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && n + 7 < cap; p++) {
        if (*p == '"' || *p == '\\') {
            out[n++] = '\\';
            out[n++] = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", *p);
        } else {
            out[n++] = (char)*p;
        }
    }
    out[n] = '\0';
    return n;
}

void dj__log_line(dj_log_level lvl, const char *func, const char *msg, const char *json_fields) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    char ts[32];
    rfc3339_now(ts);
    if (atomic_load_explicit(&log_json, memory_order_relaxed)) {
        char m[4096];
        dj__log_escape(msg, m, sizeof m);
        fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"func\":\"%s\",\"msg\":\"%s\"%s%s}\n", ts, names[lvl], func,
                m, json_fields ? "," : "", json_fields ? json_fields : "");
    } else {
        fprintf(stderr, "%s djinn %s %s: %s\n", ts, names[lvl], func, msg);
    }
}

static void log_v(dj_log_level lvl, const char *func, const char *fmt, va_list ap) {
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    dj__log_line(lvl, func, line, NULL);
}

void dj__log_always(dj_log_level lvl, const char *func, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_v(lvl, func, fmt, ap);
    va_end(ap);
}

void dj_log(dj_log_level lvl, const char *func, const char *fmt, ...) {
    if ((int)lvl < log_threshold()) return;
    va_list ap;
    va_start(ap, fmt);
    log_v(lvl, func, fmt, ap);
    va_end(ap);
}
