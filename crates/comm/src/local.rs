//! `Local`: ranks as threads of one process, exchanging host views through rendezvous slots.
//!
//! A [`LocalWorld`] holds the state every rank of the group shares; each rank talks through
//! its own [`Local`] handle. Posting is NCCL-like: [`Communicator::post`] and
//! [`Communicator::post_p2p`] validate what the posting rank can check alone, give the
//! operation its sequence number and queue one task on the stream; the exchange happens when
//! the stream's worker runs that task.
//!
//! * A collective is matched by its team (as a set of ranks) and the per-team sequence
//!   number counted at post time on each rank. Every member deposits its contribution in the
//!   team's rendezvous slot, waits until all members have, checks that they agree (kind,
//!   team order, root, operator, element type, sizes) and computes its own output; the slot
//!   is removed once every member has taken its result.
//! * A point-to-point transfer is matched by (source, destination, per-pair sequence number):
//!   the k-th send from `a` to `b` meets the k-th receive on `b` from `a`. Sends are buffered
//!   in mailboxes and never wait; a group deposits all its sends before any receive waits.
//! * Values travel as `f64` read from the views (already rounded to their element type);
//!   reductions combine in `f64` in team order, starting from the first member's value, and
//!   round once, when the result is written.
//! * Every wait gives up after the world's timeout with [`CommError::Timeout`], and fails at
//!   once with [`CommError::PeerFailed`] when a rank it waits for has called
//!   [`Communicator::abort`].

mod collective;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::communicator::{Collective, Communicator, P2p, TaskQueue};
use crate::dtype::DataType;
use crate::error::CommError;
use crate::host::HostView;
use collective::{check_members, compute, Contribution, Plan};

/// The shared state of one group of in-process ranks.
pub struct LocalWorld {
    shared: Arc<Shared>,
}

impl LocalWorld {
    /// A world of `size` ranks whose waits give up after `timeout`.
    pub fn new(size: usize, timeout: Duration) -> LocalWorld {
        LocalWorld {
            shared: Arc::new(Shared {
                size,
                timeout,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                counters: (0..size).map(|_| Mutex::new(Counters::default())).collect(),
            }),
        }
    }

    /// The communicator of `rank`. Every handle of one rank shares that rank's sequence
    /// numbers. A rank outside `0..size()` gets a handle whose posts fail with
    /// [`CommError::NotInTeam`] or [`CommError::Mismatch`].
    pub fn communicator(&self, rank: usize) -> Local {
        Local {
            rank,
            shared: Arc::clone(&self.shared),
        }
    }

    /// The number of ranks in the world.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// How long an operation waits for its peers.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// The ranks that called [`Communicator::abort`], with their reasons, in rank order.
    pub fn aborted(&self) -> Vec<(usize, String)> {
        let state = self.shared.lock();
        state
            .aborted
            .iter()
            .map(|(&rank, reason)| (rank, reason.clone()))
            .collect()
    }

    /// How many rendezvous slots and undelivered point-to-point messages the world holds: 0
    /// once every posted operation has completed on every rank involved.
    pub fn pending(&self) -> usize {
        let state = self.shared.lock();
        state.slots.len() + state.mailboxes.len()
    }
}

impl fmt::Debug for LocalWorld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalWorld")
            .field("size", &self.shared.size)
            .field("timeout", &self.shared.timeout)
            .finish_non_exhaustive()
    }
}

/// One rank's handle on a [`LocalWorld`].
pub struct Local {
    rank: usize,
    shared: Arc<Shared>,
}

