/* pagoda's version: the project's (CMakeLists.txt, project(... VERSION)), its one definition,
 * which common/CMakeLists.txt hands to version.c. */
#ifndef PAGODA_COMMON_VERSION_H
#define PAGODA_COMMON_VERSION_H

/* "MAJOR.MINOR.PATCH", in static storage. */
const char *pagoda_version(void);

#endif
