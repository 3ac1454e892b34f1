/* file.h: opening files of the model store without ever blocking - a FIFO or
 * device named config.json (or any model file) is an error, not a hang. */
#ifndef DJ_CORE_FILE_H
#define DJ_CORE_FILE_H

#include <stdio.h>
#include <sys/stat.h>

#include "djinn/status.h"

/* A read-only descriptor of path (close it), opened with O_NONBLOCK so that
 * opening a FIFO never waits for a writer, then fstat'ed: anything but a
 * regular file is refused. *sb (may be NULL) gets its stat. Errors name the
 * path: DJ_ENOTFOUND when absent, DJ_EFORMAT when not a regular file, DJ_EIO
 * otherwise. */
dj_status dj__file_open(const char *path, int *fd /* OUT */, struct stat *sb /* OUT, may be NULL */);
/* The same as a stdio stream opened "rb" (fclose it). */
dj_status dj__file_fopen(const char *path, FILE **f /* OUT */);

#endif
