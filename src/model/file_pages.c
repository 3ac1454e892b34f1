/* file_pages.c: a read-only file mapping's pages made 2 MiB folios mapped
 * by PMDs where the kernel can (see file_pages.h). Measured on the 2-core
 * dev machine (bench/RESULTS.md, issue 15): a summing pass over a 2.2 GB
 * checkpoint on one core at 26 GB/s through 4 KiB pages, 30 through PMDs;
 * TinyLlama's decode 1.105x as fast. */
#define _GNU_SOURCE /* MADV_HUGEPAGE, posix_fadvise */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/switches.h"
#include "djinn/status.h"
#include "model/file_pages.h"

#define HUGE_BYTES ((uintptr_t)2 << 20)

/* One byte of every 2 MiB in [a, b): a fault there maps the whole folio
 * (a PMD when it is a 2 MiB one) or reads it in. */
static void touch(uintptr_t a, uintptr_t b) {
    for (uintptr_t p = a; p < b; p += HUGE_BYTES) (void)*(volatile const unsigned char *)p;
}

/* FilePmdMapped of the mapping that starts at map, in bytes; -1 when
 * /proc/self/smaps does not say. */
static long long pmd_mapped(const void *map) {
    FILE *f = fopen("/proc/self/smaps", "re");
    if (!f) return -1;
    char line[512], want[32];
    snprintf(want, sizeof want, "%lx-", (unsigned long)(uintptr_t)map);
    long long kb = -1;
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        const bool header = (line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f');
        if (header) {
            if (in) break;
            in = !strncmp(line, want, strlen(want));
        } else if (in && !strncmp(line, "FilePmdMapped:", 14)) {
            kb = strtoll(line + 14, NULL, 10);
        }
    }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Drops [a, b) from this mapping and the file's cached pages of it (those no
 * other process maps), then faults it in again as 2 MiB folios. */
static void reread(int fd, uintptr_t map, uintptr_t a, uintptr_t b) {
    madvise((void *)a, b - a, MADV_DONTNEED);
    posix_fadvise(fd, (off_t)(a - map), (off_t)(b - a), POSIX_FADV_DONTNEED);
    touch(a, b);
}

size_t dj__file_pages_huge(int fd, void *map, size_t size) {
    const uintptr_t m = (uintptr_t)map;
    const uintptr_t a = (m + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1), b = (m + size) & ~(HUGE_BYTES - 1);
    if (b < a + 2 * HUGE_BYTES) return 0;
    touch(a, b);
    long long pmd = pmd_mapped(map);
    if (pmd < 0 || (uintptr_t)pmd >= b - a) return pmd < 0 ? 0 : (size_t)pmd;
    if (dj_switch_read(DJ_SW_HUGE_REREAD) == 0) return (size_t)pmd; /* the kill switch */
    fdatasync(fd); /* dirty pages (a file just written) cannot be dropped */
    if (pmd == 0) { /* can this file system hold 2 MiB folios at all? one block tells */
        reread(fd, m, a, a + HUGE_BYTES);
        const long long probe = pmd_mapped(map);
        if (probe <= 0) return 0;
        pmd = probe;
    }
    DJ_LOG(INFO, "%.1f of %.1f MiB in small pages: dropped from the page cache and read again in 2 MiB pages",
           (double)(b - a - (uintptr_t)pmd) / 1048576.0, (double)(b - a) / 1048576.0);
    reread(fd, m, a, b);
    pmd = pmd_mapped(map);
    return pmd < 0 ? 0 : (size_t)pmd;
}
