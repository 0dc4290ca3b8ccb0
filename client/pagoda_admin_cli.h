/* The `pagoda admin ...` commands of the pagoda command-line client (pagoda_admin_cli.c), on
 * libpagoda's admin calls (pagoda_admin.h). */
#ifndef PAGODA_CLIENT_PAGODA_ADMIN_CLI_H
#define PAGODA_CLIENT_PAGODA_ADMIN_CLI_H

#include <stdio.h>

/* Prints the admin commands' usage to f. */
void admin_cli_usage(FILE *f);

/* Runs `admin OP ...`: argv[0] is "admin". url and api_key (NULL: none) come from the global
 * flags. Returns the exit status: 0 done, 1 the router refused or failed, 2 bad flags. */
int admin_cli_main(const char *url, const char *api_key, int argc, char **argv);

#endif
