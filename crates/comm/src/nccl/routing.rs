//! Team routing: which communicator a team's collectives use, and the plan of
//! `ncclCommSplit` rounds that gives every team needing one its own communicator.

use std::collections::HashSet;

/// `NCCL_SPLIT_NOCOLOR` from `nccl.h`: the color of a rank that joins no communicator in
/// `ncclCommSplit`.
pub const NCCL_SPLIT_NOCOLOR: i32 = -1;

/// Which communicator a team's collectives use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeamRoute {
    /// At most one member: no communicator; the operation is a device copy or nothing.
    Alone,
    /// Every rank, in rank order: the world communicator.
    World,
    /// A communicator split off the world by [`Nccl::prepare_teams`](super::Nccl::prepare_teams).
    Split,
}

impl TeamRoute {
    /// The route of `team` in a world of `world` ranks.
    pub fn of(team: &[usize], world: usize) -> TeamRoute {
        if team.len() <= 1 {
            TeamRoute::Alone
        } else if team.len() == world && team.iter().enumerate().all(|(i, &r)| i == r) {
            TeamRoute::World
        } else {
            TeamRoute::Split
        }
    }
}

/// Checks that `team` names distinct ranks of a world of `world` ranks (with the messages
/// of [`crate::Local`]).
pub(super) fn check_team(team: &[usize], world: usize) -> Result<(), TeamError> {
    for (i, &r) in team.iter().enumerate() {
        if r >= world {
            return Err(TeamError::OutsideWorld {
                team: team.to_vec(),
                rank: r,
                world,
            });
        }
        if team[..i].contains(&r) {
            return Err(TeamError::Twice {
                team: team.to_vec(),
                rank: r,
            });
        }
    }
    Ok(())
}

/// Why a team cannot be planned: it names a rank outside the world, or a rank twice.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TeamError {
    /// A member is not a rank of the world.
    #[error("team {team:?}: rank {rank} is outside the world of {world} ranks")]
    OutsideWorld {
        /// The team, as given.
        team: Vec<usize>,
        /// The member outside the world.
        rank: usize,
        /// The world's size.
        world: usize,
    },
    /// A member appears twice.
    #[error("team {team:?} names rank {rank} twice")]
    Twice {
        /// The team, as given.
        team: Vec<usize>,
        /// The repeated member.
        rank: usize,
    },
}

/// The communicators to split off the world for a list of teams, identical on every rank.
///
/// Every distinct team that needs a split (see [`TeamRoute`]) gets a color, its index in
/// [`TeamPlan::splits`]. Teams are packed, in order, into *rounds* of pairwise disjoint
/// teams; each round is one `ncclCommSplit` of the world, in which a rank passes the color of
/// its team of that round (or [`NCCL_SPLIT_NOCOLOR`]) and, as key, its index in that team, so
/// that the new communicator's ranks are the team indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamPlan {
    /// The distinct teams that need a split, in order of first appearance.
    pub splits: Vec<Vec<usize>>,
    /// Each round's teams, as indices into `splits`.
    pub rounds: Vec<Vec<usize>>,
}

impl TeamPlan {
    /// Plans the splits for `teams` in a world of `world` ranks, leaving out the teams in
    /// `done` (already split). Fails on a team that names a rank outside the world or a rank
    /// twice.
    pub fn new(
        world: usize,
        teams: &[Vec<usize>],
        done: &HashSet<Vec<usize>>,
    ) -> Result<TeamPlan, TeamError> {
        let mut splits: Vec<Vec<usize>> = Vec::new();
        for team in teams {
            check_team(team, world)?;
            if TeamRoute::of(team, world) == TeamRoute::Split
                && !done.contains(team)
                && !splits.contains(team)
            {
                splits.push(team.clone());
            }
        }
        let mut rounds: Vec<Vec<usize>> = Vec::new();
        let mut busy: Vec<HashSet<usize>> = Vec::new();
        for (color, team) in splits.iter().enumerate() {
            let free = busy
                .iter()
                .position(|ranks| team.iter().all(|r| !ranks.contains(r)));
            let round = match free {
                Some(round) => round,
                None => {
                    rounds.push(Vec::new());
                    busy.push(HashSet::new());
                    rounds.len() - 1
                }
            };
            rounds[round].push(color);
            busy[round].extend(team.iter().copied());
        }
        Ok(TeamPlan { splits, rounds })
    }

