#include "model/model_fingerprint.h"

#include "common/error.h"
#include "common/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* A safetensors header is at most this large (the format's readers agree on 100 MB). */
#define HEADER_MAX (100u << 20)

/* Adds the first max bytes of path (all of it when max is 0) to st, after its length. */
static int hash_file(XXH3_state_t *st, const char *path, int header_only)
{
    /* no wait on a FIFO in a model file's place (the worker's start, for ever) */
    int fd;
    struct stat sb;
    int rc = file_open_regular(path, PAGODA_EFORMAT, &fd, &sb);
    if (rc != 0)
        return rc;
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        close(fd);
        return pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    XXH3_128bits_update(st, &size, sizeof(size));
    uint64_t want = size;
    if (header_only) {
        uint8_t len8[8];
        if (fread(len8, 1, 8, f) != 8) {
            fclose(f);
            return pagoda_error_set(PAGODA_EFORMAT, "%s: shorter than a safetensors header", path);
        }
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = (hl << 8) | len8[i];
        if (hl > HEADER_MAX || hl + 8 > size) {
            fclose(f);
            return pagoda_error_set(PAGODA_EFORMAT, "%s: header length %llu out of range", path,
                                    (unsigned long long)hl);
        }
        XXH3_128bits_update(st, len8, 8);
        want = hl;
    }
    char buf[1 << 16];
    while (want > 0) {
        size_t n = fread(buf, 1, want < sizeof(buf) ? (size_t)want : sizeof(buf), f);
        if (n == 0)
            break;
        XXH3_128bits_update(st, buf, n);
        want -= n;
    }
    int bad = ferror(f);
    fclose(f);
    return bad ? pagoda_error_set(PAGODA_EIO, "%s: read error", path) : 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int only_weights(const struct dirent *d)
{
    return ends_with(d->d_name, ".safetensors") || ends_with(d->d_name, ".safetensors.index.json");
}

int model_fingerprint(const char *model_dir, const char *load_format, uint64_t seed,
                      uint8_t out[MODEL_FINGERPRINT_BYTES])
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    int rc = hash_file(&st, path, 0);
    if (rc != 0)
        return rc;
    if (strcmp(load_format, "random") == 0) {
        XXH3_128bits_update(&st, "random", 6);
        XXH3_128bits_update(&st, &seed, sizeof(seed));
    } else {
        struct dirent **names = NULL;
        int n = scandir(model_dir, &names, only_weights, by_name);
        if (n < 0)
            return pagoda_error_set(PAGODA_EIO, "%s: %s", model_dir, strerror(errno));
        for (int i = 0; i < n; i++) {
            if (rc == 0) {
                snprintf(path, sizeof(path), "%s/%s", model_dir, names[i]->d_name);
                XXH3_128bits_update(&st, names[i]->d_name, strlen(names[i]->d_name) + 1);
                rc = hash_file(&st, path, ends_with(names[i]->d_name, ".safetensors"));
            }
            free(names[i]);
        }
        free(names);
        if (rc != 0)
            return rc;
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(out, c.digest, MODEL_FINGERPRINT_BYTES);
    return 0;
}
