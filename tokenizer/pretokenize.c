/* Pre-tokenizers: Split (a regex or a literal, through PCRE2 with UTF and UCP, JIT-compiled
 * where PCRE2 has a JIT), ByteLevel (GPT-2's byte-to-character map, its own regex when
 * use_regex), Metaspace (spaces to U+2581, the prepend scheme, the split before each U+2581) and
 * Digits. Each stage cuts the pieces it is given into smaller ones, as HF's
 * NormalizedString::split does with its five delimiter behaviors; pieces holding an added token
 * pass through untouched. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* GPT-2's pattern, which ByteLevel applies when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* The GPT-2 byte map: bytes that are printable characters stand for themselves, the others
 * (0-32, 127-160, 173) take the code points from 256 up, in order. */
static uint32_t byte_to_cp(unsigned b)
{
    if (b <= 32)
        return 256 + b;
    if (b >= 127 && b <= 160)
        return 289 + (b - 127);
    if (b == 173)
        return 323;
    return b;
}

int tok_bytelevel_byte(uint32_t cp)
{
    if (cp < 256)
        return (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) ? -1 : (int)cp;
    if (cp <= 288)
        return (int)(cp - 256);
    if (cp <= 322)
        return (int)(cp - 289 + 127);
    return cp == 323 ? 173 : -1;
}

/* ---- the Unicode of Hugging Face's regexes ----
 *
 * HF runs these patterns through Oniguruma with Unicode 16.0 tables; Debian 12's PCRE2 has
 * Unicode 14.0. The characters a general category has in HF's and not in PCRE2's (the letters,
 * digits, marks, punctuation and symbols added since: U+1FA75 is \p{S}, U+11F00 \p{M}) are
 * added to that class when a pattern is compiled, and \s is spelled out as HF's White_Space
 * (PCRE2 also counts U+180E). tests/tokenizer/unicode-deltas writes HF_CLASSES by asking both
 * libraries about every code point: npm tokenizers 0.23.2 (a Split on \p{CLASS}, behavior
 * Removed, encoding every scalar value) against pcre2_match of PCRE2 10.42 with UTF and UCP.
 * Only Mn loses a code point (U+1171E became Mc), so it is spelled out whole; the classes not
 * listed (Lt, Me, Nl, Pc, Ps, Pe, Pi, Pf, Sc, Sk, Z..) are the same in both. One script is
 * here, Kimi K2's \p{Han}, whole: PCRE2 10.42 matches its Script_Extensions (U+3001 、 too),
 * Oniguruma its Script. */
