//! The race checker: vector clocks per stream and per in-flight communication, advanced by
//! `Synchronize` and `Wait`, and a report for every access to a buffer region that is not
//! ordered after the last conflicting access.
//!
//! The model is the host program's own semantics, not what one run happened to do:
//!
//! * each stream is an agent whose accesses are ordered by program order;
//! * `Synchronize(s)` orders the current stream after everything `s` did so far;
//! * a communication is an agent of its own, ordered after its posting stream at the post and
//!   before nothing until a `Wait` names it (its buffers may be touched only after the
//!   `Wait`, as on NCCL's internal streams);
//! * the caller writes every input on the main stream before the first statement (the CUDA
//!   backend uploads there), so a pool stream reads an input only after `Synchronize(main)`;
//! * `Allocate` writes the whole buffer on the allocating stream (a stream-ordered
//!   allocation: the memory is the buffer's only once that stream gets there), so another
//!   stream uses it only after synchronizing with the allocating one;
//! * `Deallocate` writes the whole buffer (the memory may be reused), and the caller reads
//!   every output on the main stream after the last statement.
//!
//! The evaluator ([`crate::eval`]) feeds these accesses, each statement's taken from its
//! `Stmt::effects` (weave-host-ir) rather than listed again; the checker itself knows only
//! agents, regions and clocks.
//!
//! Two accesses conflict when their regions overlap and one of them writes.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::backend::{Region, StreamKey};

/// Who performs an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Agent {
    /// A stream.
    Stream(StreamKey),
    /// The communication posted by the `n`-th posting statement executed.
    Comm(u64),
}

impl fmt::Display for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Agent::Stream(s) => write!(f, "{s}"),
            Agent::Comm(_) => f.write_str("the communication"),
        }
    }
}

/// A vector clock: for each agent, how many of its accesses are ordered before this point.
pub type Clock = BTreeMap<Agent, u64>;

fn join(into: &mut Clock, other: &Clock) {
    for (a, &t) in other {
        let e = into.entry(*a).or_insert(0);
        *e = (*e).max(t);
    }
}

#[derive(Clone, Debug)]
struct Access {
    agent: Agent,
    /// Where the access ran: the agent's stream, or for a communication the stream it was
    /// posted on.
    stream: StreamKey,
    epoch: u64,
    write: bool,
    region: Region,
    stmt: String,
    tensor: String,
}

/// One unordered pair of conflicting accesses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaceReport {
    /// The later statement, as printed.
    pub stmt: String,
    /// The tensor it touches.
    pub tensor: String,
    /// Whether it writes.
    pub write: bool,
    /// The stream it runs on (for a communication: the stream it was posted on).
    pub stream: StreamKey,
    /// The earlier, conflicting statement.
    pub other_stmt: String,
    /// The tensor the earlier statement touched.
    pub other_tensor: String,
    /// Whether the earlier access wrote.
    pub other_write: bool,
    /// Its stream.
    pub other_stream: StreamKey,
}

impl fmt::Display for RaceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = |w: bool| if w { "writes" } else { "reads" };
        write!(
            f,
            "race: `{}` on {} {} {}, unordered with `{}` on {}, which {} {}",
            self.stmt,
            self.stream,
            verb(self.write),
            self.tensor,
            self.other_stmt,
            self.other_stream,
            verb(self.other_write),
            self.other_tensor
        )
    }
}

/// The checker's state for one rank.
#[derive(Debug, Default)]
pub struct RaceChecker {
    clocks: HashMap<Agent, Clock>,
    comm_streams: HashMap<u64, StreamKey>,
    accesses: HashMap<u64, Vec<Access>>,
    reports: Vec<RaceReport>,
    next_comm: u64,
}

impl RaceChecker {
    /// A checker with no history.
    pub fn new() -> RaceChecker {
        RaceChecker::default()
    }

    fn clock(&mut self, agent: Agent) -> &mut Clock {
        self.clocks.entry(agent).or_default()
    }

    /// `waiter` is ordered after everything `waited` did so far (`Synchronize`).
    pub fn synchronize(&mut self, waiter: StreamKey, waited: StreamKey) {
        let other = self.clock(Agent::Stream(waited)).clone();
        join(self.clock(Agent::Stream(waiter)), &other);
    }

    /// A communication posted on `stream`: a new agent ordered after the stream's work so far.
    pub fn post(&mut self, stream: StreamKey) -> Agent {
        self.next_comm += 1;
        let agent = Agent::Comm(self.next_comm);
        let clock = self.clock(Agent::Stream(stream)).clone();
        self.clocks.insert(agent, clock);
        self.comm_streams.insert(self.next_comm, stream);
        agent
    }

