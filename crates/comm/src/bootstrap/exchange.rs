//! Exchanges through a [`TcpStore`]: rank 0's NCCL unique id to every rank
//! ([`exchange_id`]), one value per rank to rank 0 ([`gather`]) or to every rank
//! ([`all_gather`]).

use std::time::Instant;

use super::{bootstrap, TcpStore, NCCL_ID_KEY};
use crate::error::CommError;

/// Hands rank 0's NCCL unique id to every rank through `store`: rank 0 calls `make` (for
/// instance `|| NcclId::new().map(|id| id.as_bytes().to_vec())`) and publishes the bytes
/// under [`NCCL_ID_KEY`]; every other rank waits for them. Returns the id's bytes on every
/// rank. When `make` fails on rank 0 the failure is published too, so that the other ranks
/// fail at once with rank 0's reason instead of timing out.
///
/// One store carries one id: use a fresh store for every communicator world.
pub fn exchange_id<T: Into<Vec<u8>>>(
    store: &TcpStore,
    rank: usize,
    make: impl FnOnce() -> Result<T, CommError>,
) -> Result<Vec<u8>, CommError> {
    if rank == 0 {
        match make() {
            Ok(id) => {
                let id: Vec<u8> = id.into();
                let mut message = Vec::with_capacity(1 + id.len());
                message.push(1);
                message.extend_from_slice(&id);
                store.set(NCCL_ID_KEY, &message)?;
                Ok(id)
            }
            Err(e) => {
                let mut message = vec![0];
                message.extend_from_slice(e.to_string().as_bytes());
                // The other ranks would time out anyway if this fails; report `make`'s error.
                let _ = store.set(NCCL_ID_KEY, &message);
                Err(e)
            }
        }
    } else {
        let message = store.get(NCCL_ID_KEY)?;
        match message.split_first() {
            Some((1, id)) => Ok(id.to_vec()),
            Some((0, reason)) => Err(bootstrap(format!(
                "rank 0 could not create the NCCL id: {}",
                String::from_utf8_lossy(reason)
            ))),
            _ => Err(bootstrap(format!(
                "the value of key \"{NCCL_ID_KEY}\" at the store {} is malformed",
                store.local_addr()
            ))),
        }
    }
}

/// Collects one value per rank on rank 0: every rank publishes `value` under `key/<rank>`,
/// rank 0 waits for all `world` of them and returns them in rank order; the other ranks
/// return `None` once theirs is stored.
pub fn gather(
    store: &TcpStore,
    rank: usize,
    world: usize,
    key: &str,
    value: &[u8],
) -> Result<Option<Vec<Vec<u8>>>, CommError> {
    check_member("gather", key, rank, world)?;
    if rank != 0 {
        store.set(&format!("{key}/{rank}"), value)?;
        return Ok(None);
    }
    read_all(store, rank, world, key, value).map(Some)
}

/// Hands every rank's `value` to every rank: each publishes it under `key/<rank>` and reads
/// all `world` of them, in rank order (the set-up exchange of copy-engine windows). Every
/// rank calls it with the same `key`, once per key.
pub fn all_gather(
    store: &TcpStore,
    rank: usize,
    world: usize,
    key: &str,
    value: &[u8],
) -> Result<Vec<Vec<u8>>, CommError> {
    check_member("all-gather", key, rank, world)?;
    store.set(&format!("{key}/{rank}"), value)?;
    read_all(store, rank, world, key, value)
}

fn check_member(what: &str, key: &str, rank: usize, world: usize) -> Result<(), CommError> {
    if rank >= world {
        return Err(bootstrap(format!(
            "{what} of \"{key}\": rank {rank} is outside a world of {world} ranks"
        )));
    }
    Ok(())
}

/// Every rank's value under `key/<r>` in rank order, `value` in `rank`'s place, all within
/// the store's timeout.
fn read_all(
    store: &TcpStore,
    rank: usize,
    world: usize,
    key: &str,
    value: &[u8],
) -> Result<Vec<Vec<u8>>, CommError> {
    let start = Instant::now();
    let mut values = Vec::with_capacity(world);
    for r in 0..world {
        if r == rank {
            values.push(value.to_vec());
            continue;
        }
        let remaining = store.timeout().saturating_sub(start.elapsed());
        values.push(store.get_timeout(&format!("{key}/{r}"), remaining)?);
    }
    Ok(values)
}
