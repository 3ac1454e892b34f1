/* wrong_door.c: a connection that sends an HTTP request to djinnd's binary
 * port is answered in HTTP (a 400 naming --http) instead of a binary frame. */
#include "server/wrong_door.h"

#include <stdio.h>
#include <string.h>

/* The request methods of RFC 9110 (and PATCH, and HTTP/2's preface "PRI *"),
 * each with the space that ends it where it is shorter than 4 bytes. Only the
 * first 4 bytes are compared: a frame starts with "DJN1", which none of these does. */
static const char *const methods[] = {"GET ", "HEAD", "POST", "PUT ", "DELETE", "CONNECT", "OPTIONS", "TRACE",
                                      "PATCH", "PRI "};

bool dj__wrong_door_http(const uint8_t *p, size_t n) {
    if (n < 4) return false;
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
        if (!memcmp(p, methods[i], 4)) return true;
    return false;
}

size_t dj__wrong_door_answer(const char *http_addr, unsigned http_port, char *buf, size_t cap) {
    char body[256];
    int bn;
    if (http_addr)
        bn = snprintf(body, sizeof body, "this is djinnd's binary port; HTTP is on --http (%.128s, port %u)\n",
                      http_addr, http_port);
    else
        bn = snprintf(body, sizeof body,
                      "this is djinnd's binary port; HTTP is on --http, which this djinnd was not started with\n");
    if (bn < 0) bn = 0;
    if ((size_t)bn >= sizeof body) bn = (int)sizeof body - 1;
    const int n = snprintf(buf, cap,
                           "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                           "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                           bn, body);
    if (n < 0) return 0;
    return (size_t)n < cap ? (size_t)n : (cap ? cap - 1 : 0);
}
