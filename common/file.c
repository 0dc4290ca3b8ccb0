/* Opening a file that must be a regular file (file.h). */
#include "common/file.h"

#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

const char *file_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode) || S_ISBLK(mode))
        return "a device";
    return "not a regular file";
}

int file_open_regular(const char *path, int not_regular, int *fd, struct stat *st)
{
    *fd = -1;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0) {
        int e = errno;
        return pagoda_error_set(pagoda_from_errno(e), "%s: cannot open: %s", path, strerror(e));
    }
    if (fstat(f, st) != 0) {
        int e = errno;
        close(f);
        return pagoda_error_set(PAGODA_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(f);
        return pagoda_error_set(not_regular, "%s: not a regular file (%s)", path,
                                file_kind(st->st_mode));
    }
    *fd = f;
    return 0;
}