static const struct {
    const char *name; /* \p{NAME}: the short general category (Oniguruma's spelling), or Han */
    bool whole;       /* hf is HF's whole class, which replaces PCRE2's */
    const char *hf;   /* the code points HF has and PCRE2 lacks (or the whole class) */
} HF_CLASSES[] = {
    /* 9272 code points in 35 ranges */
    {"L", false,
     "\\x{1c89}-\\x{1c8a}\\x{a7cb}-\\x{a7cd}\\x{a7da}-\\x{a7dc}\\x{105c0}-\\x{105f3}"
     "\\x{10d4a}-\\x{10d65}\\x{10d6f}-\\x{10d85}\\x{10ec2}-\\x{10ec4}"
     "\\x{1123f}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138b}\\x{1138e}"
     "\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}\\x{113d3}\\x{11bc0}-\\x{11be0}"
     "\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}\\x{1342f}"
     "\\x{13441}-\\x{13446}\\x{13460}-\\x{143fa}\\x{16100}-\\x{1611d}"
     "\\x{16d40}-\\x{16d6c}\\x{18cff}\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}"
     "\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{1e5d0}-\\x{1e5ed}\\x{1e5f0}"
     "\\x{2b739}\\x{2ebf0}-\\x{2ee5d}\\x{31350}-\\x{323af}"},
    /* 27 code points in 5 ranges */
    {"Lu", false, "\\x{1c89}\\x{a7cb}-\\x{a7cc}\\x{a7da}\\x{a7dc}\\x{10d50}-\\x{10d65}"},
    /* 31 code points in 5 ranges */
    {"Ll", false, "\\x{1c8a}\\x{a7cd}\\x{a7db}\\x{10d70}-\\x{10d85}\\x{1df25}-\\x{1df2a}"},
    /* 70 code points in 6 ranges */
    {"Lm", false,
     "\\x{10d4e}\\x{10d6f}\\x{16d40}-\\x{16d42}\\x{16d6b}-\\x{16d6c}"
     "\\x{1e030}-\\x{1e06d}\\x{1e4eb}"},
    /* 9144 code points in 30 ranges */
    {"Lo", false,
     "\\x{105c0}-\\x{105f3}\\x{10d4a}-\\x{10d4d}\\x{10d4f}\\x{10ec2}-\\x{10ec4}"
     "\\x{1123f}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138b}\\x{1138e}"
     "\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}\\x{113d3}\\x{11bc0}-\\x{11be0}"
     "\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}\\x{1342f}"
     "\\x{13441}-\\x{13446}\\x{13460}-\\x{143fa}\\x{16100}-\\x{1611d}"
     "\\x{16d43}-\\x{16d6a}\\x{18cff}\\x{1b132}\\x{1b155}\\x{1e4d0}-\\x{1e4ea}"
     "\\x{1e5d0}-\\x{1e5ed}\\x{1e5f0}\\x{2b739}\\x{2ebf0}-\\x{2ee5d}"
     "\\x{31350}-\\x{323af}"},
    /* 93 code points in 24 ranges */
    {"M", false,
     "\\x{897}\\x{cf3}\\x{ece}\\x{10d69}-\\x{10d6d}\\x{10efc}-\\x{10eff}\\x{11241}"
     "\\x{113b8}-\\x{113c0}\\x{113c2}\\x{113c5}\\x{113c7}-\\x{113ca}"
     "\\x{113cc}-\\x{113d0}\\x{113d2}\\x{113e1}-\\x{113e2}\\x{11f00}-\\x{11f01}"
     "\\x{11f03}\\x{11f34}-\\x{11f3a}\\x{11f3e}-\\x{11f42}\\x{11f5a}\\x{13440}"
     "\\x{13447}-\\x{13455}\\x{1611e}-\\x{1612f}\\x{1e08f}\\x{1e4ec}-\\x{1e4ef}"
     "\\x{1e5ee}-\\x{1e5ef}"},
    /* HF's whole set, 2020 code points in 357 ranges */
    {"Mn", true,
     "\\x{300}-\\x{36f}\\x{483}-\\x{487}\\x{591}-\\x{5bd}\\x{5bf}\\x{5c1}-\\x{5c2}"
     "\\x{5c4}-\\x{5c5}\\x{5c7}\\x{610}-\\x{61a}\\x{64b}-\\x{65f}\\x{670}"
     "\\x{6d6}-\\x{6dc}\\x{6df}-\\x{6e4}\\x{6e7}-\\x{6e8}\\x{6ea}-\\x{6ed}\\x{711}"
     "\\x{730}-\\x{74a}\\x{7a6}-\\x{7b0}\\x{7eb}-\\x{7f3}\\x{7fd}\\x{816}-\\x{819}"
     "\\x{81b}-\\x{823}\\x{825}-\\x{827}\\x{829}-\\x{82d}\\x{859}-\\x{85b}"
     "\\x{897}-\\x{89f}\\x{8ca}-\\x{8e1}\\x{8e3}-\\x{902}\\x{93a}\\x{93c}"
     "\\x{941}-\\x{948}\\x{94d}\\x{951}-\\x{957}\\x{962}-\\x{963}\\x{981}\\x{9bc}"
     "\\x{9c1}-\\x{9c4}\\x{9cd}\\x{9e2}-\\x{9e3}\\x{9fe}\\x{a01}-\\x{a02}\\x{a3c}"
     "\\x{a41}-\\x{a42}\\x{a47}-\\x{a48}\\x{a4b}-\\x{a4d}\\x{a51}\\x{a70}-\\x{a71}"
     "\\x{a75}\\x{a81}-\\x{a82}\\x{abc}\\x{ac1}-\\x{ac5}\\x{ac7}-\\x{ac8}\\x{acd}"
     "\\x{ae2}-\\x{ae3}\\x{afa}-\\x{aff}\\x{b01}\\x{b3c}\\x{b3f}\\x{b41}-\\x{b44}"
     "\\x{b4d}\\x{b55}-\\x{b56}\\x{b62}-\\x{b63}\\x{b82}\\x{bc0}\\x{bcd}\\x{c00}"
     "\\x{c04}\\x{c3c}\\x{c3e}-\\x{c40}\\x{c46}-\\x{c48}\\x{c4a}-\\x{c4d}"
     "\\x{c55}-\\x{c56}\\x{c62}-\\x{c63}\\x{c81}\\x{cbc}\\x{cbf}\\x{cc6}"
     "\\x{ccc}-\\x{ccd}\\x{ce2}-\\x{ce3}\\x{d00}-\\x{d01}\\x{d3b}-\\x{d3c}"
     "\\x{d41}-\\x{d44}\\x{d4d}\\x{d62}-\\x{d63}\\x{d81}\\x{dca}\\x{dd2}-\\x{dd4}"
     "\\x{dd6}\\x{e31}\\x{e34}-\\x{e3a}\\x{e47}-\\x{e4e}\\x{eb1}\\x{eb4}-\\x{ebc}"
     "\\x{ec8}-\\x{ece}\\x{f18}-\\x{f19}\\x{f35}\\x{f37}\\x{f39}\\x{f71}-\\x{f7e}"
     "\\x{f80}-\\x{f84}\\x{f86}-\\x{f87}\\x{f8d}-\\x{f97}\\x{f99}-\\x{fbc}\\x{fc6}"
     "\\x{102d}-\\x{1030}\\x{1032}-\\x{1037}\\x{1039}-\\x{103a}\\x{103d}-\\x{103e}"
     "\\x{1058}-\\x{1059}\\x{105e}-\\x{1060}\\x{1071}-\\x{1074}\\x{1082}"
     "\\x{1085}-\\x{1086}\\x{108d}\\x{109d}\\x{135d}-\\x{135f}\\x{1712}-\\x{1714}"
     "\\x{1732}-\\x{1733}\\x{1752}-\\x{1753}\\x{1772}-\\x{1773}\\x{17b4}-\\x{17b5}"
     "\\x{17b7}-\\x{17bd}\\x{17c6}\\x{17c9}-\\x{17d3}\\x{17dd}\\x{180b}-\\x{180d}"
     "\\x{180f}\\x{1885}-\\x{1886}\\x{18a9}\\x{1920}-\\x{1922}\\x{1927}-\\x{1928}"
     "\\x{1932}\\x{1939}-\\x{193b}\\x{1a17}-\\x{1a18}\\x{1a1b}\\x{1a56}"
     "\\x{1a58}-\\x{1a5e}\\x{1a60}\\x{1a62}\\x{1a65}-\\x{1a6c}\\x{1a73}-\\x{1a7c}"
     "\\x{1a7f}\\x{1ab0}-\\x{1abd}\\x{1abf}-\\x{1ace}\\x{1b00}-\\x{1b03}\\x{1b34}"
     "\\x{1b36}-\\x{1b3a}\\x{1b3c}\\x{1b42}\\x{1b6b}-\\x{1b73}\\x{1b80}-\\x{1b81}"
     "\\x{1ba2}-\\x{1ba5}\\x{1ba8}-\\x{1ba9}\\x{1bab}-\\x{1bad}\\x{1be6}"
     "\\x{1be8}-\\x{1be9}\\x{1bed}\\x{1bef}-\\x{1bf1}\\x{1c2c}-\\x{1c33}"
     "\\x{1c36}-\\x{1c37}\\x{1cd0}-\\x{1cd2}\\x{1cd4}-\\x{1ce0}\\x{1ce2}-\\x{1ce8}"
     "\\x{1ced}\\x{1cf4}\\x{1cf8}-\\x{1cf9}\\x{1dc0}-\\x{1dff}\\x{20d0}-\\x{20dc}"
     "\\x{20e1}\\x{20e5}-\\x{20f0}\\x{2cef}-\\x{2cf1}\\x{2d7f}\\x{2de0}-\\x{2dff}"
     "\\x{302a}-\\x{302d}\\x{3099}-\\x{309a}\\x{a66f}\\x{a674}-\\x{a67d}"
     "\\x{a69e}-\\x{a69f}\\x{a6f0}-\\x{a6f1}\\x{a802}\\x{a806}\\x{a80b}"
     "\\x{a825}-\\x{a826}\\x{a82c}\\x{a8c4}-\\x{a8c5}\\x{a8e0}-\\x{a8f1}\\x{a8ff}"
     "\\x{a926}-\\x{a92d}\\x{a947}-\\x{a951}\\x{a980}-\\x{a982}\\x{a9b3}"
     "\\x{a9b6}-\\x{a9b9}\\x{a9bc}-\\x{a9bd}\\x{a9e5}\\x{aa29}-\\x{aa2e}"
     "\\x{aa31}-\\x{aa32}\\x{aa35}-\\x{aa36}\\x{aa43}\\x{aa4c}\\x{aa7c}\\x{aab0}"
     "\\x{aab2}-\\x{aab4}\\x{aab7}-\\x{aab8}\\x{aabe}-\\x{aabf}\\x{aac1}"
     "\\x{aaec}-\\x{aaed}\\x{aaf6}\\x{abe5}\\x{abe8}\\x{abed}\\x{fb1e}"
     "\\x{fe00}-\\x{fe0f}\\x{fe20}-\\x{fe2f}\\x{101fd}\\x{102e0}\\x{10376}-\\x{1037a}"
     "\\x{10a01}-\\x{10a03}\\x{10a05}-\\x{10a06}\\x{10a0c}-\\x{10a0f}"
     "\\x{10a38}-\\x{10a3a}\\x{10a3f}\\x{10ae5}-\\x{10ae6}\\x{10d24}-\\x{10d27}"
     "\\x{10d69}-\\x{10d6d}\\x{10eab}-\\x{10eac}\\x{10efc}-\\x{10eff}"
     "\\x{10f46}-\\x{10f50}\\x{10f82}-\\x{10f85}\\x{11001}\\x{11038}-\\x{11046}"
     "\\x{11070}\\x{11073}-\\x{11074}\\x{1107f}-\\x{11081}\\x{110b3}-\\x{110b6}"
     "\\x{110b9}-\\x{110ba}\\x{110c2}\\x{11100}-\\x{11102}\\x{11127}-\\x{1112b}"
     "\\x{1112d}-\\x{11134}\\x{11173}\\x{11180}-\\x{11181}\\x{111b6}-\\x{111be}"
     "\\x{111c9}-\\x{111cc}\\x{111cf}\\x{1122f}-\\x{11231}\\x{11234}"
     "\\x{11236}-\\x{11237}\\x{1123e}\\x{11241}\\x{112df}\\x{112e3}-\\x{112ea}"
     "\\x{11300}-\\x{11301}\\x{1133b}-\\x{1133c}\\x{11340}\\x{11366}-\\x{1136c}"
     "\\x{11370}-\\x{11374}\\x{113bb}-\\x{113c0}\\x{113ce}\\x{113d0}\\x{113d2}"
     "\\x{113e1}-\\x{113e2}\\x{11438}-\\x{1143f}\\x{11442}-\\x{11444}\\x{11446}"
     "\\x{1145e}\\x{114b3}-\\x{114b8}\\x{114ba}\\x{114bf}-\\x{114c0}"
     "\\x{114c2}-\\x{114c3}\\x{115b2}-\\x{115b5}\\x{115bc}-\\x{115bd}"
     "\\x{115bf}-\\x{115c0}\\x{115dc}-\\x{115dd}\\x{11633}-\\x{1163a}\\x{1163d}"
     "\\x{1163f}-\\x{11640}\\x{116ab}\\x{116ad}\\x{116b0}-\\x{116b5}\\x{116b7}"
     "\\x{1171d}\\x{1171f}\\x{11722}-\\x{11725}\\x{11727}-\\x{1172b}"
     "\\x{1182f}-\\x{11837}\\x{11839}-\\x{1183a}\\x{1193b}-\\x{1193c}\\x{1193e}"
     "\\x{11943}\\x{119d4}-\\x{119d7}\\x{119da}-\\x{119db}\\x{119e0}"
     "\\x{11a01}-\\x{11a0a}\\x{11a33}-\\x{11a38}\\x{11a3b}-\\x{11a3e}\\x{11a47}"
     "\\x{11a51}-\\x{11a56}\\x{11a59}-\\x{11a5b}\\x{11a8a}-\\x{11a96}"
     "\\x{11a98}-\\x{11a99}\\x{11c30}-\\x{11c36}\\x{11c38}-\\x{11c3d}\\x{11c3f}"
     "\\x{11c92}-\\x{11ca7}\\x{11caa}-\\x{11cb0}\\x{11cb2}-\\x{11cb3}"
     "\\x{11cb5}-\\x{11cb6}\\x{11d31}-\\x{11d36}\\x{11d3a}\\x{11d3c}-\\x{11d3d}"
     "\\x{11d3f}-\\x{11d45}\\x{11d47}\\x{11d90}-\\x{11d91}\\x{11d95}\\x{11d97}"
     "\\x{11ef3}-\\x{11ef4}\\x{11f00}-\\x{11f01}\\x{11f36}-\\x{11f3a}\\x{11f40}"
     "\\x{11f42}\\x{11f5a}\\x{13440}\\x{13447}-\\x{13455}\\x{1611e}-\\x{16129}"
     "\\x{1612d}-\\x{1612f}\\x{16af0}-\\x{16af4}\\x{16b30}-\\x{16b36}\\x{16f4f}"
     "\\x{16f8f}-\\x{16f92}\\x{16fe4}\\x{1bc9d}-\\x{1bc9e}\\x{1cf00}-\\x{1cf2d}"
     "\\x{1cf30}-\\x{1cf46}\\x{1d167}-\\x{1d169}\\x{1d17b}-\\x{1d182}"
     "\\x{1d185}-\\x{1d18b}\\x{1d1aa}-\\x{1d1ad}\\x{1d242}-\\x{1d244}"
     "\\x{1da00}-\\x{1da36}\\x{1da3b}-\\x{1da6c}\\x{1da75}\\x{1da84}"
     "\\x{1da9b}-\\x{1da9f}\\x{1daa1}-\\x{1daaf}\\x{1e000}-\\x{1e006}"
     "\\x{1e008}-\\x{1e018}\\x{1e01b}-\\x{1e021}\\x{1e023}-\\x{1e024}"
     "\\x{1e026}-\\x{1e02a}\\x{1e08f}\\x{1e130}-\\x{1e136}\\x{1e2ae}"
     "\\x{1e2ec}-\\x{1e2ef}\\x{1e4ec}-\\x{1e4ef}\\x{1e5ee}-\\x{1e5ef}"
     "\\x{1e8d0}-\\x{1e8d6}\\x{1e944}-\\x{1e94a}\\x{e0100}-\\x{e01ef}"},
    /* 23 code points in 13 ranges */
    {"Mc", false,
     "\\x{cf3}\\x{113b8}-\\x{113ba}\\x{113c2}\\x{113c5}\\x{113c7}-\\x{113ca}"
     "\\x{113cc}-\\x{113cd}\\x{113cf}\\x{1171e}\\x{11f03}\\x{11f34}-\\x{11f35}"
     "\\x{11f3e}-\\x{11f3f}\\x{11f41}\\x{1612a}-\\x{1612c}"},
    /* 120 code points in 10 ranges */
    {"N", false,
     "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}"
     "\\x{11f50}-\\x{11f59}\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}"
     "\\x{1ccf0}-\\x{1ccf9}\\x{1d2c0}-\\x{1d2d3}\\x{1e4f0}-\\x{1e4f9}"
     "\\x{1e5f1}-\\x{1e5fa}"},
    /* 100 code points in 9 ranges */
    {"Nd", false,
     "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}"
     "\\x{11f50}-\\x{11f59}\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}"
     "\\x{1ccf0}-\\x{1ccf9}\\x{1e4f0}-\\x{1e4f9}\\x{1e5f1}-\\x{1e5fa}"},
    /* 20 code points in 1 ranges */
    {"No", false, "\\x{1d2c0}-\\x{1d2d3}"},
    /* 36 code points in 10 ranges */
    {"P", false,
     "\\x{1b4e}-\\x{1b4f}\\x{1b7f}\\x{10d6e}\\x{113d4}-\\x{113d5}\\x{113d7}-\\x{113d8}"
     "\\x{11b00}-\\x{11b09}\\x{11be1}\\x{11f43}-\\x{11f4f}\\x{16d6d}-\\x{16d6f}"
     "\\x{1e5ff}"},
    /* 1 code points in 1 ranges */
    {"Pd", false, "\\x{10d6e}"},
    /* 35 code points in 9 ranges */
    {"Po", false,
     "\\x{1b4e}-\\x{1b4f}\\x{1b7f}\\x{113d4}-\\x{113d5}\\x{113d7}-\\x{113d8}"
     "\\x{11b00}-\\x{11b09}\\x{11be1}\\x{11f43}-\\x{11f4f}\\x{16d6d}-\\x{16d6f}"
     "\\x{1e5ff}"},
    /* 773 code points in 25 ranges */
    {"S", false,
     "\\x{2427}-\\x{2429}\\x{2ffc}-\\x{2fff}\\x{31e4}-\\x{31e5}\\x{31ef}"
     "\\x{10d8e}-\\x{10d8f}\\x{1cc00}-\\x{1ccef}\\x{1cd00}-\\x{1ceb3}\\x{1f6dc}"
     "\\x{1f774}-\\x{1f776}\\x{1f77b}-\\x{1f77f}\\x{1f7d9}\\x{1f8b2}-\\x{1f8bb}"
     "\\x{1f8c0}-\\x{1f8c1}\\x{1fa75}-\\x{1fa77}\\x{1fa87}-\\x{1fa89}\\x{1fa8f}"
     "\\x{1faad}-\\x{1faaf}\\x{1fabb}-\\x{1fabf}\\x{1fac6}\\x{1face}-\\x{1facf}"
     "\\x{1fada}-\\x{1fadc}\\x{1fadf}\\x{1fae8}-\\x{1fae9}\\x{1faf7}-\\x{1faf8}"
     "\\x{1fbcb}-\\x{1fbef}"},
    /* 2 code points in 1 ranges */
    {"Sm", false, "\\x{10d8e}-\\x{10d8f}"},
    /* 771 code points in 24 ranges */
    {"So", false,
     "\\x{2427}-\\x{2429}\\x{2ffc}-\\x{2fff}\\x{31e4}-\\x{31e5}\\x{31ef}"
     "\\x{1cc00}-\\x{1ccef}\\x{1cd00}-\\x{1ceb3}\\x{1f6dc}\\x{1f774}-\\x{1f776}"
     "\\x{1f77b}-\\x{1f77f}\\x{1f7d9}\\x{1f8b2}-\\x{1f8bb}\\x{1f8c0}-\\x{1f8c1}"
     "\\x{1fa75}-\\x{1fa77}\\x{1fa87}-\\x{1fa89}\\x{1fa8f}\\x{1faad}-\\x{1faaf}"
     "\\x{1fabb}-\\x{1fabf}\\x{1fac6}\\x{1face}-\\x{1facf}\\x{1fada}-\\x{1fadc}"
     "\\x{1fadf}\\x{1fae8}-\\x{1fae9}\\x{1faf7}-\\x{1faf8}\\x{1fbcb}-\\x{1fbef}"},
    /* HF's whole set, 99030 code points in 22 ranges */
    {"Han", true,
     "\\x{2e80}-\\x{2e99}\\x{2e9b}-\\x{2ef3}\\x{2f00}-\\x{2fd5}\\x{3005}\\x{3007}"
     "\\x{3021}-\\x{3029}\\x{3038}-\\x{303b}\\x{3400}-\\x{4dbf}\\x{4e00}-\\x{9fff}"
     "\\x{f900}-\\x{fa6d}\\x{fa70}-\\x{fad9}\\x{16fe2}-\\x{16fe3}\\x{16ff0}-\\x{16ff1}"
     "\\x{20000}-\\x{2a6df}\\x{2a700}-\\x{2b739}\\x{2b740}-\\x{2b81d}"
     "\\x{2b820}-\\x{2cea1}\\x{2ceb0}-\\x{2ebe0}\\x{2ebf0}-\\x{2ee5d}"
     "\\x{2f800}-\\x{2fa1d}\\x{30000}-\\x{3134a}\\x{31350}-\\x{323af}"},
};
static const char WHITE_SPACE[] = "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}"
                                  "\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

