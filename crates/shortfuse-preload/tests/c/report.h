/* What the test programs print for each call: its name and "ok" or the
 * errno name, one line each, flushed (a crash keeps what came before). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

static void show(const char *what, long r) {
    if (r < 0)
        printf("%s: %s\n", what, strerrorname_np(errno));
    else
        printf("%s: ok\n", what);
    fflush(stdout);
}
