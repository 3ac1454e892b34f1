/* sd_notify.c: djinnd's readiness for systemd's Type=notify - libsystemd's
 * sd_notify (DJ_HAVE_SYSTEMD), else the same datagram to $NOTIFY_SOCKET. */
#include "server/sd_notify.h"

#include <errno.h>
#include <string.h>

#include "djinn/status.h"

#ifdef DJ_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

void dj__sd_notify(const char *state) {
    const int r = sd_notify(0, state);
    if (r < 0) DJ_LOG(WARN, "sd_notify(%s): %s", state, strerror(-r));
}
#else
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The protocol of sd_notify(3): one datagram on the unix socket named by
 * $NOTIFY_SOCKET (a path, or '@' for an abstract name). */
void dj__sd_notify(const char *state) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0]) return;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    const size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof a.sun_path) {
        DJ_LOG(WARN, "NOTIFY_SOCKET '%s': not a unix socket path", path);
        return;
    }
    memcpy(a.sun_path, path, n);
    if (path[0] == '@') a.sun_path[0] = '\0';
    const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&a,
                         (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
        DJ_LOG(WARN, "NOTIFY_SOCKET %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
}
#endif