/* The entry of HF_CLASSES that pat (after "\p{") names, up to its '}'; *skip is the length of
 * "NAME}". */
static int hf_class(const char *pat, size_t len, size_t *skip)
{
    for (size_t k = 0; k < sizeof(HF_CLASSES) / sizeof(HF_CLASSES[0]); k++) {
        size_t n = strlen(HF_CLASSES[k].name);
        if (n < len && !memcmp(pat, HF_CLASSES[k].name, n) && pat[n] == '}') {
            *skip = n + 1;
            return (int)k;
        }
    }
    return -1;
}

/* Rewrites \p{..} and \P{..} of the classes in HF_CLASSES, \s and \S as described above, into
 * out (Oniguruma does not read the short \pL, so neither is it rewritten here).
 * Inside a character class the additions are spliced into the class; a negated one (\P, \S)
 * inside a class is left as it is (no model's pattern has one). */
static int hf_unicode(const char *pat, size_t len, TokBuf *out)
{
    bool in_class = false;
    size_t class_start = 0;
    out->len = 0;
    for (size_t i = 0; i < len;) {
        const char *add = NULL, *name = NULL;
        size_t skip = 0;
        bool neg = false;
        if (pat[i] == '\\' && i + 1 < len) {
            char c = pat[i + 1];
            int k;
            if ((c == 'p' || c == 'P') && i + 2 < len && pat[i + 2] == '{' &&
                (k = hf_class(pat + i + 3, len - (i + 3), &skip)) >= 0) {
                add = HF_CLASSES[k].hf;
                name = HF_CLASSES[k].whole ? NULL : HF_CLASSES[k].name;
                neg = c == 'P';
                skip += 3;
            } else if (c == 's' || c == 'S') {
                add = WHITE_SPACE;
                neg = c == 'S';
                skip = 2;
            }
            if (!add || (in_class && neg)) {
                if (tokbuf_append(out, pat + i, 2))
                    return PAGODA_ENOMEM;
                i += 2;
                continue;
            }
            int rc = in_class ? 0 : tokbuf_append(out, neg ? "[^" : "[", neg ? 2 : 1);
            if (!rc && name) /* PCRE2's class, then what it lacks */
                rc = tokbuf_append(out, "\\p{", 3);
            if (!rc && name)
                rc = tokbuf_append(out, name, strlen(name));
            if (!rc && name)
                rc = tokbuf_append(out, "}", 1);
            if (!rc)
                rc = tokbuf_append(out, add, strlen(add));
            if (!rc && !in_class)
                rc = tokbuf_append(out, "]", 1);
            if (rc)
                return rc;
            i += skip;
            continue;
        }
        if (!in_class && pat[i] == '[') {
            in_class = true;
            class_start = i + 1 + (i + 1 < len && pat[i + 1] == '^');
        } else if (in_class && pat[i] == '[' && i + 1 < len && pat[i + 1] == ':') {
            const char *end = strstr(pat + i, ":]"); /* a POSIX class: copied whole */
            size_t n = end ? (size_t)(end - (pat + i)) + 2 : len - i;
            if (tokbuf_append(out, pat + i, n))
                return PAGODA_ENOMEM;
            i += n;
            continue;
        } else if (in_class && pat[i] == ']' && i != class_start) {
            in_class = false;
        }
        if (tokbuf_append(out, pat + i, 1))
            return PAGODA_ENOMEM;
        i++;
    }
    return tokbuf_reserve(out, 0);
}

