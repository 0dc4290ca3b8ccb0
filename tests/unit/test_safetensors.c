/* Tests of model/safetensors.c: files written here (a good one, then each kind of damage), and
 * sets of shards behind model.safetensors.index.json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "model/model_fingerprint.h"
#include "model/safetensors.h"
#include "tests/unit/test_files.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct spec {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[4];
};

static size_t spec_bytes(const struct spec *s)
{
    size_t n = strcmp(s->dtype, "F32") == 0 ? 4 : 2;
    for (int i = 0; i < s->ndim; i++)
        n *= (size_t)s->shape[i];
    return n;
}

/* Writes the 8-byte length, the header padded with spaces to a multiple of 8 (as the reference
 * writer does), then data_bytes of data where byte i of tensor k is fill[i]. */
static void write_file(const char *path, const char *header, const uint8_t *data, size_t data_bytes)
{
    size_t len = strlen(header);
    size_t padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    assert_int_equal(fwrite(le, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, len, f), len);
    for (size_t i = len; i < padded; i++)
        fputc(' ', f);
    if (data_bytes > 0)
        assert_int_equal(fwrite(data, 1, data_bytes, f), data_bytes);
    assert_int_equal(fclose(f), 0);
}

/* A tiny safetensors writer: the tensors in order, each one's bytes all equal to its index
 * plus one, with "__metadata__": {"format": "pt"}. Returns the padded header length. */
static size_t write_safetensors(const char *path, const struct spec *specs, size_t n)
{
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t offset = 0;
    for (size_t k = 0; k < n; k++) {
        json_t *shape = json_array();
        for (int i = 0; i < specs[k].ndim; i++)
            json_array_append_new(shape, json_integer(specs[k].shape[i]));
        size_t bytes = spec_bytes(&specs[k]);
        json_object_set_new(h, specs[k].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", specs[k].dtype, "shape", shape,
                                      "data_offsets", (json_int_t)offset,
                                      (json_int_t)(offset + bytes)));
        offset += bytes;
    }
    char *header = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    assert_non_null(header);
    uint8_t *data = malloc(offset + 1);
    assert_non_null(data);
    offset = 0;
    for (size_t k = 0; k < n; k++) {
        memset(data + offset, (int)(k + 1), spec_bytes(&specs[k]));
        offset += spec_bytes(&specs[k]);
    }
    write_file(path, header, data, offset);
    size_t padded = (strlen(header) + 7) / 8 * 8;
    free(header);
    free(data);
    return padded;
}

/* A file with a hand-written header and data_bytes bytes of 0xab. */
static void write_raw(const char *path, const char *header, size_t data_bytes)
{
    uint8_t *data = malloc(data_bytes + 1);
    assert_non_null(data);
    memset(data, 0xab, data_bytes);
    write_file(path, header, data, data_bytes);
    free(data);
}