impl fmt::Debug for Local {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local")
            .field("rank", &self.rank)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

impl Communicator for Local {
    type Buffer = HostView;
    type Stream = dyn TaskQueue;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn post(
        &self,
        collective: Collective<HostView>,
        stream: &dyn TaskQueue,
    ) -> Result<(), CommError> {
        let Collective { label, team, op } = collective;
        let rank = self.rank;
        let _span = tracing::debug_span!(
            "local_post",
            rank,
            op = op.name(),
            label = %label,
            team = ?team,
        )
        .entered();
        let Some(index) = team.iter().position(|&r| r == rank) else {
            return Err(CommError::NotInTeam {
                rank,
                team,
                op: label,
            });
        };
        if let Err(detail) = self.shared.check_team(&team) {
            return Err(mismatch(&label, rank, detail));
        }
        let plan = match Plan::new(op, index, team.len()) {
            Ok(plan) => plan,
            Err(detail) => return Err(mismatch(&label, rank, detail)),
        };
        let mut members = team.clone();
        members.sort_unstable();
        let Some(counters) = self.shared.counters.get(rank) else {
            return Err(mismatch(&label, rank, self.shared.outside(rank)));
        };
        let seq = {
            let mut counters = counters.lock().unwrap_or_else(|e| e.into_inner());
            let next = counters.collectives.entry(members.clone()).or_insert(0);
            let seq = *next;
            *next += 1;
            seq
        };
        let shared = Arc::clone(&self.shared);
        let name = label.clone();
        stream.enqueue(
            name,
            Box::new(move || shared.run_collective(rank, &label, (members, seq), &team, plan)),
        );
        Ok(())
    }

    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<HostView>>,
        stream: &dyn TaskQueue,
    ) -> Result<(), CommError> {
        let rank = self.rank;
        let _span = tracing::debug_span!(
            "local_post",
            rank,
            op = "p2p",
            label = %label,
            transfers = ops.len(),
        )
        .entered();
        let Some(counters) = self.shared.counters.get(rank) else {
            return Err(mismatch(&label, rank, self.shared.outside(rank)));
        };
        for op in &ops {
            let (P2p::Send { peer, .. } | P2p::Recv { peer, .. }) = op;
            if *peer >= self.shared.size {
                return Err(mismatch(&label, rank, self.shared.outside(*peer)));
            }
        }
        if ops.is_empty() {
            return Ok(());
        }
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        {
            let mut counters = counters.lock().unwrap_or_else(|e| e.into_inner());
            for op in ops {
                // Numbered per peer and direction: the k-th send to a peer meets its k-th
                // receive from this rank.
                let (peer, buffer, counts, queue) = match op {
                    P2p::Send { peer, buffer } => (peer, buffer, &mut counters.sends, &mut sends),
                    P2p::Recv { peer, buffer } => (peer, buffer, &mut counters.recvs, &mut recvs),
                };
                let next = counts.entry(peer).or_insert(0);
                queue.push(Transfer {
                    peer,
                    seq: *next,
                    buffer,
                });
                *next += 1;
            }
        }
        let shared = Arc::clone(&self.shared);
        let name = label.clone();
        stream.enqueue(
            name,
            Box::new(move || shared.run_p2p(rank, &label, sends, recvs)),
        );
        Ok(())
    }

    fn abort(&self, reason: &str) {
        let mut state = self.shared.lock();
        state
            .aborted
            .entry(self.rank)
            .or_insert_with(|| reason.to_string());
        drop(state);
        self.shared.changed.notify_all();
    }
}

/// A [`CommError::Mismatch`] noticed by `rank`.
fn mismatch(label: &str, rank: usize, detail: String) -> CommError {
    CommError::Mismatch {
        op: label.to_string(),
        rank,
        detail,
    }
}

/// What every rank of a world shares.
struct Shared {
    size: usize,
    timeout: Duration,
    /// Slots, mailboxes and failed ranks; every change is announced on `changed`.
    state: Mutex<State>,
    changed: Condvar,
    /// Each rank's sequence counters, bumped at post time on the rank's host thread.
    counters: Vec<Mutex<Counters>>,
}

#[derive(Default)]
struct State {
    /// Ranks that called `abort`, with their reasons.
    aborted: BTreeMap<usize, String>,
    /// Open collectives, by (sorted team, per-team sequence number).
    slots: HashMap<SlotKey, Slot>,
    /// Sent but not yet received messages, by (source, destination, per-pair sequence).
    mailboxes: HashMap<(usize, usize, u64), Message>,
}

type SlotKey = (Vec<usize>, u64);