/* PCRE2's message for an error code (of pcre2_compile or pcre2_match). */
static void compile_error(int code, char *buf, size_t len)
{
    pcre2_get_error_message(code, (PCRE2_UCHAR *)buf, len);
}

static int compile_regex(const char *pat, size_t len, uint32_t extra, const char *path,
                         pcre2_code **re, bool *jit)
{
    int err;
    PCRE2_SIZE off;
    /* PCRE2_LITERAL takes no UCP (nothing in a literal depends on it) */
    uint32_t opts = PCRE2_UTF | extra | ((extra & PCRE2_LITERAL) ? 0 : PCRE2_UCP);
    TokBuf hf = {0};
    if (!(extra & PCRE2_LITERAL)) {
        if (hf_unicode(pat, len, &hf)) {
            tokbuf_fini(&hf);
            return PAGODA_ENOMEM;
        }
        pat = hf.data;
        len = hf.len;
    }
    *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &off, NULL);
    tokbuf_fini(&hf);
    if (!*re) {
        char msg[128];
        compile_error(err, msg, sizeof(msg));
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.pattern: PCRE2 refuses it at %zu: %s",
                                path, (size_t)off, msg);
    }
    uint32_t have_jit = 0;
    pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
    *jit = have_jit && pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

/* ---- finding the cuts ---- */