    /// What `rank` passes to `ncclCommSplit` in round `round`: (color, key), and the team it
    /// joins, if any.
    pub fn split_args(&self, round: usize, rank: usize) -> (i32, i32, Option<&[usize]>) {
        let joined = self.rounds.get(round).and_then(|colors| {
            colors.iter().find_map(|&color| {
                let team = self.splits.get(color)?;
                let key = team.iter().position(|&r| r == rank)?;
                Some((color, key, team.as_slice()))
            })
        });
        match joined {
            Some((color, key, team)) => (
                i32::try_from(color).unwrap_or(i32::MAX),
                i32::try_from(key).unwrap_or(i32::MAX),
                Some(team),
            ),
            None => (NCCL_SPLIT_NOCOLOR, 0, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_of_teams() {
        assert_eq!(TeamRoute::of(&[2], 4), TeamRoute::Alone);
        assert_eq!(TeamRoute::of(&[], 4), TeamRoute::Alone);
        assert_eq!(TeamRoute::of(&[0], 1), TeamRoute::Alone);
        assert_eq!(TeamRoute::of(&[0, 1, 2, 3], 4), TeamRoute::World);
        assert_eq!(TeamRoute::of(&[0, 1], 2), TeamRoute::World);
        assert_eq!(TeamRoute::of(&[1, 0], 2), TeamRoute::Split);
        assert_eq!(TeamRoute::of(&[3, 2, 1, 0], 4), TeamRoute::Split);
        assert_eq!(TeamRoute::of(&[0, 1], 4), TeamRoute::Split);
    }

    #[test]
    fn team_plan_packs_disjoint_teams_into_rounds() {
        let teams = vec![
            vec![0, 1, 2, 3], // world: no split
            vec![0, 1],
            vec![2, 3],
            vec![2],    // alone
            vec![0, 1], // repeated
            vec![1, 2],
            vec![3, 2, 1, 0], // world reversed: split
            vec![3, 0],
        ];
        let plan = TeamPlan::new(4, &teams, &HashSet::new()).unwrap();
        assert_eq!(
            plan.splits,
            vec![
                vec![0, 1],
                vec![2, 3],
                vec![1, 2],
                vec![3, 2, 1, 0],
                vec![3, 0]
            ]
        );
        // [1, 2] is disjoint from [3, 0], so they share a round.
        assert_eq!(plan.rounds, vec![vec![0, 1], vec![2, 4], vec![3]]);
        // Round 0: ranks 0, 1 in color 0, ranks 2, 3 in color 1; keys are team indices.
        assert_eq!(plan.split_args(0, 0), (0, 0, Some(&[0usize, 1][..])));
        assert_eq!(plan.split_args(0, 1), (0, 1, Some(&[0usize, 1][..])));
        assert_eq!(plan.split_args(0, 3), (1, 1, Some(&[2usize, 3][..])));
        // Round 1: [1, 2] is color 2, [3, 0] is color 4: rank 0 is index 1 of [3, 0].
        assert_eq!(plan.split_args(1, 0), (4, 1, Some(&[3usize, 0][..])));
        assert_eq!(plan.split_args(1, 2), (2, 1, Some(&[1usize, 2][..])));
        // Round 2: the reversed world, keys reversed.
        assert_eq!(plan.split_args(2, 0).1, 3);
        assert_eq!(plan.split_args(2, 3).1, 0);
        // A rank in no team of a round passes NOCOLOR.
        let plan = TeamPlan::new(4, &[vec![0, 1]], &HashSet::new()).unwrap();
        assert_eq!(plan.split_args(0, 2), (NCCL_SPLIT_NOCOLOR, 0, None));
        // Teams already split are skipped.
        let done: HashSet<Vec<usize>> = [vec![0, 1]].into_iter().collect();
        let plan = TeamPlan::new(4, &[vec![0, 1], vec![2, 3]], &done).unwrap();
        assert_eq!(plan.splits, vec![vec![2, 3]]);
        assert_eq!(plan.rounds, vec![vec![0]]);
        let plan = TeamPlan::new(4, &[vec![0, 1, 2, 3], vec![1]], &HashSet::new()).unwrap();
        assert!(plan.rounds.is_empty());
    }

    #[test]
    fn team_plan_rejects_bad_teams() {
        let none = HashSet::new();
        assert_eq!(
            TeamPlan::new(4, &[vec![0, 4]], &none)
                .unwrap_err()
                .to_string(),
            "team [0, 4]: rank 4 is outside the world of 4 ranks"
        );
        assert_eq!(
            TeamPlan::new(4, &[vec![1, 2, 1]], &none)
                .unwrap_err()
                .to_string(),
            "team [1, 2, 1] names rank 1 twice"
        );
    }
}