static void make_dir(char *dir)
{
    strcpy(dir, "/tmp/pagoda_st_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Opening path fails with code and a detail containing the path and needle. */
static void expect_open_error(const char *path, int code, const char *needle)
{
    struct safetensors_file *f = NULL;
    pagoda_error_clear();
    int rc = safetensors_open(path, &f);
    if (rc != code || strstr(pagoda_error_detail(), needle) == NULL)
        print_error("got %d \"%s\", want %d with \"%s\"\n", rc, pagoda_error_detail(), code,
                    needle);
    assert_int_equal(rc, code);
    assert_null(f);
    assert_non_null(strstr(pagoda_error_detail(), path));
    assert_non_null(strstr(pagoda_error_detail(), needle));
}

static const struct spec GOOD[] = {
    {"a.bias", "F32", 1, {4}},  {"scalar", "F32", 0, {0}},    {"b.weight", "BF16", 2, {2, 3}},
    {"c", "F16", 3, {3, 1, 2}}, {"empty", "BF16", 2, {0, 5}},
};
#define NUM_GOOD (sizeof(GOOD) / sizeof(GOOD[0]))

static void test_reads_good_file(void **state)
{
    char dir[32], path[64];
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/x.safetensors", dir);
    write_safetensors(path, GOOD, NUM_GOOD);

    struct safetensors_file *f;
    assert_int_equal(safetensors_open(path, &f), 0);
    assert_string_equal(safetensors_path(f), path);
    assert_int_equal(safetensors_count(f), NUM_GOOD);
    /* Iteration is in name order, whatever the file order. */
    const char *const order[] = {"a.bias", "b.weight", "c", "empty", "scalar"};
    for (size_t i = 0; i < NUM_GOOD; i++)
        assert_string_equal(safetensors_tensor_at(f, i)->name, order[i]);
    assert_null(safetensors_tensor_at(f, NUM_GOOD));

    for (size_t k = 0; k < NUM_GOOD; k++) {
        const struct safetensors_tensor *t;
        assert_int_equal(safetensors_find(f, GOOD[k].name, &t), 0);
        assert_string_equal(t->name, GOOD[k].name);
        assert_string_equal(dtype_name(t->dtype), GOOD[k].dtype);
        assert_int_equal(t->ndim, GOOD[k].ndim);
        for (int i = 0; i < t->ndim; i++)
            assert_int_equal(t->shape[i], GOOD[k].shape[i]);
        assert_int_equal(t->nbytes, spec_bytes(&GOOD[k]));
        /* The data is this tensor's: every byte is its index plus one. */
        for (size_t i = 0; i < t->nbytes; i++)
            assert_int_equal(((const uint8_t *)t->data)[i], k + 1);
        assert_int_equal((uintptr_t)t->data % dtype_size(t->dtype), 0);
    }
    const struct safetensors_tensor *t;
    assert_int_equal(safetensors_find(f, "a", &t), PAGODA_ENOENT);
    assert_int_equal(safetensors_find(f, "__metadata__", &t), PAGODA_ENOENT);
    safetensors_close(f);
    safetensors_close(NULL);
    remove_dir(dir);
}

static void test_refuses_truncated_file(void **state)
{
    char dir[32], path[64];
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/x.safetensors", dir);
    size_t header = write_safetensors(path, GOOD, NUM_GOOD);
    size_t full = 8 + header + 16 + 4 + 12 + 12;

    assert_int_equal(truncate(path, (off_t)full - 2), 0);
    expect_open_error(path, PAGODA_EFORMAT, "truncated");
    assert_int_equal(truncate(path, (off_t)(8 + header / 2)), 0);
    expect_open_error(path, PAGODA_EFORMAT, "truncated");
    assert_int_equal(truncate(path, 5), 0);
    expect_open_error(path, PAGODA_EFORMAT, "truncated");
    assert_int_equal(truncate(path, 0), 0);
    expect_open_error(path, PAGODA_EFORMAT, "truncated");
    remove_dir(dir);
}

/* A FIFO (or a directory) in the file's place is refused at once, naming what it is: the open
 * of a FIFO waited for a writer for ever (a worker's start stalled, its group healthy). */
static void test_refuses_what_is_not_a_file(void **state)
{
    (void)state;
    char dir[32], path[64];
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/x.safetensors", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    expect_open_error(path, PAGODA_EFORMAT, "not a regular file (a FIFO)");
    unlink(path);
    assert_int_equal(mkdir(path, 0700), 0);
    expect_open_error(path, PAGODA_EFORMAT, "not a regular file (a directory)");
    rmdir(path);
    remove_dir(dir);
}

/* The worker fingerprints the model folder's files before it opens them: a FIFO named like a
 * safetensors file is refused there too, at once, where its open waited for a writer for ever. */
static void test_fingerprint_refuses_a_fifo(void **state)
{
    (void)state;
    char dir[32], path[64];
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{}", f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    uint8_t fp[MODEL_FINGERPRINT_BYTES];
    assert_int_equal(model_fingerprint(dir, "auto", 0, fp), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "not a regular file (a FIFO)"));
    unlink(path);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    remove_dir(dir);
}

static void test_refuses_bad_offsets(void **state)
{
    char dir[32], path[64];
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/x.safetensors", dir);

    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", 12);
    expect_open_error(path, PAGODA_EFORMAT, "tensor x: data_offsets [8, 16] go past the end");
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 16);
    expect_open_error(path, PAGODA_EFORMAT, "tensor x");
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 16);
    expect_open_error(path, PAGODA_EFORMAT, "data_offsets");
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 16);
    expect_open_error(path, PAGODA_EFORMAT, "data_offsets");
    write_raw(path,
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
              " \"y\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
              16);
    expect_open_error(path, PAGODA_EFORMAT, "tensors x and y overlap");
    /* Offsets past 2^63 and shapes whose byte count overflows. */
    write_raw(path,
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4],"
              " \"data_offsets\": [0, 0]}}",
              16);
    expect_open_error(path, PAGODA_EFORMAT, "overflows");
    remove_dir(dir);
}