static int match_push(TokScratch *s, uint32_t start, uint32_t end, bool is_match)
{
    if (s->nmatches == s->cap_matches) {
        size_t cap = s->cap_matches ? s->cap_matches * 2 : 256;
        TokMatch *m = realloc(s->matches, cap * sizeof(*m));
        if (!m)
            return PAGODA_ENOMEM;
        s->matches = m;
        s->cap_matches = cap;
    }
    s->matches[s->nmatches++] = (TokMatch){start, end, is_match};
    return 0;
}

/* HF's Pattern::find_matches for a regex: the matches and the text between them. */
static int regex_matches(const TokPreTokenizer *p, const char *text, size_t len, TokScratch *s)
{
    s->nmatches = 0;
    if (!s->md && !(s->md = pcre2_match_data_create(1, NULL)))
        return PAGODA_ENOMEM;
    size_t prev = 0, at = 0, last_end = SIZE_MAX;
    while (at <= len) {
        int rc;
        if (p->jit)
            rc = pcre2_jit_match(p->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK, s->md, NULL);
        else
            rc = pcre2_match(p->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK, s->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
            rc = pcre2_match(p->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK | 0, s->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            char why[128];
            compile_error(rc, why, sizeof(why)); /* "match limit exceeded", ... */
            return pagoda_error_set(PAGODA_EINVAL,
                                    "pre-tokenizer regex: %s (PCRE2 error %d) at byte %zu of %zu",
                                    why, rc, at, len);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        /* Oniguruma's find_iter skips an empty match right after a match ("a*" on "aab":
         * "aa", then not "" before the b) */
        if (ms == me && me == last_end) {
            if (me >= len)
                break;
            size_t adv;
            tok_utf8_decode(text + me, len - me, &adv);
            at = me + adv;
            continue;
        }
        last_end = me;
        if (prev != ms && match_push(s, (uint32_t)prev, (uint32_t)ms, false))
            return PAGODA_ENOMEM;
        if (match_push(s, (uint32_t)ms, (uint32_t)me, true))
            return PAGODA_ENOMEM;
        prev = me;
        if (me > at) {
            at = me;
        } else { /* an empty match: step over one character */
            if (me >= len)
                break;
            size_t adv;
            tok_utf8_decode(text + me, len - me, &adv);
            at = me + adv;
        }
    }
    if (prev != len && match_push(s, (uint32_t)prev, (uint32_t)len, false))
        return PAGODA_ENOMEM;
    return 0;
}

/* HF's Pattern::find_matches for a character predicate: each matching character alone. */
static int char_matches(const char *text, size_t len, bool (*pred)(uint32_t, uint32_t),
                        uint32_t arg, TokScratch *s)
{
    s->nmatches = 0;
    size_t last = 0;
    for (size_t i = 0; i < len;) {
        size_t adv;
        uint32_t cp = tok_utf8_decode(text + i, len - i, &adv);
        if (pred(cp, arg)) {
            if (last < i && match_push(s, (uint32_t)last, (uint32_t)i, false))
                return PAGODA_ENOMEM;
            if (match_push(s, (uint32_t)i, (uint32_t)(i + adv), true))
                return PAGODA_ENOMEM;
            last = i + adv;
        }
        i += adv;
    }
    if (len > last && match_push(s, (uint32_t)last, (uint32_t)len, false))
        return PAGODA_ENOMEM;
    return 0;
}

static bool pred_char(uint32_t cp, uint32_t want)
{
    return cp == want;
}

static bool pred_numeric(uint32_t cp, uint32_t unused)
{
    (void)unused;
    return tok_is_numeric(cp);
}

/* Applies a delimiter behavior to s->matches (in place: is_match becomes "remove"). */
static void apply_behavior(TokScratch *s, TokSplitBehavior b)
{
    TokMatch *m = s->matches;
    size_t n = s->nmatches, k = 0;
    bool prev = false;
    switch (b) {
    case TOK_SPLIT_REMOVED:
        return;
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++)
            m[i].is_match = false;
        return;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = m[i].is_match;
            if (is == prev && k > 0)
                m[k - 1].end = m[i].end;
            else
                m[k++] = (TokMatch){m[i].start, m[i].end, false};
            prev = is;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = m[i].is_match;
            if (is && !prev && k > 0)
                m[k - 1].end = m[i].end;
            else
                m[k++] = (TokMatch){m[i].start, m[i].end, false};
            prev = is;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        /* folded from the end, as HF does, then the list is the right way round again */
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            bool is = m[i].is_match;
            if (is && !prev && w < n)
                m[w].start = m[i].start;
            else
                m[--w] = (TokMatch){m[i].start, m[i].end, false};
            prev = is;
        }
        memmove(m, m + w, (n - w) * sizeof(*m));
        k = n - w;
        break;
    }
    }
    s->nmatches = k;
}

