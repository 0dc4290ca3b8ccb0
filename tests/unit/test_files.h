/* Files the unit tests write. Include after <cmocka.h>. */
#ifndef PAGODA_TESTS_UNIT_TEST_FILES_H
#define PAGODA_TESTS_UNIT_TEST_FILES_H

#include <stdio.h>

/* Writes DIR/name with the given text. */
static inline void test_write_text(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

#endif
