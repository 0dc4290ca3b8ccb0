/* Test helper: how many descriptors a process holds (its /proc/PID/fd entries), for tests that
 * check that nothing leaks one. -1 when the directory cannot be read. */
#ifndef PAGODA_TESTS_UNIT_PROC_FDS_H
#define PAGODA_TESTS_UNIT_PROC_FDS_H

#include <dirent.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

/* The count for pid, leaving out the one this function opens when pid is this process. */
static inline int proc_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return pid == getpid() ? n - 1 : n;
}

#endif
