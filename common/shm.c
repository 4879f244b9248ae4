/* shm.c - shm_open + mmap with the checks a shared KV pool needs. */
#include "common/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

static int check_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 2 || n >= 64 || name[0] != '/' || strchr(name + 1, '/'))
        return RKV_EINVAL;
    return 0;
}

static int map(struct rkv_shm *s, int fd, size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    s->base = p;
    s->size = size;
    return 0;
}

int rkv_shm_create(struct rkv_shm *s, const char *name, size_t size)
{
    memset(s, 0, sizeof *s);
    if (check_name(name) || size == 0)
        return RKV_EINVAL;
    shm_unlink(name); /* a region left by a dead predecessor */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (ftruncate(fd, (off_t)size) != 0)
        rc = -errno;
    if (!rc)
        rc = map(s, fd, size);
    close(fd);
    if (rc) {
        shm_unlink(name);
        return rc;
    }
    snprintf(s->name, sizeof s->name, "%s", name);
    s->owner = 1;
    return 0;
}

int rkv_shm_open(struct rkv_shm *s, const char *name, size_t size)
{
    memset(s, 0, sizeof *s);
    if (check_name(name) || size == 0)
        return RKV_EINVAL;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = -errno;
    else if ((size_t)st.st_size < size)
        rc = RKV_EFORMAT;
    if (!rc)
        rc = map(s, fd, size);
    close(fd);
    if (!rc)
        snprintf(s->name, sizeof s->name, "%s", name);
    return rc;
}

void rkv_shm_close(struct rkv_shm *s)
{
    if (s->base)
        munmap(s->base, s->size);
    if (s->owner && s->name[0])
        shm_unlink(s->name);
    memset(s, 0, sizeof *s);
}
