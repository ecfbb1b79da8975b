//! What the built shims link. Every process under `shortfuse run` loads
//! `libshortfuse_preload.so`, and the dynamic loader maps and relocates all
//! of it (its pointer tables, written once per process) before the
//! program's first instruction: the SSH client sftp brings, with its async
//! runtime and crypto, was about half of that. It belongs in the shim built
//! with sftp alone, which `run` loads only for an sftp mount. Nor does a
//! shim parse the cache's configuration files: `shortfuse run` reads a
//! `config=FILE` once and hands every process the values it holds.

// The built shim's path, alone of what the module shares.
#[allow(dead_code)]
mod support;

/// The bytes of an ELF object's sections that the loader maps (SHF_ALLOC
/// with contents): its code, read-only data and relocated tables, not its
/// symbol table or debug information, which name whatever the compiler saw.
fn mapped(elf: &[u8]) -> Vec<&[u8]> {
    const SHF_ALLOC: u64 = 2;
    const SHT_NOBITS: u32 = 8;
    assert_eq!(&elf[..5], b"\x7fELF\x02", "not a 64-bit ELF object");
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    let (shoff, shentsize, shnum) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c));
    (0..shnum)
        .map(|i| shoff + i * shentsize)
        .filter(|&h| u64_at(h + 8) & SHF_ALLOC != 0 && u32_at(h + 4) != SHT_NOBITS)
        .map(|h| {
            let (off, size) = (u64_at(h + 0x18) as usize, u64_at(h + 0x20) as usize);
            &elf[off..off + size]
        })
        .collect()
}

/// How often `name` occurs in what the loader maps of `elf`: a crate whose
/// code is linked in leaves its name in its panic locations' file paths.
fn mentions(elf: &[u8], name: &str) -> usize {
    mapped(elf)
        .iter()
        .map(|s| s.windows(name.len()).filter(|w| *w == name.as_bytes()).count())
        .sum()
}

#[test]
fn the_shim_every_process_loads_links_no_ssh_client() {
    let lean = support::shim();
    let full = lean.with_file_name("libshortfuse_preload_sftp.so");
    assert!(
        full.is_file(),
        "{} not built: build the workspace (make build)",
        full.display()
    );
    let lean = std::fs::read(&lean).unwrap();
    let full = std::fs::read(&full).unwrap();
    for stack in ["russh", "tokio"] {
        // The other build shows that the check sees the stack where it is.
        assert!(
            mentions(&full, stack) > 0,
            "the shim built with sftp does not link {stack}"
        );
        assert_eq!(mentions(&lean, stack), 0, "the shim every process loads links {stack}");
    }
}

#[test]
fn no_shim_links_a_configuration_file_parser() {
    let lean = support::shim();
    let dir = lean.parent().unwrap();
    let cli = dir.join("shortfuse");
    let full = dir.join("libshortfuse_preload_sftp.so");
    for built in [&cli, &full] {
        assert!(
            built.is_file(),
            "{} not built: build the workspace (make build)",
            built.display()
        );
    }
    let cli = std::fs::read(&cli).unwrap();
    for parser in ["toml_edit", "winnow"] {
        // The command line, which reads the files, shows that the check
        // sees the parser where it is.
        assert!(mentions(&cli, parser) > 0, "shortfuse does not link {parser}");
        for shim in [&lean, &full] {
            let elf = std::fs::read(shim).unwrap();
            assert_eq!(mentions(&elf, parser), 0, "{} links {parser}", shim.display());
        }
    }
}
