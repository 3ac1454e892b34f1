/* status.c: names and messages of dj_status, the thread-local error detail,
 * and the logger. */
#include "djinn/status.h"

#include "core/switches.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void dj_log(dj_log_level lvl, const char *func, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    if ((int)lvl < log_threshold()) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "djinn %s %s: %s\n", names[lvl], func, line);
}