/* Pushes the kept, non-empty cuts of text as pieces. */
static int push_cuts(TokPieces *out, const char *text, bool at_start, TokScratch *s)
{
    for (size_t i = 0; i < s->nmatches; i++) {
        const TokMatch *m = &s->matches[i];
        if (m->is_match || m->end == m->start)
            continue;
        if (tokpieces_push(out, text + m->start, m->end - m->start, -1, at_start && m->start == 0))
            return PAGODA_ENOMEM;
    }
    return 0;
}

/* ---- the stages ---- */

static int split_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                       TokPieces *out, TokScratch *s)
{
    int rc = regex_matches(p, text, len, s);
    if (rc)
        return rc;
    if (p->invert)
        for (size_t i = 0; i < s->nmatches; i++)
            s->matches[i].is_match = !s->matches[i].is_match;
    apply_behavior(s, p->behavior);
    return push_cuts(out, text, at_start, s);
}

/* Maps the bytes of text[0..len) to their GPT-2 characters, appended to out as one piece. */
static int push_bytelevel(TokPieces *out, const char *text, size_t len, bool at_start)
{
    /* an empty piece first, then its text written in place */
    if (tokpieces_push(out, "", 0, -1, at_start) || tokbuf_reserve(&out->buf, 2 * len))
        return PAGODA_ENOMEM;
    size_t off = out->buf.len;
    char *w = out->buf.data + off;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)text[i];
        if (b >= 33 && b <= 126)
            *w++ = (char)b;
        else
            w += tok_utf8_encode(byte_to_cp(b), w);
    }
    size_t n = (size_t)(w - (out->buf.data + off));
    out->spans[out->n - 1].len = (uint32_t)n;
    out->buf.len = off + n;
    out->buf.data[out->buf.len] = 0;
    return 0;
}

