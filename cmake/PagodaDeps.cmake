# Finds the Debian packages pagoda depends on. With PAGODA_STATIC_DEPS the static archives are
# preferred, so that a binary built here runs on a machine where none of them is installed.
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
pagoda_find_lib(PAGODA_NNG_LIB nng)
if(PAGODA_STATIC_DEPS)
  find_library(PAGODA_UV_LIB NAMES libuv_a.a uv REQUIRED)
  # Debian's libnng.a is built with TLS support through mbedtls.
  find_library(PAGODA_MBEDTLS_LIB NAMES libmbedtls.a REQUIRED)
  find_library(PAGODA_MBEDX509_LIB NAMES libmbedx509.a REQUIRED)
  find_library(PAGODA_MBEDCRYPTO_LIB NAMES libmbedcrypto.a REQUIRED)
  set(PAGODA_NNG_LIBS ${PAGODA_NNG_LIB} ${PAGODA_MBEDTLS_LIB} ${PAGODA_MBEDX509_LIB}
      ${PAGODA_MBEDCRYPTO_LIB} Threads::Threads)
else()
  find_library(PAGODA_UV_LIB NAMES uv REQUIRED)
  set(PAGODA_NNG_LIBS ${PAGODA_NNG_LIB} Threads::Threads)
endif()

find_program(PAGODA_PROTOC_C NAMES protoc-c REQUIRED)

# CMocka: Debian's config gives CMOCKA_LIBRARIES and CMOCKA_INCLUDE_DIR.
find_package(cmocka REQUIRED)
