/* Fills every vector register (zmm0-31), the mask registers k0-7 and MXCSR
 * with known values, makes one system call with the `syscall` instruction
 * in the same block of assembly, and reports every register that came back
 * changed. The kernel's system call ABI preserves all of them, so a program
 * may keep values there across its own `syscall` (compilers do across
 * inline system calls), and a call the shim serves must too.
 *
 * Usage: vector_registers DIR, where DIR/f is a name the shim serves and
 * does not exist outside it. Prints "ok" and the calls' results, or the
 * registers that changed. Needs AVX-512 (F and BW): build with -mavx512bw. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

struct regs {
    uint8_t z[32][64];
    uint64_t k[8];
    uint32_t mxcsr;
    uint32_t program_mxcsr; /* put back after the check */
} __attribute__((aligned(64)));

static struct regs want, got;
static int failures;

/* The part of `call` after the vector registers are loaded, in both of its
 * forms: the masks and MXCSR loaded, the system call, every register stored
 * to `got`, the program's MXCSR back; with the operands and clobbers. */
#define CALL_AND_STORE                                                                                             \
    ".irp i,0,1,2,3,4,5,6,7\n kmovq (2048+\\i*8)(%[w]), %%k\\i\n .endr\n"                                       \
    "ldmxcsr 2112(%[w])\n"                                                                                         \
    "syscall\n"                                                                                                    \
    ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31\n vmovdqu64 %%zmm\\i, (\\i*64)(%[g])\n .endr\n" \
    ".irp i,0,1,2,3,4,5,6,7\n kmovq %%k\\i, (2048+\\i*8)(%[g])\n .endr\n"                                       \
    "stmxcsr 2112(%[g])\n"                                                                                         \
    "ldmxcsr 2116(%[w])\n"                                                                                         \
    : "=a"(ret)                                                                                                    \
    : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), [w] "r"(&want), [g] "r"(&got)                                 \
    : "rcx", "r11", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",       \
      "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21",  \
      "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k0", "k1", "k2",  \
      "k3", "k4", "k5", "k6", "k7"

/* One system call between a load and a store of every register. `clean`:
 * zmm0-15 are loaded as xmm (VEX zero-extends them), so their upper halves
 * are zero and, after vzeroupper, not in use; the call must leave them so. */
__attribute__((noinline)) static long call(long nr, long a1, long a2, long a3, long a4, int clean) {
    register long r10 __asm__("r10") = a4;
    long ret;
    if (clean) {
        __asm__ volatile(
            "vzeroupper\n"
            ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n vmovdqu (\\i*64)(%[w]), %%xmm\\i\n .endr\n"
            ".irp i,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31\n vmovdqu64 (\\i*64)(%[w]), %%zmm\\i\n .endr\n"
            CALL_AND_STORE);
    } else {
        __asm__ volatile(
            ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31\n vmovdqu64 (\\i*64)(%[w]), %%zmm\\i\n .endr\n"
            CALL_AND_STORE);
    }
    return ret;
}

static long check(const char *what, long nr, long a1, long a2, long a3, long a4, int clean) {
    uint32_t saved = want.mxcsr;
    memset(&got, 0xee, sizeof got);
    __asm__ volatile("stmxcsr %0" : "=m"(want.program_mxcsr));
    long r = call(nr, a1, a2, a3, a4, clean);
    for (int i = 0; i < 32; i++) {
        uint8_t expect[64];
        memcpy(expect, want.z[i], 64);
        if (clean && i < 16)
            memset(expect + 16, 0, 48);
        if (memcmp(expect, got.z[i], 64) != 0) {
            int first = 0;
            while (expect[first] == got.z[i][first])
                first++;
            printf("%s%s: zmm%d changed (first at byte %d)\n", what, clean ? " clean" : "", i, first);
            failures++;
        }
    }
    for (int i = 0; i < 8; i++)
        if (want.k[i] != got.k[i]) {
            printf("%s%s: k%d changed\n", what, clean ? " clean" : "", i);
            failures++;
        }
    if (got.mxcsr != saved) {
        printf("%s%s: mxcsr %x, not %x\n", what, clean ? " clean" : "", got.mxcsr, saved);
        failures++;
    }
    return r;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    for (int i = 0; i < 32; i++)
        for (int j = 0; j < 64; j++)
            want.z[i][j] = (uint8_t)(i * 64 + j) * 37 + 11;
    for (int i = 0; i < 8; i++)
        want.k[i] = 0x0123456789abcdefULL * (i + 3);
    /* Rounding toward zero, every exception masked, denormals as zero. */
    want.mxcsr = 0x7fc0;
    char path[4096];
    snprintf(path, sizeof path, "%s/f", argv[1]);
    struct stat st;
    for (int clean = 0; clean < 2; clean++)
        for (int round = 0; round < 3; round++) {
            long fd = check("open on the mount", SYS_openat, AT_FDCWD, (long)path, O_CREAT | O_RDWR, 0644, clean);
            long w = check("write on the mount", SYS_write, fd, (long)"0123456789", 10, 0, clean);
            long s = check("stat on the mount", SYS_newfstatat, AT_FDCWD, (long)path, (long)&st, 0, clean);
            long c = check("close on the mount", SYS_close, fd, 0, 0, 0, clean);
            long n = check("open elsewhere", SYS_openat, AT_FDCWD, (long)"/dev/null", O_RDONLY, 0, clean);
            long m = check("stat elsewhere", SYS_newfstatat, AT_FDCWD, (long)"/", (long)&st, 0, clean);
            check("close elsewhere", SYS_close, n, 0, 0, 0, clean);
            long p = check("getppid", SYS_getppid, 0, 0, 0, 0, clean);
            if (fd < 0 || w != 10 || s != 0 || c != 0 || n < 0 || m != 0 || p <= 0) {
                printf("calls failed: %ld %ld %ld %ld %ld %ld %ld\n", fd, w, s, c, n, m, p);
                return 1;
            }
        }
    if (failures == 0)
        printf("ok\n");
    return failures != 0;
}