static int bytelevel_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                           TokPieces *out, TokScratch *s)
{
    const char *src = text;
    if (p->add_prefix_space && (len == 0 || text[0] != ' ')) {
        s->tmp.len = 0;
        if (tokbuf_append(&s->tmp, " ", 1) || tokbuf_append(&s->tmp, text, len))
            return PAGODA_ENOMEM;
        src = s->tmp.data;
        len += 1;
    }
    if (!p->re)
        return push_bytelevel(out, src, len, at_start);
    int rc = regex_matches(p, src, len, s);
    if (rc)
        return rc;
    for (size_t i = 0; i < s->nmatches; i++) {
        const TokMatch *m = &s->matches[i];
        if (m->end > m->start &&
            push_bytelevel(out, src + m->start, m->end - m->start, at_start && m->start == 0))
            return PAGODA_ENOMEM;
    }
    return 0;
}

static int metaspace_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                           TokPieces *out, TokScratch *s)
{
    char rep[4];
    size_t rlen = tok_utf8_encode(p->replacement, rep);
    TokBuf *b = &s->tmp;
    b->len = 0;
    bool starts = len >= rlen && memcmp(text, rep, rlen) == 0;
    bool space0 = len > 0 && text[0] == ' '; /* becomes the replacement below */
    bool prepend = !starts && !space0 &&
                   (p->prepend_scheme == TOK_PREPEND_ALWAYS ||
                    (p->prepend_scheme == TOK_PREPEND_FIRST && at_start));
    if (prepend && tokbuf_append(b, rep, rlen))
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != ' ')
            j++;
        if (tokbuf_append(b, text + i, j - i))
            return PAGODA_ENOMEM;
        if (j < len && tokbuf_append(b, rep, rlen))
            return PAGODA_ENOMEM;
        i = j + 1;
    }
    if (!p->split)
        return b->len ? tokpieces_push(out, b->data, b->len, -1, at_start) : 0;
    int rc = char_matches(b->data, b->len, pred_char, p->replacement, s);
    if (rc)
        return rc;
    apply_behavior(s, TOK_SPLIT_MERGED_WITH_NEXT);
    return push_cuts(out, b->data, at_start, s);
}

static int digits_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                        TokPieces *out, TokScratch *s)
{
    int rc = char_matches(text, len, pred_numeric, 0, s);
    if (rc)
        return rc;
    apply_behavior(s, p->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS);
    return push_cuts(out, text, at_start, s);
}

int tok_pretokenize(const TokPreTokenizer *chain, size_t n, TokPieces **in, TokPieces **out,
                    TokScratch *s)
{
    for (size_t k = 0; k < n; k++) {
        const TokPreTokenizer *p = &chain[k];
        TokPieces *src = *in, *dst = *out;
        tokpieces_clear(dst);
        for (size_t i = 0; i < src->n; i++) {
            const TokSpan *sp = &src->spans[i];
            const char *text = src->buf.data + sp->off;
            int rc;
            if (sp->id >= 0) {
                rc = tokpieces_push(dst, text, sp->len, sp->id, sp->at_start);
            } else {
                switch (p->kind) {
                case TOK_PRE_SPLIT:
                    rc = split_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                case TOK_PRE_BYTELEVEL:
                    rc = bytelevel_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                case TOK_PRE_METASPACE:
                    rc = metaspace_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                default:
                    rc = digits_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                }
            }
            if (rc)
                return rc;
        }
        *in = dst;
        *out = src;
    }
    return 0;
}