static void test_refuses_wrong_byte_size(void **state)
{
    char dir[32], path[64];
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/x.safetensors", dir);
    write_raw(path, "{\"w\": {\"dtype\": \"BF16\", \"shape\": [3, 2], \"data_offsets\": [0, 8]}}",
              16);
    expect_open_error(path, PAGODA_EFORMAT, "tensor w: data_offsets span 8 bytes but shape [3, 2]");
    remove_dir(dir);
}

static void test_refuses_unsupported_and_malformed(void **state)
{
    char dir[32], path[64];
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/x.safetensors", dir);

    write_raw(path, "{\"ids\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]}}",
              16);
    expect_open_error(path, PAGODA_EUNSUPPORTED, "tensor ids has dtype I64");
    write_raw(path,
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1],"
              " \"data_offsets\": [0, 4]}}",
              4);
    expect_open_error(path, PAGODA_EUNSUPPORTED, "9 dimensions");
    /* An F32 tensor two bytes into the data area. */
    write_raw(path,
              "{\"h\": {\"dtype\": \"F16\", \"shape\": [1], \"data_offsets\": [0, 2]},"
              " \"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [2, 6]}}",
              8);
    expect_open_error(path, PAGODA_EUNSUPPORTED, "tensor x: data at file offset");
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]", 4);
    expect_open_error(path, PAGODA_EFORMAT, "not valid JSON");
    write_raw(path, "[1, 2]", 0);
    expect_open_error(path, PAGODA_EFORMAT, "not a JSON object");
    write_raw(path,
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
              " \"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
              4);
    expect_open_error(path, PAGODA_EFORMAT, "not valid JSON");
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(path, PAGODA_EFORMAT, "shape");
    write_raw(path, "{\"x\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(path, PAGODA_EFORMAT, "\"dtype\"");

    /* A header length beyond the limit, in a small file. */
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t le[16] = {0, 0, 0, 0x10, 0, 0, 0, 0}; /* 256 MiB */
    fwrite(le, 1, sizeof(le), f);
    fclose(f);
    expect_open_error(path, PAGODA_ERANGE, "exceeds the limit");

    snprintf(path, sizeof(path), "%s/missing.safetensors", dir);
    expect_open_error(path, PAGODA_ENOENT, "cannot open");
    remove_dir(dir);
}

static const struct spec SHARD1[] = {
    {"model.embed_tokens.weight", "BF16", 2, {8, 4}},
    {"model.layers.0.mlp.up_proj.weight", "F32", 2, {6, 4}},
};
static const struct spec SHARD2[] = {
    {"lm_head.weight", "BF16", 2, {8, 4}},
    {"model.norm.weight", "F16", 1, {4}},
};
static const char *const INDEX =
    "{\"metadata\": {\"total_size\": 232}, \"weight_map\": {"
    " \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
    " \"model.layers.0.mlp.up_proj.weight\": \"model-00001-of-00002.safetensors\","
    " \"lm_head.weight\": \"model-00002-of-00002.safetensors\","
    " \"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}";

static void write_shards(const char *dir)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", dir);
    write_safetensors(path, SHARD1, 2);
    snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
    write_safetensors(path, SHARD2, 2);
}

static void expect_set_error(const char *dir, int code, const char *needle1, const char *needle2)
{
    struct safetensors_set *set = NULL;
    pagoda_error_clear();
    int rc = safetensors_set_open(dir, &set);
    if (rc != code || strstr(pagoda_error_detail(), needle1) == NULL)
        print_error("got %d \"%s\", want %d with \"%s\"\n", rc, pagoda_error_detail(), code,
                    needle1);
    assert_int_equal(rc, code);
    assert_null(set);
    assert_non_null(strstr(pagoda_error_detail(), needle1));
    if (needle2 != NULL)
        assert_non_null(strstr(pagoda_error_detail(), needle2));
}

static void test_set_single_file(void **state)
{
    char dir[32], path[64];
    make_dir(dir);
    expect_set_error(dir, PAGODA_ENOENT, "model.safetensors", dir);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_safetensors(path, GOOD, NUM_GOOD);
    struct safetensors_set *set;
    assert_int_equal(safetensors_set_open(dir, &set), 0);
    assert_int_equal(safetensors_set_count(set), NUM_GOOD);
    const struct safetensors_tensor *t;
    size_t index;
    assert_int_equal(safetensors_set_find(set, "c", &t, &index), 0);
    assert_string_equal(t->name, "c");
    assert_ptr_equal(safetensors_set_tensor_at(set, index), t);
    assert_int_equal(safetensors_set_find(set, "d", &t, NULL), PAGODA_ENOENT);
    safetensors_set_close(set);
    safetensors_set_close(NULL);
    remove_dir(dir);
}

