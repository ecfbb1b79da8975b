//! FUSE wire protocol 7.45 (OWNER: abi helper).
