# Finds the Debian packages pagoda depends on, and NNG (see below). With PAGODA_STATIC_DEPS the
# static archives are preferred, so that a binary built here runs on a machine where none of them
# is installed.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

# pagoda_find_lib(VAR NAME): the library NAME, static archive first when asked for.
function(pagoda_find_lib var name)
  if(PAGODA_STATIC_DEPS)
    find_library(${var} NAMES lib${name}.a ${name} REQUIRED)
  else()
    find_library(${var} NAMES ${name} REQUIRED)
  endif()
endfunction()

pagoda_find_lib(PAGODA_JANSSON_LIB jansson)
pagoda_find_lib(PAGODA_XXHASH_LIB xxhash)
pagoda_find_lib(PAGODA_PROTOBUF_C_LIB protobuf-c)
# The tokenizer's: PCRE2 (8-bit code units, pre-tokenizer regexes with UTF and UCP) and utf8proc
# (normalization). The static PCRE2 archive needs PCRE2_STATIC before its header.
pagoda_find_lib(PAGODA_PCRE2_LIB pcre2-8)
pagoda_find_lib(PAGODA_UTF8PROC_LIB utf8proc)
# NNG: always the static libnng.a that scripts/install-deps builds from Debian's source package
# with scripts/nng.patch (Debian's 1.5.2 has nanomsg/nng#1518: a peer that drops during the
# handshake stops a listener for good; #1713: a message sent on a closing pipe leaks; and a close
# that loses a large transfer's completion hangs nng_close: the patch's header), never Debian's
# own. Its headers come from the same
# prefix and are searched before /usr/include. The stamp the install writes holds the patch's
# SHA-256; without it, or with another patch's, the build stops here.
set(PAGODA_NNG_PREFIX "/opt/pagoda/nng" CACHE PATH "Where scripts/install-deps installs NNG")
set(_pagoda_nng_patch "${PROJECT_SOURCE_DIR}/scripts/nng.patch")
file(SHA256 "${_pagoda_nng_patch}" _pagoda_nng_want)
set(_pagoda_nng_have "")
if(EXISTS "${PAGODA_NNG_PREFIX}/pagoda-nng.stamp")
  file(STRINGS "${PAGODA_NNG_PREFIX}/pagoda-nng.stamp" _pagoda_nng_have LIMIT_COUNT 1)
  string(REGEX REPLACE " .*" "" _pagoda_nng_have "${_pagoda_nng_have}")
endif()
if(NOT _pagoda_nng_have STREQUAL _pagoda_nng_want)
  message(FATAL_ERROR "NNG in ${PAGODA_NNG_PREFIX} is missing or not built with "
          "scripts/nng.patch (no stamp with its SHA-256 ${_pagoda_nng_want}). Debian's NNG "
          "1.5.2 has nanomsg/nng#1518 (a peer that drops during the handshake stops a listener "
          "for good), so pagoda does not build with it: run scripts/install-deps as root.")
endif()
find_library(PAGODA_NNG_ARCHIVE NAMES libnng.a PATHS "${PAGODA_NNG_PREFIX}/lib" NO_DEFAULT_PATH
             REQUIRED)
# (A new cache name: build folders configured before this keep PAGODA_NNG_LIB, Debian's.)
# -DPAGODA_NNG_ARCHIVE=... names another archive (how tests/integration/listener_test.c was shown
# to fail with Debian's own libnng.a): allowed, never silently.
if(NOT PAGODA_NNG_ARCHIVE STREQUAL "${PAGODA_NNG_PREFIX}/lib/libnng.a")
  message(WARNING "PAGODA_NNG_ARCHIVE is ${PAGODA_NNG_ARCHIVE}, not the patched NNG of "
          "${PAGODA_NNG_PREFIX}: listeners may stop for good after a peer that drops during the "
          "handshake (nanomsg/nng#1518)")
endif()
add_library(pagoda_nng STATIC IMPORTED)
set_target_properties(pagoda_nng PROPERTIES IMPORTED_LOCATION "${PAGODA_NNG_ARCHIVE}"
                      INTERFACE_INCLUDE_DIRECTORIES "${PAGODA_NNG_PREFIX}/include")

if(PAGODA_STATIC_DEPS)
  find_library(PAGODA_UV_LIB NAMES libuv_a.a uv REQUIRED)
  # libnng.a is built with TLS support through mbedtls, as Debian builds it.
  find_library(PAGODA_MBEDTLS_LIB NAMES libmbedtls.a REQUIRED)
  find_library(PAGODA_MBEDX509_LIB NAMES libmbedx509.a REQUIRED)
  find_library(PAGODA_MBEDCRYPTO_LIB NAMES libmbedcrypto.a REQUIRED)
else()
  find_library(PAGODA_UV_LIB NAMES uv REQUIRED)
  find_library(PAGODA_MBEDTLS_LIB NAMES mbedtls REQUIRED)
  find_library(PAGODA_MBEDX509_LIB NAMES mbedx509 REQUIRED)
  find_library(PAGODA_MBEDCRYPTO_LIB NAMES mbedcrypto REQUIRED)
endif()
set(PAGODA_NNG_LIBS pagoda_nng ${PAGODA_MBEDTLS_LIB} ${PAGODA_MBEDX509_LIB} ${PAGODA_MBEDCRYPTO_LIB}
    Threads::Threads)

find_program(PAGODA_PROTOC_C NAMES protoc-c REQUIRED)

# CMocka: Debian's config gives CMOCKA_LIBRARIES and CMOCKA_INCLUDE_DIR.
find_package(cmocka REQUIRED)

# llhttp: Debian's node-llhttp ships its generated C sources (llhttp 8.1); http/CMakeLists.txt
# builds them as the static library pagoda_llhttp (there, after the fuzz build's flags, so that
# the fuzzer sees the parser's coverage too).
find_path(PAGODA_LLHTTP_INCLUDE_DIR llhttp.h PATHS /usr/share/include/llhttp NO_DEFAULT_PATH)
find_path(PAGODA_LLHTTP_SOURCE_DIR llhttp.c PATHS /usr/share/llhttp NO_DEFAULT_PATH)
if(NOT PAGODA_LLHTTP_INCLUDE_DIR OR NOT PAGODA_LLHTTP_SOURCE_DIR)
  message(FATAL_ERROR "llhttp's C sources are missing (/usr/share/llhttp/llhttp.c, "
          "/usr/share/include/llhttp/llhttp.h): run scripts/install-deps as root (node-llhttp)")
endif()
