/* sd_notify.h: telling systemd (Type=notify) that djinnd is ready, reloading
 * or stopping - libsystemd's sd_notify where the build found it. */
#ifndef DJ_SD_NOTIFY_H
#define DJ_SD_NOTIFY_H

/* Sends state ("READY=1", "RELOADING=1", "STOPPING=1", "STATUS=...", lines
 * joined by '\n') to $NOTIFY_SOCKET; nothing when it is unset. Errors are
 * logged, never fatal (a daemon runs as well without systemd listening). */
void dj__sd_notify(const char *state);

#endif