#[derive(Default)]
struct Counters {
    /// Next sequence number per team (sorted ranks).
    collectives: HashMap<Vec<usize>, u64>,
    /// Next sequence number of a send, per destination.
    sends: HashMap<usize, u64>,
    /// Next sequence number of a receive, per source.
    recvs: HashMap<usize, u64>,
}

/// The rendezvous of one collective.
struct Slot {
    /// Contributions deposited so far, by rank.
    arrived: HashMap<usize, Arc<Contribution>>,
    /// How many members have stopped waiting (with their result or an error).
    left: usize,
}

/// A buffered send.
struct Message {
    dtype: DataType,
    sizes: Vec<usize>,
    data: Vec<f64>,
}

/// One send or receive of a point-to-point group, with its per-pair sequence number.
struct Transfer {
    peer: usize,
    seq: u64,
    buffer: HostView,
}

/// The outcome of one look at the shared state while waiting.
enum Poll<T> {
    /// Done, with this.
    Ready(T),
    /// Still waiting for these ranks.
    Waiting(Vec<usize>),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn outside(&self, rank: usize) -> String {
        format!("rank {rank} is outside the world of {} ranks", self.size)
    }

    /// Checks that a team names distinct ranks of the world.
    fn check_team(&self, team: &[usize]) -> Result<(), String> {
        for (i, &r) in team.iter().enumerate() {
            if r >= self.size {
                return Err(format!("team {team:?}: {}", self.outside(r)));
            }
            if team[..i].contains(&r) {
                return Err(format!("team {team:?} names rank {r} twice"));
            }
        }
        Ok(())
    }

    /// The error of `rank` when `failed` has aborted with `reason`.
    fn peer_failed(label: &str, rank: usize, failed: usize, reason: &str) -> CommError {
        CommError::PeerFailed {
            op: label.to_string(),
            rank,
            failed_rank: failed,
            reason: reason.to_string(),
        }
    }

    /// Fails when `rank` itself has aborted.
    fn check_alive(state: &State, label: &str, rank: usize) -> Result<(), CommError> {
        match state.aborted.get(&rank) {
            Some(reason) => Err(Shared::peer_failed(label, rank, rank, reason)),
            None => Ok(()),
        }
    }

