/* Native return addresses of the calling thread, for allocation sites. */
#include "site.h"

#include <execinfo.h>

int tally__unwind(void **frames, int max)
{
    return backtrace(frames, max);
}
