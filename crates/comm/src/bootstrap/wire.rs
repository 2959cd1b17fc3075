//! The store's private wire protocol: operation and status codes, and big-endian,
//! length-prefixed byte strings bounded by the store's size limits.

use std::io::{self, Read};

/// The longest key the store accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;

/// The largest value the store accepts, in bytes.
pub const MAX_VALUE_BYTES: usize = 256 << 20;

pub(super) const OP_SET: u8 = 1;
pub(super) const OP_GET: u8 = 2;
pub(super) const STATUS_OK: u8 = 0;
pub(super) const STATUS_MISSING: u8 = 1;
pub(super) const STATUS_CLOSED: u8 = 2;

pub(super) fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

pub(super) fn put_bytes64(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

pub(super) fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

pub(super) fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

pub(super) fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

pub(super) fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

pub(super) fn read_bytes(r: &mut impl Read, len: u64, limit: usize) -> io::Result<Vec<u8>> {
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= limit)
        .ok_or_else(|| invalid(format!("a length of {len} bytes exceeds the limit {limit}")))?;
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes)?;
    Ok(bytes)
}

pub(super) fn read_bytes64(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = read_u64(r)?;
    read_bytes(r, len, MAX_VALUE_BYTES)
}