static void test_set_finds_across_shards(void **state)
{
    char dir[32];
    make_dir(dir);
    write_shards(dir);
    test_write_text(dir, "model.safetensors.index.json", INDEX);
    struct safetensors_set *set;
    int rc = safetensors_set_open(dir, &set);
    if (rc != 0)
        print_error("%s\n", pagoda_error_detail());
    assert_int_equal(rc, 0);
    assert_int_equal(safetensors_set_count(set), 4);
    const char *const order[] = {"lm_head.weight", "model.embed_tokens.weight",
                                 "model.layers.0.mlp.up_proj.weight", "model.norm.weight"};
    for (size_t i = 0; i < 4; i++) {
        const struct safetensors_tensor *t;
        size_t index;
        assert_string_equal(safetensors_set_tensor_at(set, i)->name, order[i]);
        assert_int_equal(safetensors_set_find(set, order[i], &t, &index), 0);
        assert_int_equal(index, i);
    }
    /* Each tensor's data comes from its own shard: the second tensor written in each. */
    const struct safetensors_tensor *t;
    assert_int_equal(safetensors_set_find(set, "model.norm.weight", &t, NULL), 0);
    assert_int_equal(t->dtype, DTYPE_F16);
    assert_int_equal(((const uint8_t *)t->data)[0], 2);
    assert_int_equal(safetensors_set_find(set, "model.embed_tokens.weight", &t, NULL), 0);
    assert_int_equal(t->nbytes, 64);
    assert_int_equal(((const uint8_t *)t->data)[63], 1);
    safetensors_set_close(set);
    remove_dir(dir);
}

static void test_set_refuses_missing_shard(void **state)
{
    char dir[32], path[64];
    make_dir(dir);
    write_shards(dir);
    test_write_text(dir, "model.safetensors.index.json", INDEX);
    snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
    unlink(path);
    expect_set_error(dir, PAGODA_ENOENT, path, "missing");
    remove_dir(dir);
}

static void test_set_refuses_inconsistent_index(void **state)
{
    char dir[32];
    make_dir(dir);
    write_shards(dir);
    /* The index puts model.norm.weight in the first shard, which does not hold it. */
    test_write_text(dir, "model.safetensors.index.json",
                    "{\"weight_map\": {"
                    " \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                    " \"model.norm.weight\": \"model-00001-of-00002.safetensors\","
                    " \"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_set_error(dir, PAGODA_EMISMATCH, "tensor model.norm.weight",
                     "model-00001-of-00002.safetensors");

    test_write_text(
        dir, "model.safetensors.index.json",
        "{\"weight_map\": {\"lm_head.weight\": \"../model-00002-of-00002.safetensors\"}}");
    expect_set_error(dir, PAGODA_EFORMAT, "lm_head.weight", "model directory");
    test_write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    expect_set_error(dir, PAGODA_EFORMAT, "weight_map", NULL);
    test_write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {}}");
    expect_set_error(dir, PAGODA_EFORMAT, "weight_map", "empty");

    /* The same tensor in two shards: which one to use would be a guess. */
    char path[64];
    snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
    const struct spec dup[] = {{"model.norm.weight", "F16", 1, {4}},
                               {"model.embed_tokens.weight", "BF16", 2, {8, 4}}};
    write_safetensors(path, dup, 2);
    test_write_text(dir, "model.safetensors.index.json",
                    "{\"weight_map\": {"
                    " \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                    " \"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_set_error(dir, PAGODA_EFORMAT, "tensor model.embed_tokens.weight is in both", NULL);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_good_file),
        cmocka_unit_test(test_refuses_truncated_file),
        cmocka_unit_test(test_refuses_what_is_not_a_file),
        cmocka_unit_test(test_fingerprint_refuses_a_fifo),
        cmocka_unit_test(test_refuses_bad_offsets),
        cmocka_unit_test(test_refuses_wrong_byte_size),
        cmocka_unit_test(test_refuses_unsupported_and_malformed),
        cmocka_unit_test(test_set_single_file),
        cmocka_unit_test(test_set_finds_across_shards),
        cmocka_unit_test(test_set_refuses_missing_shard),
        cmocka_unit_test(test_set_refuses_inconsistent_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
