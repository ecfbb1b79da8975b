//! Raw system calls and the hook entry. Everything here runs with the
//! program's registers and stack: no libc, no locks.
#![allow(unsafe_code)]

use core::arch::{asm, global_asm};

/// A system call straight to the kernel. Our own mapping is never
/// rewritten, so this `syscall` instruction stays one.
#[inline(always)]
pub fn raw(nr: i64, a1: i64, a2: i64, a3: i64, a4: i64, a5: i64, a6: i64) -> i64 {
    let ret: i64;
    // SAFETY: the kernel checks every argument; pointers passed by callers
    // are the program's own or ours. rcx and r11 are clobbered by `syscall`.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a1, in("rsi") a2, in("rdx") a3, in("r10") a4, in("r8") a5, in("r9") a6,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

pub fn raw3(nr: i64, a1: i64, a2: i64, a3: i64) -> i64 {
    raw(nr, a1, a2, a3, 0, 0, 0)
}

// The trampoline at address 0 ends in `jmp *%r11` to `shortfuse_entry` with
// the stack 0x80 bytes below the return address that `call *%rax` pushed
// (the red zone of the interrupted function is left alone).
//
// - rt_sigreturn (15) must run on the stack the signal frame is on: drop
//   our adjustment and the return address, then issue it.
// - vfork (58) would share our stack with the child: run it as fork (57).
// - clone (56) with a new stack: the child returns on that stack, so the
//   return address is copied there first (rsi -= 8), as zpoline does.
// - clone3 (435) answers ENOSYS: glibc then falls back to clone.
// - Everything else: save the registers the kernel preserves, call
//   `shortfuse_hook(a1..a6, nr)` with a 16-byte aligned stack, restore.
global_asm!(
    ".globl shortfuse_entry",
    ".type shortfuse_entry,@function",
    "shortfuse_entry:",
    "cmp $15, %rax",
    "je 2f",
    "cmp $56, %rax",
    "je 3f",
    "cmp $58, %rax",
    "je 5f",
    "cmp $435, %rax",
    "je 6f",
    "push %rbp",
    "mov %rsp, %rbp",
    "and $-16, %rsp",
    "push %rdi",
    "push %rsi",
    "push %rdx",
    "push %r10",
    "push %r8",
    "push %r9",
    "sub $8, %rsp",
    "push %rax",
    "mov %r10, %rcx",
    "call shortfuse_hook",
    "add $16, %rsp",
    "pop %r9",
    "pop %r8",
    "pop %r10",
    "pop %rdx",
    "pop %rsi",
    "pop %rdi",
    "mov %rbp, %rsp",
    "pop %rbp",
    "add $0x80, %rsp",
    "ret",
    // rt_sigreturn
    "2:",
    "add $0x88, %rsp",
    "syscall",
    "ud2",
    // clone
    "3:",
    "add $0x80, %rsp",
    "test %rsi, %rsi",
    "jz 4f",
    "sub $8, %rsi",
    "mov (%rsp), %r11",
    "mov %r11, (%rsi)",
    "4:",
    "syscall",
    "ret",
    // vfork as fork
    "5:",
    "add $0x80, %rsp",
    "mov $57, %eax",
    "syscall",
    "ret",
    // clone3
    "6:",
    "add $0x80, %rsp",
    "mov $-38, %rax",
    "ret",
    ".size shortfuse_entry, .-shortfuse_entry",
    options(att_syntax)
);

extern "C" {
    pub fn shortfuse_entry();
}
