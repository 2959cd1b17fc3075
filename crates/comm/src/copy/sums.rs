//! Which kernels a copy-engine reduction launches, known before it runs: a
//! [`Reducer`](crate::Reducer) loads them ahead of a run ([`CopyComm::load_reductions`]),
//! because loading a module in the middle of one can wait for the whole GPU — which a flag
//! wait of the windows, or a peer's kernel, may hold until another rank enqueues its part,
//! while that rank's thread waits for the same load (ranks that are threads of one process
//! share the driver).

use crate::communicator::ReductionShape;
use crate::copy::{CopyComm, CopyTransport};
use crate::dtype::DataType;
use crate::error::CommError;

/// One kernel of a copy-engine reduction, as a [`Reducer`](crate::Reducer) launches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SumKernel {
    /// [`Reducer::sum_pointers`](crate::Reducer::sum_pointers) of `k` vectors of `n` elements.
    Pointers {
        /// The element type.
        dtype: DataType,
        /// Vectors added.
        k: usize,
        /// Elements per vector.
        n: usize,
    },
    /// [`Reducer::sum_blocks`](crate::Reducer::sum_blocks) of `blocks` blocks of `n` elements.
    Blocks {
        /// The element type.
        dtype: DataType,
        /// Blocks added.
        blocks: usize,
        /// Elements per block.
        n: usize,
    },
}

/// The kernels a copy-engine reduction of `shape` launches: with windows of `slot` bytes
/// (a transport that reduces in its windows), one pointwise sum per distinct piece length,
/// both as [`CopyTransport::reduce_in_windows`] cuts the blocks (pieces of a slot) and as
/// [`CopyTransport::produce_in_windows`] does (whole rows that fit a slot); without, one
/// block sum. Empty for what goes to the wrapped communicator (a team of one, sizes that do
/// not split into the team's blocks).
pub fn sum_kernels(shape: &ReductionShape, slot: Option<usize>) -> Vec<SumKernel> {
    let d = shape.team;
    let size = shape.dtype.size();
    let block_len = if shape.allreduce {
        if shape.output_len != shape.input_len || !shape.input_len.is_multiple_of(d.max(1)) {
            return Vec::new();
        }
        shape.input_len / d.max(1)
    } else {
        if shape.input_len != shape.output_len.saturating_mul(d) {
            return Vec::new();
        }
        shape.output_len
    };
    if d < 2 || block_len == 0 {
        return Vec::new();
    }
    let dtype = shape.dtype;
    let Some(slot) = slot else {
        return vec![SumKernel::Blocks {
            dtype,
            blocks: d,
            n: block_len,
        }];
    };
    let block = block_len.saturating_mul(size);
    let mut lengths = Vec::new();
    let mut pieces_of = |piece: usize| {
        if piece == 0 {
            return;
        }
        lengths.push(piece.min(block));
        if block > piece && !block.is_multiple_of(piece) {
            lengths.push(block % piece);
        }
    };
    pieces_of(slot.max(1));
    let row = shape.row.saturating_mul(size);
    if row > 0 && block.is_multiple_of(row) {
        pieces_of(slot / row * row);
    }
    let mut kernels: Vec<SumKernel> = Vec::new();
    for bytes in lengths {
        let k = SumKernel::Pointers {
            dtype,
            k: d,
            n: bytes / size,
        };
        if !kernels.contains(&k) {
            kernels.push(k);
        }
    }
    kernels
}

