//! A user's program end to end on its own data: a row-parallel linear (the contraction axis
//! split across two ranks, the tokens cut into two stream chunks, the partial products summed
//! by an allreduce per chunk), compiled once and run on bf16 tensors the program makes itself.
//!
//! `cargo run -p streamweave --example own_tensors`

use streamweave::half::bf16;
use streamweave::{Compiler, Error, Outputs, RunOptions, Target, Tensor};

/// The fusion: `y = x · wᵀ` with `x` and `w` split on their last axis across `d` devices.
const SOURCE: &str = "\
fusion row_parallel(t = 4, k = 4, n = 2, d: mesh = 2, s: chunks = 2) {
  mesh m = devices(d)
  tensor x: bf16[t, k] on m
  tensor w: bf16[n, k] on m
  y = linear(x, w)
  output y
  schedule x { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
}
";

fn bf16s(values: &[f32]) -> Vec<bf16> {
    values.iter().map(|v| bf16::from_f32(*v)).collect()
}

/// Compiles the fusion for two ranks and runs it on the CPU backend (one thread per rank).
pub fn run() -> Result<Outputs, Error> {
    let exe = Compiler::new()
        .devices(2)
        .compile_source("row_parallel.weave", SOURCE)?;
    let x = Tensor::new(
        vec![4, 4],
        bf16s(&[
            1., 2., 3., 4., 5., 6., 7., 8., 1., 0., 1., 0., 0., 1., 0., 1.,
        ]),
    )?;
    let w = Tensor::new(vec![2, 4], bf16s(&[1., 1., 1., 1., 1., -1., 1., -1.]))?;
    let run = exe.run(
        &[("x", &x), ("w", &w)],
        &RunOptions::on(Target::Cpu { ranks: 2 }),
    )?;
    Ok(run.into_outputs()?)
}

fn main() -> Result<(), Error> {
    let outputs = run()?;
    for (name, t) in outputs.iter() {
        let values: Vec<f32> = t
            .as_bf16()
            .unwrap_or_default()
            .iter()
            .map(|v| v.to_f32())
            .collect();
        println!("{name} {:?} = {values:?}", t.shape());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_outputs_are_the_hand_computed_products() {
        let outputs = super::run().unwrap();
        let y = outputs.get("y").unwrap();
        assert_eq!(y.shape(), &[4, 2]);
        // Row sums, and alternating sums: 1+2+3+4, 1-2+3-4; 5+6+7+8, 5-6+7-8; …
        let want = [10., -2., 26., -2., 2., 2., 2., -2.];
        let got: Vec<f32> = y.as_bf16().unwrap().iter().map(|v| v.to_f32()).collect();
        assert_eq!(got, want);
    }
}
