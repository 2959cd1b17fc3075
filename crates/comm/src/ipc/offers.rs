//! Where the ranks of one process meet to pull from each other: a sender's [`Step::Offer`]
//! leaves the address of its piece here, keyed by (sender, receiver, lane, piece number), and
//! the receiver's [`Step::Pull`] takes it when it enqueues its copy. Host-side only: the
//! GPU-side order (the piece is ready, the source stays untouched until pulled) is the
//! windows' flags'. A receiver waits at most the communicator's timeout for an offer, and not
//! at all once any rank of the world has aborted.
//!
//! [`Step::Offer`]: super::Step::Offer
//! [`Step::Pull`]: super::Step::Pull

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// An offer's key: (sender, receiver, lane, piece number of the pair on the lane).
pub(crate) type OfferKey = (usize, usize, usize, u64);

/// Offers in flight between the ranks of one world in this process.
#[derive(Default)]
pub(crate) struct Offers {
    /// `(address, bytes)` of every piece offered and not yet taken.
    pending: Mutex<HashMap<OfferKey, (u64, usize)>>,
    arrived: Condvar,
    aborted: AtomicBool,
}

/// Why a receiver got no offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NoOffer {
    /// None came within the timeout.
    Timeout,
    /// A rank of the world aborted.
    Aborted,
}

impl Offers {
    /// The offers of the world whose ranks in this process are keyed by `world` (any value
    /// that those ranks, and no other live world's, share): made by the first rank that
    /// asks, shared by the others.
    pub(crate) fn of_world(world: u64) -> Arc<Offers> {
        static WORLDS: OnceLock<Mutex<HashMap<u64, Weak<Offers>>>> = OnceLock::new();
        let mut worlds = WORLDS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        worlds.retain(|_, w| w.strong_count() > 0);
        if let Some(offers) = worlds.get(&world).and_then(Weak::upgrade) {
            return offers;
        }
        let offers = Arc::new(Offers::default());
        worlds.insert(world, Arc::downgrade(&offers));
        offers
    }

    /// Offers the piece `key` at `address`.
    pub(crate) fn offer(&self, key: OfferKey, address: u64, bytes: usize) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.insert(key, (address, bytes));
        self.arrived.notify_all();
    }

    /// Takes the piece `key` once it is offered: `(address, bytes)`; waits at most
    /// `timeout`.
    pub(crate) fn take(&self, key: OfferKey, timeout: Duration) -> Result<(u64, usize), NoOffer> {
        let deadline = Instant::now() + timeout;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.aborted.load(Ordering::Acquire) {
                return Err(NoOffer::Aborted);
            }
            if let Some(offer) = pending.remove(&key) {
                return Ok(offer);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NoOffer::Timeout);
            }
            // Woken by every offer and by an abort; checked again at least every 100 ms.
            let wait = left.min(Duration::from_millis(100));
            pending = self
                .arrived
                .wait_timeout(pending, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A rank failed: every wait for an offer ends at once from now on.
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let _guard = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.arrived.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_offered_by_another_thread_is_taken_once() {
        let offers = Arc::new(Offers::default());
        let sender = offers.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            sender.offer((1, 0, 2, 7), 0xdead_0000, 4096);
        });
        assert_eq!(
            offers.take((1, 0, 2, 7), Duration::from_secs(10)),
            Ok((0xdead_0000, 4096))
        );
        t.join().unwrap();
        // Taken: a second take of the same piece finds nothing.
        assert_eq!(
            offers.take((1, 0, 2, 7), Duration::from_millis(10)),
            Err(NoOffer::Timeout)
        );
    }

    #[test]
    fn a_missing_offer_times_out_and_an_abort_ends_the_wait_at_once() {
        let offers = Arc::new(Offers::default());
        let start = Instant::now();
        assert_eq!(
            offers.take((0, 1, 0, 0), Duration::from_millis(50)),
            Err(NoOffer::Timeout)
        );
        assert!(start.elapsed() >= Duration::from_millis(50));
        let aborter = offers.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            aborter.abort();
        });
        let start = Instant::now();
        assert_eq!(
            offers.take((0, 1, 0, 0), Duration::from_secs(60)),
            Err(NoOffer::Aborted)
        );
        assert!(start.elapsed() < Duration::from_secs(30));
        t.join().unwrap();
    }

    #[test]
    fn the_ranks_of_one_world_share_its_offers_and_other_worlds_do_not() {
        let a = Offers::of_world(0xa000);
        let b = Offers::of_world(0xa000);
        let c = Offers::of_world(0xb000);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        a.offer((0, 1, 0, 0), 64, 8);
        assert_eq!(b.take((0, 1, 0, 0), Duration::ZERO), Ok((64, 8)));
        assert_eq!(c.take((0, 1, 0, 0), Duration::ZERO), Err(NoOffer::Timeout));
    }
}
