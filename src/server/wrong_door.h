/* wrong_door.h: telling a client that speaks HTTP to djinnd's binary port
 * where HTTP is served (wrong_door.c), in HTTP, before closing. */
#ifndef DJ_WRONG_DOOR_H
#define DJ_WRONG_DOOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether the first n bytes a connection sent (n >= 4; fewer: false) start
 * an HTTP request line (a method and a space) rather than a frame ("DJN1"). */
bool dj__wrong_door_http(const uint8_t *p, size_t n);

/* The answer, a complete HTTP/1.1 400 response saying that this is djinnd's
 * binary port and HTTP is on --http (http_addr: the daemon's --http
 * ADDR:PORT, or NULL when it serves none; http_port: the port it bound).
 * Writes at most cap bytes into buf (cap >= 512 always fits) and returns
 * the length. */
size_t dj__wrong_door_answer(const char *http_addr, unsigned http_port, char *buf, size_t cap);

#endif
