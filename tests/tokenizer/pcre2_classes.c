/* Prints, for each Unicode class named on the command line (L, Lu, S, ...), the code points
 * that PCRE2's \p{CLASS} matches with UTF and UCP: one line "CLASS lo-hi lo-hi ..." (hex
 * ranges). Half of tests/tokenizer/unicode-deltas, which compares them with HF's. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

static size_t utf8(unsigned cp, unsigned char *b)
{
    if (cp < 0x80)
        return b[0] = (unsigned char)cp, 1;
    if (cp < 0x800)
        return b[0] = (unsigned char)(0xC0 | cp >> 6), b[1] = (unsigned char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | cp >> 12);
        b[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
        b[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    b[0] = (unsigned char)(0xF0 | cp >> 18);
    b[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
    b[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
    b[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

int main(int argc, char **argv)
{
    for (int a = 1; a < argc; a++) {
        char pat[64];
        snprintf(pat, sizeof(pat), "\\p{%s}", argv[a]);
        int err;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, NULL);
        if (!re) {
            fprintf(stderr, "pcre2_classes: %s does not compile\n", pat);
            return 1;
        }
        pcre2_match_data *md = pcre2_match_data_create(1, NULL);
        printf("%s", argv[a]);
        long start = -1;
        for (unsigned cp = 0; cp <= 0x110000; cp++) {
            int in = 0;
            if (cp < 0x110000 && (cp < 0xD800 || cp > 0xDFFF)) {
                unsigned char b[4];
                in = pcre2_match(re, b, utf8(cp, b), 0, 0, md, NULL) > 0;
            }
            if (in && start < 0)
                start = cp;
            if (!in && start >= 0 && (cp < 0xD800 || cp > 0xDFFF)) {
                printf(" %lx-%x", start, cp - 1);
                start = -1;
            }
        }
        printf("\n");
        pcre2_match_data_free(md);
        pcre2_code_free(re);
    }
    return 0;
}
