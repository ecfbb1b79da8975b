/* Linked statically, so that LD_PRELOAD never reaches it: creates the file
 * named by its argument, relative to the kernel's current directory, and
 * prints that directory. Exits 1 when the file cannot be created. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int fd = open(argc > 1 ? argv[1] : "static-was-here", O_CREAT | O_WRONLY, 0644);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    write(fd, "x\n", 2);
    close(fd);
    char buf[4096];
    if (getcwd(buf, sizeof buf))
        printf("%s\n", buf);
    return 0;
}
