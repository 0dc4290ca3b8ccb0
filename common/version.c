#include "common/version.h"

const char *pagoda_version(void)
{
    return PAGODA_VERSION;
}
