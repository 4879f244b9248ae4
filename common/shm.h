/* shm.h - named POSIX shared memory: the owner creates a region, peers map it by name. */
#ifndef RKV_SHM_H
#define RKV_SHM_H

#include <stddef.h>

/* kvmgr owns the KV pools; workers map them. A name is "/rkv-..." (as
 * shm_open wants); the region outlives a peer that dies, so a restarted
 * worker maps the same bytes again. */
struct rkv_shm {
    char name[64];
    void *base;
    size_t size;
    int owner; /* created here: unlinked by rkv_shm_close */
};

/* creates (replacing a stale region of the same name) and maps size bytes */
int rkv_shm_create(struct rkv_shm *s, const char *name, size_t size);
/* maps an existing region; RKV_EFORMAT when it is smaller than size */
int rkv_shm_open(struct rkv_shm *s, const char *name, size_t size);
/* unmaps; the owner also removes the name */
void rkv_shm_close(struct rkv_shm *s);

#endif
