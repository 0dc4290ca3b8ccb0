/* Opening a file that must be a regular file, without blocking on what stands in its place. */
#ifndef PAGODA_COMMON_FILE_H
#define PAGODA_COMMON_FILE_H

#include <sys/stat.h>

/* Opens path for reading (O_CLOEXEC, O_NOCTTY; symbolic links followed) with O_NONBLOCK, so that
 * a FIFO in the file's place does not hold the open until a writer comes (a worker's start, a
 * router's reload, for ever), then checks what was opened (fstat on the descriptor, not stat on
 * the path, which may change in between) before a byte is read: anything but a regular file is
 * refused with not_regular (the caller's error code) and a detail "PATH: not a regular file (a
 * FIFO)" (a directory, a device, a socket). A regular file's reads and mappings ignore the flag.
 * On success *fd is the caller's to close and *st describes it. Other errors: the open's
 * (pagoda_from_errno: PAGODA_ENOENT, PAGODA_EPERM, ...; "PATH: cannot open: REASON"),
 * PAGODA_EIO (fstat). */
int file_open_regular(const char *path, int not_regular, int *fd, struct stat *st);

/* What a file of this mode is, for a message: "a regular file", "a directory", "a FIFO",
 * "a socket", "a device" or "not a regular file". */
const char *file_kind(mode_t mode);

#endif
