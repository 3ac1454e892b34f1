/* status.h: the one status type of Djinn, its names and messages, and the
 * thread-local "last error" detail that CLI and server report to users. */
#ifndef DJINN_STATUS_H
#define DJINN_STATUS_H

#include <stdbool.h>
#include <stddef.h>

/* X(NAME, code, message). Codes are stable: they travel on the wire later. */
#define DJ_STATUS_MAP(X)                                              \
    X(OK, 0, "ok")                                                    \
    X(EINVAL, -1, "invalid argument")                                 \
    X(ENOMEM, -2, "out of host memory")                               \
    X(EIO, -3, "input/output error")                                  \
    X(EFORMAT, -4, "malformed input")                                 \
    X(EUNSUPPORTED, -5, "not supported")                              \
    X(ENOTFOUND, -6, "not found")                                     \
    X(ERANGE, -7, "value out of range")                               \
    X(ENOSPC, -8, "segment has no space left")                        \
    X(EQUOTA, -9, "session quota exceeded")                           \
    X(EBUSY, -10, "resource busy")                                    \
    X(EDEVICE, -11, "device error")                                   \
    X(EINTERNAL, -12, "internal error")

typedef enum {
#define DJ__STATUS_ENUM(name, code, msg) DJ_##name = code,
    DJ_STATUS_MAP(DJ__STATUS_ENUM)
#undef DJ__STATUS_ENUM
} dj_status;

/* Static message for a status ("segment has no space left"). Never NULL. */
const char *dj_strerror(dj_status st);
/* Static symbolic name ("DJ_ENOSPC"). Never NULL. */
const char *dj_status_name(dj_status st);

/* Record a human-readable detail for the calling thread and return st, so
 * that a failing function can write `return dj_fail(DJ_EFORMAT, "...")`.
 * The detail replaces the previous one; it is never cleared by success. */
dj_status dj_fail(dj_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The calling thread's last detail recorded by dj_fail (valid until the next
 * dj_fail on this thread), or "" if none. */
const char *dj_last_error(void);
void dj_clear_error(void);

/* Log levels; DJINN_LOG=debug|info|warn|error sets the threshold (default warn). */
typedef enum { DJ_LOG_DEBUG, DJ_LOG_INFO, DJ_LOG_WARN, DJ_LOG_ERROR } dj_log_level;
void dj_log(dj_log_level lvl, const char *func, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
#define DJ_LOG(lvl, ...) dj_log(DJ_LOG_##lvl, __func__, __VA_ARGS__)
/* Sets the threshold (over $DJINN_LOG); any thread, any time. */
void dj_log_set_level(dj_log_level lvl);
/* Every line starts with an RFC 3339 UTC timestamp: text "TS djinn LEVEL
 * FUNC: MESSAGE", or one JSON object {"ts","level","func","msg"} a line. */
typedef enum { DJ_LOG_TEXT, DJ_LOG_JSON } dj_log_format;
void dj_log_set_format(dj_log_format f);
bool dj_log_enabled(dj_log_level lvl);
/* Internal: one line of msg at lvl, whatever the threshold; json_fields
 * (may be NULL): more members for the JSON object, written as given.
 * dj__log_escape writes in as a JSON string's body into out[cap]. */
void dj__log_line(dj_log_level lvl, const char *func, const char *msg, const char *json_fields);
size_t dj__log_escape(const char *in, char *out, size_t cap);
/* dj_log whatever the threshold: what an operator must always see (the
 * daemon's start and its fatal errors). */
void dj__log_always(dj_log_level lvl, const char *func, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
