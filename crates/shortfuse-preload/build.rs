//! The shim links the unwinder statically (libgcc_eh) instead of needing
//! libgcc_s.so.1: every process started under `shortfuse run` loads the shim,
//! and libgcc_s's constructor asks the CPU for its features with `cpuid`,
//! which traps to the hypervisor in a virtual machine (tens of µs each, a
//! good part of what the shim adds to a short process). Rust's standard
//! library asks the linker for `-lgcc_s`; a linker script of that name, found
//! first, hands it the static archive instead. The same is done for libm.
//! Its relative relocations are packed (DT_RELR).

use std::path::PathBuf;

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os != "linux" || env != "gnu" {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join("libgcc_s.so"), "INPUT(-lgcc_eh)\n").expect("write the libgcc_s linker script");
    // libm likewise: its two functions the dependencies call are bound on
    // first use (src/lazy_libm.rs), so no process loads libm for the shim.
    // The assignments win over libm's definitions, and libm, kept as
    // needed, is linked only if something else of it is used. The shim
    // alone: its tests do not hold the functions the script names.
    let _ = std::fs::remove_file(out.join("libm.so"));
    let mathless = out.join("mathless");
    std::fs::create_dir_all(&mathless).expect("create the libm linker script's directory");
    std::fs::write(
        mathless.join("libm.so"),
        "pow = shortfuse_libm_pow;\nlog2 = shortfuse_libm_log2;\nINPUT(AS_NEEDED(libm.so.6))\n",
    )
    .expect("write the libm linker script");
    println!("cargo:rustc-cdylib-link-arg=-L{}", mathless.display());
    // Every process loads the shim, and the dynamic loader relocates it
    // first: its thousands of relative relocations (pointers in tables and
    // panic locations), packed as DT_RELR (glibc 2.36 and later), take a few
    // kilobytes to read instead of about 180 KB of Elf64_Rela. A linker
    // without the option ignores it with a warning.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,pack-relative-relocs");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rerun-if-changed=build.rs");
}