    /// Waits, on behalf of `rank`, until `poll` is ready; fails when a rank it waits for (or
    /// `rank` itself) has aborted, or after the world's timeout. Gives the lock back either
    /// way.
    fn wait<'a, T>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        label: &str,
        rank: usize,
        mut poll: impl FnMut(&mut State) -> Poll<T>,
    ) -> (MutexGuard<'a, State>, Result<T, CommError>) {
        let _span = tracing::debug_span!("local_wait", rank, label).entered();
        let deadline = Instant::now().checked_add(self.timeout);
        loop {
            // A rank that has aborted fails its own waits even when its peers have arrived
            // meanwhile: whether it saw them first must not decide the outcome.
            if let Err(e) = Shared::check_alive(&state, label, rank) {
                return (state, Err(e));
            }
            let missing = match poll(&mut state) {
                Poll::Ready(value) => return (state, Ok(value)),
                Poll::Waiting(missing) => missing,
            };
            if let Some((&failed, reason)) =
                missing.iter().find_map(|r| state.aborted.get_key_value(r))
            {
                let error = Shared::peer_failed(label, rank, failed, reason);
                return (state, Err(error));
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(deadline) if now >= deadline => {
                    let error = CommError::Timeout {
                        op: label.to_string(),
                        rank,
                        waiting_for: missing,
                        millis: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
                    };
                    return (state, Err(error));
                }
                Some(deadline) => deadline - now,
                None => Duration::from_secs(3600),
            };
            state = self
                .changed
                .wait_timeout(state, remaining)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Runs one member's part of a collective: deposit, wait for the team, check, compute,
    /// write.
    fn run_collective(
        &self,
        rank: usize,
        label: &str,
        key: SlotKey,
        team: &[usize],
        plan: Plan,
    ) -> Result<(), CommError> {
        let input_values = plan.input.as_ref().map(HostView::read);
        let Some(dtype) = plan
            .input
            .as_ref()
            .or(plan.output.as_ref())
            .map(HostView::dtype)
        else {
            return Err(mismatch(label, rank, "the operation uses no buffer".into()));
        };
        let contribution = Arc::new(Contribution {
            rank,
            team: team.to_vec(),
            name: plan.name,
            root: plan.root,
            red: plan.red,
            permute: plan.permute,
            dtype,
            input_sizes: plan.input.as_ref().map(HostView::sizes),
            output_sizes: plan.output.as_ref().map(HostView::sizes),
            input: input_values,
        });

        let mut state = self.lock();
        Shared::check_alive(&state, label, rank)?;
        let slot = state.slots.entry(key.clone()).or_insert_with(|| Slot {
            arrived: HashMap::new(),
            left: 0,
        });
        if slot.arrived.contains_key(&rank) {
            return Err(mismatch(
                label,
                rank,
                format!(
                    "rank {rank} joined collective #{} of team {:?} twice",
                    key.1, key.0
                ),
            ));
        }
        slot.arrived.insert(rank, contribution);
        self.changed.notify_all();

        let (mut state, result) = self.wait(state, label, rank, |state| {
            let Some(slot) = state.slots.get(&key) else {
                return Poll::Waiting(team.to_vec());
            };
            let missing: Vec<usize> = team
                .iter()
                .copied()
                .filter(|r| !slot.arrived.contains_key(r))
                .collect();
            if missing.is_empty() {
                Poll::Ready(
                    team.iter()
                        .filter_map(|r| slot.arrived.get(r).cloned())
                        .collect::<Vec<_>>(),
                )
            } else {
                Poll::Waiting(missing)
            }
        });
        if let Some(slot) = state.slots.get_mut(&key) {
            slot.left += 1;
            if slot.left >= team.len() {
                state.slots.remove(&key);
            }
        }
        drop(state);

        let members = result?;
        check_members(&members).map_err(|e| mismatch(label, rank, e.to_string()))?;
        let Some(output) = plan.output.as_ref() else {
            return Ok(());
        };
        let index = team.iter().position(|&r| r == rank).unwrap_or(0);
        let values = compute(&plan, &members, index, output.numel());
        output
            .write(&values)
            .map_err(|e| mismatch(label, rank, e.to_string()))
    }

    /// Runs a point-to-point group: every send is deposited, then every receive waits for its
    /// message.
    fn run_p2p(
        &self,
        rank: usize,
        label: &str,
        sends: Vec<Transfer>,
        recvs: Vec<Transfer>,
    ) -> Result<(), CommError> {
        let messages: Vec<_> = sends
            .into_iter()
            .map(|send| {
                let message = Message {
                    dtype: send.buffer.dtype(),
                    sizes: send.buffer.sizes(),
                    data: send.buffer.read(),
                };
                ((rank, send.peer, send.seq), message)
            })
            .collect();
        {
            let mut state = self.lock();
            Shared::check_alive(&state, label, rank)?;
            state.mailboxes.extend(messages);
        }
        self.changed.notify_all();

        for recv in recvs {
            let key = (recv.peer, rank, recv.seq);
            let state = self.lock();
            let (state, result) = self.wait(state, label, rank, |state| {
                match state.mailboxes.remove(&key) {
                    Some(message) => Poll::Ready(message),
                    None => Poll::Waiting(vec![recv.peer]),
                }
            });
            drop(state);
            let message = result?;
            let (buffer, peer) = (&recv.buffer, recv.peer);
            if message.dtype != buffer.dtype() {
                return Err(mismatch(
                    label,
                    rank,
                    format!(
                        "rank {peer} sends {} data but rank {rank} receives into {}",
                        message.dtype,
                        buffer.dtype()
                    ),
                ));
            }
            if message.data.len() != buffer.numel() {
                return Err(mismatch(
                    label,
                    rank,
                    format!(
                        "rank {peer} sends {} elements (sizes {:?}) but rank {rank} receives {} \
                         (sizes {:?})",
                        message.data.len(),
                        message.sizes,
                        buffer.numel(),
                        buffer.sizes()
                    ),
                ));
            }
            buffer
                .write(&message.data)
                .map_err(|e| mismatch(label, rank, e.to_string()))?;
        }
        Ok(())
    }
}