impl<T: CopyTransport, C> CopyComm<T, C> {
    /// Loads, before a run, every kernel that the copy-engine reductions of `shapes` launch
    /// ([`sum_kernels`] for this transport's slots, each once), so that no module is loaded
    /// while the run's waits are in flight (see the module documentation). Nothing without a
    /// reducer, or for element types it does not reduce.
    pub fn load_reductions(&self, shapes: &[ReductionShape]) -> Result<(), CommError> {
        let Some(reducer) = &self.reducer else {
            return Ok(());
        };
        let slot = self
            .transport
            .reduces_in_windows()
            .then(|| self.transport.slot_bytes())
            .flatten();
        let mut loaded: Vec<SumKernel> = Vec::new();
        for shape in shapes.iter().filter(|s| reducer.reduces(s.dtype)) {
            for kernel in sum_kernels(shape, slot) {
                if !loaded.contains(&kernel) {
                    reducer.load(kernel)?;
                    loaded.push(kernel);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::{plan_reduce, plan_reduce_pieces, IpcOptions, PieceCounts, WindowLayout};

    /// The piece lengths (elements) the windows' plans sum for one member's post: as
    /// `reduce_in_windows` cuts a block (pieces of a slot) and, where the block is whole rows,
    /// as `produce_in_windows` does (whole rows that fit a slot).
    fn planned_lengths(shape: &ReductionShape, slot_bytes: usize) -> Vec<usize> {
        let size = shape.dtype.size();
        let d = shape.team;
        let block = if shape.allreduce {
            shape.input_len / d
        } else {
            shape.output_len
        } * size;
        let layout = WindowLayout::new(
            d,
            IpcOptions {
                lanes: 1,
                slots: 2,
                slot_bytes,
            },
        )
        .unwrap();
        let sends: Vec<(usize, u64, usize)> = (1..d).map(|p| (p, 0, block)).collect();
        let from: Vec<usize> = (1..d).collect();
        let mut rounds = plan_reduce(
            0,
            &layout,
            &mut PieceCounts::new(d, 1),
            0,
            &sends,
            &from,
            block,
        )
        .rounds;
        let row = shape.row * size;
        if row > 0 && block.is_multiple_of(row) && slot_bytes / row > 0 {
            let piece = slot_bytes / row * row;
            let counts = &mut PieceCounts::new(d, 1);
            rounds.extend(
                plan_reduce_pieces(0, &layout, counts, 0, &sends, &from, (block, piece)).rounds,
            );
        }
        let mut lengths: Vec<usize> = rounds.iter().map(|r| r.len / size).collect();
        lengths.sort_unstable();
        lengths.dedup();
        lengths
    }

    /// Over a table of teams, sizes, rows and slots, the kernels named ahead are exactly the
    /// piece lengths the windows' plans sum: nothing a post launches is left to load mid-run,
    /// and nothing is loaded that no post launches.
    #[test]
    fn the_kernels_loaded_ahead_are_the_pieces_the_windows_sum() {
        let mut checked = 0;
        for team in [2, 3, 4, 8] {
            for block_len in [1, 7, 128, 1000, 4096, 6000] {
                for row in [1, 10, 64, 1000, 4097] {
                    for slot_bytes in [256, 512, 2048, 8192, 1 << 20] {
                        for allreduce in [false, true] {
                            let shape = ReductionShape {
                                team,
                                allreduce,
                                dtype: DataType::Bf16,
                                input_len: block_len * team,
                                output_len: if allreduce {
                                    block_len * team
                                } else {
                                    block_len
                                },
                                row,
                            };
                            let mut named: Vec<usize> = sum_kernels(&shape, Some(slot_bytes))
                                .into_iter()
                                .map(|k| match k {
                                    SumKernel::Pointers { dtype, k, n } => {
                                        assert_eq!((dtype, k), (DataType::Bf16, team));
                                        n
                                    }
                                    SumKernel::Blocks { .. } => panic!("{k:?} with windows"),
                                })
                                .collect();
                            named.sort_unstable();
                            assert_eq!(
                                named,
                                planned_lengths(&shape, slot_bytes),
                                "{shape:?}, slots of {slot_bytes} bytes"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 4 * 6 * 5 * 5 * 2);
    }

    /// Without windows the blocks are summed from scratch: one block sum of the team's blocks.
    /// What goes to the wrapped communicator launches nothing.
    #[test]
    fn without_windows_one_block_sum_and_nothing_for_what_nccl_takes() {
        let rs = |team, input_len, output_len| ReductionShape {
            team,
            allreduce: false,
            dtype: DataType::F32,
            input_len,
            output_len,
            row: 4,
        };
        assert_eq!(
            sum_kernels(&rs(4, 400, 100), None),
            vec![SumKernel::Blocks {
                dtype: DataType::F32,
                blocks: 4,
                n: 100
            }]
        );
        let ar = ReductionShape {
            allreduce: true,
            ..rs(3, 300, 300)
        };
        assert_eq!(
            sum_kernels(&ar, None),
            vec![SumKernel::Blocks {
                dtype: DataType::F32,
                blocks: 3,
                n: 100
            }]
        );
        // A team of one, an input the team does not split, an allreduce it does not divide,
        // empty blocks.
        assert!(sum_kernels(&rs(1, 100, 100), None).is_empty());
        assert!(sum_kernels(&rs(4, 401, 100), Some(256)).is_empty());
        assert!(sum_kernels(
            &ReductionShape {
                allreduce: true,
                ..rs(3, 301, 301)
            },
            None
        )
        .is_empty());
        assert!(sum_kernels(&rs(4, 0, 0), Some(256)).is_empty());
    }
}
