/* file.c: opening files of the model store without ever blocking (O_NONBLOCK,
 * regular files only), for every reader of config, tokenizer, template and weights. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"

dj_status dj__file_open(const char *path, int *fd, struct stat *sb) {
    *fd = -1;
    /* O_NONBLOCK: a FIFO's open returns at once (reads of regular files ignore the flag) */
    const int k = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (k < 0) return dj_fail(errno == ENOENT ? DJ_ENOTFOUND : DJ_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(k, &st) != 0) {
        const int e = errno;
        close(k);
        return dj_fail(DJ_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(k);
        return dj_fail(DJ_EFORMAT, "%s: not a regular file (%s)", path,
                       S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a socket or other");
    }
    const int fl = fcntl(k, F_GETFL);
    if (fl >= 0) (void)fcntl(k, F_SETFL, fl & ~O_NONBLOCK); /* a regular file: plain reads from here */
    if (sb) *sb = st;
    *fd = k;
    return DJ_OK;
}

dj_status dj__file_fopen(const char *path, FILE **f) {
    *f = NULL;
    int fd;
    dj_status st = dj__file_open(path, &fd, NULL);
    if (st != DJ_OK) return st;
    if (!(*f = fdopen(fd, "rb"))) {
        const int e = errno;
        close(fd);
        return dj_fail(e == ENOMEM ? DJ_ENOMEM : DJ_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    return DJ_OK;
}
