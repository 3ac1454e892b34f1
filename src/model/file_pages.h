/* file_pages.h: a read-only file mapping's pages as 2 MiB folios mapped by
 * PMDs (one TLB entry per 2 MiB instead of 512), where the kernel and the
 * file system can hold file pages that large. */
#ifndef DJ_MODEL_FILE_PAGES_H
#define DJ_MODEL_FILE_PAGES_H

#include <stddef.h>

/* map: the whole file open as fd, mapped PROT_READ from offset 0 with
 * MADV_HUGEPAGE already advised (size bytes). Touches one byte of every
 * 2 MiB of it (reading the file where it is not cached: with MADV_HUGEPAGE
 * the kernel reads it into 2 MiB folios). When the cached pages turn out to
 * be small folios (a file written with small writes keeps them), the file's
 * cached pages are dropped and read again once - first one 2 MiB block as a
 * probe, the rest only if the probe came back as one folio; pages another
 * process maps stay as they are. Returns the bytes mapped by PMDs afterwards
 * (0 where /proc/self/smaps does not tell, or below 4 MiB). Nothing here
 * fails: every step is advice. $DJINN_HUGE_REREAD=0 (a kill switch) skips
 * the re-read. */
size_t dj__file_pages_huge(int fd, void *map, size_t size);

#endif