    /// `waiter` is ordered after everything the communication `comm` did (`Wait`).
    pub fn wait(&mut self, waiter: StreamKey, comm: Agent) {
        let other = self.clock(comm).clone();
        join(self.clock(Agent::Stream(waiter)), &other);
    }

    /// Records an access by `agent` of `region` (of the tensor named `tensor`) made by the
    /// statement `stmt`, reporting every earlier conflicting access it is not ordered after.
    pub fn access(&mut self, agent: Agent, region: Region, write: bool, stmt: &str, tensor: &str) {
        let stream = match agent {
            Agent::Stream(s) => s,
            Agent::Comm(n) => self
                .comm_streams
                .get(&n)
                .copied()
                .unwrap_or(StreamKey::Main),
        };
        let clock = self.clock(agent).clone();
        let history = self.accesses.entry(region.allocation).or_default();
        for a in history.iter() {
            if a.agent == agent || !(write || a.write) || !a.region.overlaps(&region) {
                continue;
            }
            if clock.get(&a.agent).copied().unwrap_or(0) < a.epoch {
                let report = RaceReport {
                    stmt: stmt.to_string(),
                    tensor: tensor.to_string(),
                    write,
                    stream,
                    other_stmt: a.stmt.clone(),
                    other_tensor: a.tensor.clone(),
                    other_write: a.write,
                    other_stream: a.stream,
                };
                if !self.reports.contains(&report) {
                    self.reports.push(report);
                }
            }
        }
        let own = self.clock(agent).entry(agent).or_insert(0);
        *own += 1;
        let epoch = *own;
        let history = self.accesses.entry(region.allocation).or_default();
        // A write supersedes the earlier accesses it covers and is ordered after: whatever
        // would race with one of them races with the write too.
        if write {
            history.retain(|a| {
                let covered = a
                    .region
                    .ranges
                    .iter()
                    .zip(&region.ranges)
                    .all(|(x, y)| y.start <= x.start && x.end <= y.end);
                let ordered =
                    a.agent == agent || clock.get(&a.agent).copied().unwrap_or(0) >= a.epoch;
                !(covered && ordered)
            });
        }
        history.push(Access {
            agent,
            stream,
            epoch,
            write,
            region,
            stmt: stmt.to_string(),
            tensor: tensor.to_string(),
        });
    }

    /// Every race found so far, in the order found.
    pub fn reports(&self) -> &[RaceReport] {
        &self.reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(alloc: u64, lo: usize, hi: usize) -> Region {
        Region {
            allocation: alloc,
            ranges: std::iter::once(lo..hi).collect(),
        }
    }

    #[test]
    fn synchronize_orders_and_its_absence_is_reported() {
        let main = StreamKey::Main;
        let s0 = StreamKey::Pool(0);
        let mut c = RaceChecker::new();
        c.access(Agent::Stream(main), r(1, 0, 8), true, "w", "T1");
        c.synchronize(s0, main);
        c.access(Agent::Stream(s0), r(1, 0, 4), false, "r0", "T1");
        assert!(c.reports().is_empty());
        c.access(
            Agent::Stream(StreamKey::Pool(1)),
            r(1, 4, 8),
            false,
            "r1",
            "T1",
        );
        assert_eq!(c.reports().len(), 1);
        assert_eq!(
            c.reports()[0].to_string(),
            "race: `r1` on pool stream 1 reads T1, unordered with `w` on main stream, which writes T1"
        );
    }

    #[test]
    fn disjoint_regions_and_two_reads_do_not_conflict() {
        let mut c = RaceChecker::new();
        let (p0, p1) = (
            Agent::Stream(StreamKey::Pool(0)),
            Agent::Stream(StreamKey::Pool(1)),
        );
        // (agent, region, writes, label, tensor)
        for (agent, region, write, label, tensor) in [
            (p0, r(1, 0, 4), true, "a", "T"),
            (p1, r(1, 4, 8), true, "b", "T"),
            (p0, r(2, 0, 4), false, "c", "U"),
            (p1, r(2, 0, 4), false, "d", "U"),
        ] {
            c.access(agent, region, write, label, tensor);
        }
        assert!(c.reports().is_empty());
    }

    #[test]
    fn a_communication_is_ordered_only_through_its_wait() {
        let s0 = StreamKey::Pool(0);
        let mut c = RaceChecker::new();
        let comm = c.post(s0);
        c.access(comm, r(1, 0, 4), true, "Communication 3", "T2");
        c.access(Agent::Stream(s0), r(1, 0, 4), false, "early read", "T2");
        assert_eq!(
            c.reports().len(),
            1,
            "no Wait yet: the same stream still races"
        );
        c.wait(s0, comm);
        c.access(Agent::Stream(s0), r(1, 0, 4), false, "late read", "T2");
        assert_eq!(c.reports().len(), 1);
    }
}
