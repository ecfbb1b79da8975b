//! Randomized robustness: more than 100k random, truncated and mutated
//! byte strings (built from valid requests of every opcode) go through
//! `Dispatcher::handle`. Nothing may panic, and every reply must be
//! well-formed: its length field equals the buffer length, its error is 0
//! or a negated errno, an error carries no payload, and it answers the
//! request's `unique`.

#[path = "dispatch_common.rs"]
mod common;

use common::*;
use shortfuse::abi;
use shortfuse::*;
use zerocopy::{FromBytes, IntoBytes};

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One valid request body per opcode (names, data and arrays included).
fn corpus() -> Vec<Vec<u8>> {
    let n = |arg: &[u8], names: &[&[u8]]| with_names(arg, names);
    let mut write = abi::fuse_write_in {
        fh: 1,
        size: 5,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    write.extend_from_slice(b"12345");
    let mut setxattr = n(&[3u32.to_ne_bytes(), 0u32.to_ne_bytes()].concat(), &[b"user.a"]);
    setxattr.extend_from_slice(b"xyz");
    let mut batch = abi::fuse_batch_forget_in { count: 2, dummy: 0 }.as_bytes().to_vec();
    batch.extend_from_slice(abi::fuse_forget_one { nodeid: 2, nlookup: 1 }.as_bytes());
    batch.extend_from_slice(abi::fuse_forget_one { nodeid: 3, nlookup: 1 }.as_bytes());
    let lk = abi::fuse_lk_in {
        fh: 1,
        owner: 2,
        lk_flags: abi::FUSE_LK_FLOCK,
        ..Default::default()
    };
    let mut ioctl = abi::fuse_ioctl_in {
        in_size: 2,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    ioctl.extend_from_slice(b"io");
    let bodies: Vec<(u32, u64, Vec<u8>)> = vec![
        (abi::FUSE_LOOKUP, 1, b"hello\0".to_vec()),
        (abi::FUSE_LOOKUP, DIR, b"f001\0".to_vec()),
        (
            abi::FUSE_FORGET,
            HELLO,
            abi::fuse_forget_in { nlookup: 1 }.as_bytes().to_vec(),
        ),
        (abi::FUSE_BATCH_FORGET, 0, batch),
        (
            abi::FUSE_GETATTR,
            HELLO,
            abi::fuse_getattr_in::default().as_bytes().to_vec(),
        ),
        (
            abi::FUSE_SETATTR,
            HELLO,
            abi::fuse_setattr_in {
                valid: 0xfff,
                ..Default::default()
            }
            .as_bytes()
            .to_vec(),
        ),
        (abi::FUSE_READLINK, HELLO, vec![]),
        (abi::FUSE_SYMLINK, 1, n(&[], &[b"l", b"target"])),
        (abi::FUSE_MKNOD, 1, n(abi::fuse_mknod_in::default().as_bytes(), &[b"n"])),
        (abi::FUSE_MKDIR, 1, n(abi::fuse_mkdir_in::default().as_bytes(), &[b"d"])),
        (abi::FUSE_UNLINK, 1, b"hello\0".to_vec()),
        (abi::FUSE_RMDIR, 1, b"dir\0".to_vec()),
        (
            abi::FUSE_RENAME,
            1,
            n(abi::fuse_rename_in { newdir: 1 }.as_bytes(), &[b"a", b"b"]),
        ),
        (
            abi::FUSE_RENAME2,
            1,
            n(abi::fuse_rename2_in::default().as_bytes(), &[b"a", b"b"]),
        ),
        (
            abi::FUSE_LINK,
            1,
            n(abi::fuse_link_in { oldnodeid: 2 }.as_bytes(), &[b"x"]),
        ),
        (abi::FUSE_OPEN, HELLO, abi::fuse_open_in::default().as_bytes().to_vec()),
        (abi::FUSE_READ, HELLO, read_in(1, 0, 4096).as_bytes().to_vec()),
        (abi::FUSE_WRITE, HELLO, write),
        (abi::FUSE_STATFS, 1, vec![]),
        (
            abi::FUSE_RELEASE,
            HELLO,
            abi::fuse_release_in::default().as_bytes().to_vec(),
        ),
        (
            abi::FUSE_FSYNC,
            HELLO,
            abi::fuse_fsync_in::default().as_bytes().to_vec(),
        ),
        (abi::FUSE_SETXATTR, HELLO, setxattr),
        (
            abi::FUSE_GETXATTR,
            HELLO,
            n(abi::fuse_getxattr_in { size: 0, padding: 0 }.as_bytes(), &[b"user.a"]),
        ),
        (
            abi::FUSE_LISTXATTR,
            HELLO,
            abi::fuse_getxattr_in { size: 64, padding: 0 }.as_bytes().to_vec(),
        ),
        (abi::FUSE_REMOVEXATTR, HELLO, b"user.a\0".to_vec()),
        (
            abi::FUSE_FLUSH,
            HELLO,
            abi::fuse_flush_in::default().as_bytes().to_vec(),
        ),
        (abi::FUSE_OPENDIR, DIR, abi::fuse_open_in::default().as_bytes().to_vec()),
        (abi::FUSE_READDIR, DIR, read_in(0, 0, 1000).as_bytes().to_vec()),
        (abi::FUSE_READDIRPLUS, DIR, read_in(0, 3, 2000).as_bytes().to_vec()),
        (
            abi::FUSE_RELEASEDIR,
            DIR,
            abi::fuse_release_in::default().as_bytes().to_vec(),
        ),
        (
            abi::FUSE_FSYNCDIR,
            DIR,
            abi::fuse_fsync_in::default().as_bytes().to_vec(),
        ),
        (abi::FUSE_GETLK, HELLO, lk.as_bytes().to_vec()),
        (abi::FUSE_SETLK, HELLO, lk.as_bytes().to_vec()),
        (abi::FUSE_SETLKW, HELLO, lk.as_bytes().to_vec()),
        (
            abi::FUSE_ACCESS,
            HELLO,
            abi::fuse_access_in::default().as_bytes().to_vec(),
        ),
        (
            abi::FUSE_CREATE,
            1,
            n(abi::fuse_create_in::default().as_bytes(), &[b"c"]),
        ),
        (
            abi::FUSE_INTERRUPT,
            0,
            abi::fuse_interrupt_in { unique: 3 }.as_bytes().to_vec(),
        ),
        (abi::FUSE_BMAP, HELLO, abi::fuse_bmap_in::default().as_bytes().to_vec()),
        (abi::FUSE_IOCTL, HELLO, ioctl),
        (abi::FUSE_POLL, HELLO, abi::fuse_poll_in::default().as_bytes().to_vec()),
        (
            abi::FUSE_FALLOCATE,
            HELLO,
            abi::fuse_fallocate_in::default().as_bytes().to_vec(),
        ),
        (
            abi::FUSE_LSEEK,
            HELLO,
            abi::fuse_lseek_in::default().as_bytes().to_vec(),
        ),
        (
            abi::FUSE_COPY_FILE_RANGE,
            HELLO,
            abi::fuse_copy_file_range_in::default().as_bytes().to_vec(),
        ),
        (
            abi::FUSE_COPY_FILE_RANGE_64,
            HELLO,
            abi::fuse_copy_file_range_in::default().as_bytes().to_vec(),
        ),
        (abi::FUSE_SYNCFS, 1, abi::fuse_syncfs_in::default().as_bytes().to_vec()),
        (
            abi::FUSE_TMPFILE,
            1,
            n(abi::fuse_create_in::default().as_bytes(), &[b"t"]),
        ),
        (
            abi::FUSE_STATX,
            HELLO,
            abi::fuse_statx_in::default().as_bytes().to_vec(),
        ),
        (abi::FUSE_DESTROY, 0, vec![]),
    ];
    let mut v: Vec<Vec<u8>> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, (op, node, body))| msg(op, node, 1000 + i as u64, &body))
        .collect();
    v.push(init_msg(999, 45, KERNEL_FLAGS, 65536));
    v
}

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut m = base.to_vec();
    let fix_len = |m: &mut Vec<u8>| {
        if m.len() >= 4 {
            let len = m.len() as u32;
            m[..4].copy_from_slice(&len.to_ne_bytes());
        }
    };
    match rng.below(7) {
        0 => {
            m.truncate(rng.below(base.len() + 1));
            if rng.below(2) == 0 {
                fix_len(&mut m);
            }
        }
        1 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(m.len());
                m[i] ^= 1 << rng.below(8);
            }
        }
        2 => {
            m = (0..rng.below(300)).map(|_| rng.next() as u8).collect();
            if rng.below(2) == 0 {
                fix_len(&mut m);
            }
        }
        3 => {
            m.extend((0..rng.below(64)).map(|_| rng.next() as u8));
            fix_len(&mut m);
        }
        4 => {
            // An extreme value in a field after the header (sizes, counts).
            if m.len() >= 44 {
                let i = 40 + 4 * rng.below((m.len() - 40) / 4);
                let v = [0, 1, u32::MAX, u32::MAX / 2, 0x8000_0000, rng.next() as u32][rng.below(6)];
                m[i..i + 4].copy_from_slice(&v.to_ne_bytes());
            }
        }
        5 => {
            // Remove NUL bytes after the fixed part (unterminated names).
            if let Some(p) = m.iter().rposition(|&b| b == 0) {
                if p > 40 {
                    m[p] = b'x';
                }
            }
        }
        _ => {
            // total_extlen or padding garbage.
            if m.len() >= 40 {
                m[36] = rng.next() as u8;
                m[37] = rng.next() as u8;
            }
        }
    }
    m
}