/* ---- loading ---- */

static int get_bool(const json_t *j, const char *key, const char *path, bool def, bool *out)
{
    const json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return pagoda_error_set(PAGODA_EFORMAT, "%s.%s: not a boolean", path, key);
    *out = json_is_true(v);
    return 0;
}

static int parse_split(const json_t *j, const char *path, TokPreTokenizer *p)
{
    const json_t *pat = json_object_get(j, "pattern");
    const json_t *beh = json_object_get(j, "behavior");
    if (!json_is_object(pat))
        return pagoda_error_set(PAGODA_EFORMAT, "%s.pattern: not an object", path);
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    const json_t *src = json_is_string(re) ? re : str;
    if (!json_is_string(src) || json_string_length(src) > TOK_MAX_REGEX_BYTES)
        return pagoda_error_set(PAGODA_EFORMAT, "%s.pattern: neither String nor Regex", path);
    if (json_string_length(src) == 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.pattern: an empty pattern", path);
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    int b = -1;
    for (int i = 0; json_is_string(beh) && i < 5; i++)
        if (strcmp(json_string_value(beh), names[i]) == 0)
            b = i;
    if (b < 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.behavior: %s is not supported", path,
                                json_is_string(beh) ? json_string_value(beh) : "(not a string)");
    p->kind = TOK_PRE_SPLIT;
    p->behavior = (TokSplitBehavior)b;
    int rc = get_bool(j, "invert", path, false, &p->invert);
    if (rc)
        return rc;
    return compile_regex(json_string_value(src), json_string_length(src),
                         src == str ? PCRE2_LITERAL : 0, path, &p->re, &p->jit);
}

static int parse_metaspace(const json_t *j, const char *path, TokPreTokenizer *p)
{
    p->kind = TOK_PRE_METASPACE;
    const json_t *rep = json_object_get(j, "replacement");
    if (!json_is_string(rep))
        return pagoda_error_set(PAGODA_EFORMAT, "%s.replacement: not a string", path);
    size_t adv;
    const char *r = json_string_value(rep);
    size_t rlen = json_string_length(rep);
    p->replacement = rlen ? tok_utf8_decode(r, rlen, &adv) : 0;
    if (!rlen || adv != rlen)
        return pagoda_error_set(PAGODA_EFORMAT, "%s.replacement: not one character", path);
    int rc = get_bool(j, "split", path, true, &p->split);
    if (rc)
        return rc;
    const json_t *scheme = json_object_get(j, "prepend_scheme");
    if (json_is_string(scheme)) {
        const char *s = json_string_value(scheme);
        if (strcmp(s, "always") == 0)
            p->prepend_scheme = TOK_PREPEND_ALWAYS;
        else if (strcmp(s, "first") == 0)
            p->prepend_scheme = TOK_PREPEND_FIRST;
        else if (strcmp(s, "never") == 0)
            p->prepend_scheme = TOK_PREPEND_NEVER;
        else
            return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.prepend_scheme: %s", path, s);
        return 0;
    }
    /* older files: add_prefix_space true is "always" */
    bool aps = true;
    rc = get_bool(j, "add_prefix_space", path, true, &aps);
    p->prepend_scheme = aps ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    return rc;
}

static int parse_one(const json_t *j, const char *path, TokPreTokenizer *chain, size_t *n,
                     int depth)
{
    if (json_is_null(j))
        return 0;
    const json_t *type = json_object_get(j, "type");
    if (!json_is_object(j) || !json_is_string(type))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: not an object with a type", path);
    const char *t = json_string_value(type);
    if (strcmp(t, "Sequence") == 0) {
        const json_t *list = json_object_get(j, "pretokenizers");
        if (!json_is_array(list))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.pretokenizers: not an array", path);
        if (depth > 4)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: Sequences nested too deep", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof(sub), "%s.pretokenizers[%zu]", path, i);
            int rc = parse_one(json_array_get(list, i), sub, chain, n, depth + 1);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (*n >= TOK_MAX_STAGES)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: more than %u pre-tokenizers", path,
                                TOK_MAX_STAGES);
    TokPreTokenizer *p = &chain[*n];
    memset(p, 0, sizeof(*p));
    int rc;
    if (strcmp(t, "Split") == 0) {
        rc = parse_split(j, path, p);
    } else if (strcmp(t, "ByteLevel") == 0) {
        p->kind = TOK_PRE_BYTELEVEL;
        bool use_regex = true;
        rc = get_bool(j, "add_prefix_space", path, true, &p->add_prefix_space);
        if (!rc)
            rc = get_bool(j, "use_regex", path, true, &use_regex);
        if (!rc && use_regex)
            rc = compile_regex(GPT2_PATTERN, sizeof(GPT2_PATTERN) - 1, 0, path, &p->re, &p->jit);
    } else if (strcmp(t, "Metaspace") == 0) {
        rc = parse_metaspace(j, path, p);
    } else if (strcmp(t, "Digits") == 0) {
        p->kind = TOK_PRE_DIGITS;
        rc = get_bool(j, "individual_digits", path, false, &p->individual_digits);
    } else {
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: pre-tokenizer type %s is not supported",
                                path, t);
    }
    (*n)++; /* counted even on error, so that fini frees what it compiled */
    return rc;
}

int tok_pretokenizer_parse(const void *json, const char *path, TokPreTokenizer *chain, size_t *n)
{
    *n = 0;
    if (!json)
        return 0;
    return parse_one(json, path, chain, n, 0);
}

void tok_pretokenizers_fini(TokPreTokenizer *chain, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pcre2_code_free(chain[i].re);
}
