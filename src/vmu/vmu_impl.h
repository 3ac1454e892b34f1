/* vmu_impl.h: the VMU's private structures (segments, model regions, session
 * page lists) and an invariant checker the tests call. */
#ifndef DJINN_VMU_IMPL_H
#define DJINN_VMU_IMPL_H

#include "djinn/vmu.h"

#define DJ__NO_PAGE UINT32_MAX

struct dj_vmu_model {
    dj_vmu_t *vmu;
    uint64_t fingerprint;
    char *name;                  /* owned copy */
    uint8_t *base;               /* region start in the text segment */
    size_t offset;               /* region start from the text segment base */
    size_t bytes;                /* reserved, multiple of DJ_VMU_ALIGN */
    size_t used;                 /* appended so far, <= bytes */
    size_t mapped;               /* weight bytes used in place outside the segment (host backends) */
    uint32_t refcount;
    uint64_t stamp;              /* LRU clock at the last create/lookup/release */
    void *user;
    void (*dtor)(void *user);
    dj_vmu_model_t *prev, *next; /* regions in offset order */
};

struct dj_vmu_session {
    char *name;                      /* owned copy */
    size_t quota_pages;              /* 0 = no limit */
    size_t n_pages;                  /* pages held */
    uint32_t head;                   /* first held page, DJ__NO_PAGE if none */
    dj_vmu_session_t *prev, *next;   /* every session of the VMU */
};

struct dj_vmu {
    dj_backend_t *be;   /* borrowed */
    void *alloc;        /* what the backend returned (freed through it) */
    uint8_t *base;      /* alloc rounded up to DJ_VMU_ALIGN */
    size_t total;       /* bytes taken from the backend */

    /* text: model regions, first fit between live regions */
    uint8_t *text_base;
    size_t text_cap, text_used, text_peak;
    dj_vmu_model_t *models; /* offset order */
    size_t n_models;
    uint64_t clock;         /* LRU clock */
    size_t evictions;

    /* data: n_pages pages of page_bytes */
    uint8_t *data_base;
    size_t page_bytes;
    uint32_t n_pages;
    uint32_t *free_pages;        /* [n_pages] stack of free page ids, n_free on it */
    uint32_t n_free;
    uint32_t peak_pages;         /* most pages in use at once */
    dj_vmu_session_t **owner;    /* [n_pages] holder of each page, NULL if free */
    uint32_t *page_next;         /* [n_pages] next page of the same holder */
    uint32_t *page_prev;         /* [n_pages] previous page of the same holder */
    dj_vmu_session_t *sessions;
    size_t n_sessions;

    /* stack: bump pointer */
    uint8_t *stack_base;
    size_t stack_cap, stack_top, stack_peak;
};

/* Walks every structure and checks the VMU's invariants (regions ordered and
 * disjoint, byte counts, every page free xor held by exactly one session, page
 * lists and counts consistent). DJ_EINTERNAL with the first broken one. */
dj_status dj__vmu_check(const dj_vmu_t *vmu);

#endif