fn new_dispatcher(rng: &mut Rng) -> (Dispatcher, bool) {
    let fs = std::sync::Arc::new(TestFs {
        native_plus: rng.below(2) == 0,
        ..TestFs::default()
    });
    let opts = MountOptions {
        max_write: 4096 << rng.below(9),
        ..MountOptions::default()
    };
    let d = Dispatcher::with_max_pages_limit(fs, opts, std::sync::Arc::new(Stats::new()), 256);
    let mut buf = Vec::new();
    let initialized = rng.below(10) != 0;
    if initialized {
        assert_eq!(
            d.handle(&init_msg(1, 45, KERNEL_FLAGS, 65536), &mut buf, Transport::Dev),
            Outcome::Reply
        );
        assert_eq!(check_reply(&buf).error, 0);
    }
    (d, initialized)
}

#[test]
fn random_and_mutated_requests_never_panic_and_replies_are_well_formed() {
    let corpus = corpus();
    let mut rng = Rng(0x5eed_f00d_1234_5678);
    let (mut d, _) = new_dispatcher(&mut rng);
    let mut buf = Vec::new();
    let mut replies = 0usize;
    let mut ok_replies = 0usize;
    const ITERATIONS: usize = 120_000;
    for i in 0..ITERATIONS {
        if i % 4000 == 0 {
            d = new_dispatcher(&mut rng).0;
        }
        let base = &corpus[rng.below(corpus.len())];
        let m = if rng.below(8) == 0 {
            base.clone()
        } else {
            mutate(&mut rng, base)
        };
        let out = d.handle(&m, &mut buf, Transport::Dev);
        match out {
            Outcome::Reply | Outcome::Destroy => {
                let r = check_reply(&buf);
                let h = abi::fuse_in_header::read_from_prefix(&m)
                    .expect("a reply needs a readable header")
                    .0;
                assert_eq!(r.unique, h.unique, "iteration {i}: reply to another request");
                assert_ne!(r.unique, 0, "iteration {i}: reply with unique 0");
                replies += 1;
                ok_replies += usize::from(r.error == 0);
                if out == Outcome::Destroy {
                    // A destroyed connection answers EIO to everything: start over.
                    d = new_dispatcher(&mut rng).0;
                }
            }
            Outcome::NoReply => {}
            Outcome::Deferred => panic!("iteration {i}: deferred without a sink"),
        }
    }
    // The test must exercise both paths.
    assert!(replies > ITERATIONS / 2, "{replies} replies");
    assert!(ok_replies > ITERATIONS / 20, "{ok_replies} successful replies");
}

#[test]
fn every_prefix_of_every_valid_request() {
    let corpus = corpus();
    let mut rng = Rng(42);
    let mut buf = Vec::new();
    for base in &corpus {
        let (d, _) = new_dispatcher(&mut rng);
        for cut in 0..=base.len() {
            let mut m = base[..cut].to_vec();
            if m.len() >= 4 {
                let len = m.len() as u32;
                m[..4].copy_from_slice(&len.to_ne_bytes());
            }
            if let Outcome::Reply | Outcome::Destroy = d.handle(&m, &mut buf, Transport::Dev) {
                check_reply(&buf);
            }
        }
    }
}
