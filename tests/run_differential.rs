//! Differential property test of the whole pipeline: random small `.weave` fusions with
//! random valid DID/Stream schedules must load (parse, schedule, verify), compile, run on the
//! CPU backend with in-process ranks without races, and match the unsharded f64 reference.

use std::fmt::Write as _;

mod common;

use proptest::prelude::*;
use streamweave::Compiler;

// ---------------------------------------------------------------------------------------
// Source writing helpers
// ---------------------------------------------------------------------------------------

/// One generated program with the run it gets.
#[derive(Clone, Debug)]
struct Case {
    family: &'static str,
    source: String,
    ranks: usize,
    streams: usize,
}

impl Case {
    /// The case of family `family` whose source is `src` closed with the fusion's `}`.
    fn closed(family: &'static str, mut src: String, ranks: usize, streams: usize) -> Case {
        src.push_str("}\n");
        Case {
            family,
            source: src,
            ranks,
            streams,
        }
    }

    /// The input seed: a hash of everything that makes up the case, so that a failing case
    /// reruns with the same inputs.
    fn seed(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self
            .source
            .bytes()
            .chain((self.ranks as u64).to_le_bytes())
            .chain((self.streams as u64).to_le_bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}

/// An extent written as `f * d * s` with only the factors that the axis is split by.
fn extent(f: usize, by_d: bool, by_s: bool, ragged: usize) -> String {
    let mut parts = Vec::new();
    if f != 1 || (!by_d && !by_s) {
        parts.push(f.to_string());
    }
    if by_d {
        parts.push("d".to_string());
    }
    if by_s {
        parts.push("s".to_string());
    }
    let e = parts.join(" * ");
    // An axis cut only into stream chunks may be longer by `ragged`: the chunks are then
    // uneven, the last ones shorter or empty (`s` = 4, `4 + 1` rows: 2, 2, 1 and none).
    if by_s && !by_d && ragged > 0 {
        format!("{e} + {ragged}")
    } else {
        e
    }
}

/// A schedule split: logical axis (of the loop domain as it starts, reduction axes
/// included), factor (a parameter name) and parallel type.
type Split = (usize, &'static str, &'static str);

/// The `outer_split` steps that apply `splits` in order to a loop domain of `rank` axes. A
/// second split of the same logical axis cuts the inner remainder of the first (a DID split
/// inside each stream chunk, as in `matmul_rs.weave`).
fn split_steps(rank: usize, splits: &[Split]) -> Vec<String> {
    let mut loop_axes: Vec<usize> = (0..rank).collect();
    let mut steps = Vec::new();
    for &(axis, factor, ptype) in splits {
        let pos = loop_axes
            .iter()
            .rposition(|&l| l == axis)
            .expect("split of an axis the domain has");
        steps.push(format!("outer_split({pos}, {factor}) -> {ptype}"));
        loop_axes.insert(pos, axis);
    }
    steps
}

/// A `schedule` line, or nothing when there are no steps.
fn schedule(out: &mut String, tensor: &str, steps: &[String]) {
    if !steps.is_empty() {
        writeln!(out, "  schedule {tensor} {{ {} }}", steps.join("; ")).unwrap();
    }
}

/// A `schedule` line that puts `tensor` on `mesh` and then takes `steps`.
fn schedule_on(out: &mut String, tensor: &str, mesh: &str, steps: &[String]) {
    let mut all = vec![format!("mesh = {mesh}")];
    all.extend_from_slice(steps);
    schedule(out, tensor, &all);
}

/// The meshes: `m` over all `d` devices, as `devices(d)` or (when `rot % d != 0`) as an
/// explicit list rotated by `rot`, so that mesh coordinates differ from rank numbers; and,
/// when `root`, a one-device mesh `root`.
fn meshes(d: usize, rot: usize, root: bool) -> String {
    let mut out = if rot.is_multiple_of(d) {
        "  mesh m = devices(d)\n".to_string()
    } else {
        let list: Vec<String> = (0..d).map(|i| ((i + rot) % d).to_string()).collect();
        format!("  mesh m = [{}]\n", list.join(", "))
    };
    if root {
        writeln!(out, "  mesh root = [{}]", rot % d).unwrap();
    }
    out
}

/// The fusion header with the `d` and `s` parameters.
fn header(name: &str, d: usize, s: usize) -> String {
    format!("fusion {name}(d = {d}, s = {s}) {{\n")
}

// ---------------------------------------------------------------------------------------
// Family 1: pointwise chains
// ---------------------------------------------------------------------------------------

/// An enum of the ops of one kind, each written in `.weave` as `name()`, and the strategy
/// `$pick` that picks any of them, all equally likely.
macro_rules! ops {
    ($ty:ident, $pick:ident { $($op:ident => $name:literal,)+ }) => {
        #[derive(Clone, Copy, Debug)]
        enum $ty {
            $($op,)+
        }

        impl $ty {
            fn name(self) -> &'static str {
                match self {
                    $($ty::$op => $name,)+
                }
            }
        }

        fn $pick() -> impl Strategy<Value = $ty> {
            prop_oneof![$(Just($ty::$op)),+]
        }
    };
}

ops!(Un, un {
    Neg => "neg",
    Abs => "abs",
    Relu => "relu",
    Exp => "exp",
    Tanh => "tanh",
    Sigmoid => "sigmoid",
    Erf => "erf",
    Gelu => "gelu",
    GeluTanh => "gelu_tanh",
});

ops!(Bin, bin {
    Add => "add",
    Sub => "sub",
    Mul => "mul",
    Maximum => "maximum",
    Minimum => "minimum",
});

/// One op of a pointwise chain, applied to the latest value (and, for a binary op, to an
/// earlier value picked by index modulo the number of values so far).
#[derive(Clone, Copy, Debug)]
enum PwOp {
    Un(Un),
    Bin(Bin, usize),
    /// `c = lt(cur, other)` then `where(c, other, cur)`: a bool intermediate.
    Select(usize),
}

fn pw_op() -> impl Strategy<Value = PwOp> {
    prop_oneof![
        3 => un().prop_map(PwOp::Un),
        3 => (bin(), 0usize..8).prop_map(|(b, k)| PwOp::Bin(b, k)),
        1 => (0usize..8).prop_map(PwOp::Select),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Dt {
    F32,
    /// bf16 inputs cast to f32 first.
    Bf16In,
    /// f32 chain cast to bf16 at the end.
    Bf16Out,
}

fn dt() -> impl Strategy<Value = Dt> {
    prop_oneof![2 => Just(Dt::F32), 1 => Just(Dt::Bf16In), 1 => Just(Dt::Bf16Out)]
}

/// Where the stream split of a pointwise chain goes.
#[derive(Clone, Copy, Debug)]
enum PwStream {
    None,
    /// `outer_split(axis, s) -> Stream` on the output.
    Output(usize),
    /// `outer_split(axis, s) -> Stream` on the first input (reaches the chain by propagation).
    Input(usize),
}

/// The DID sharding of the output of a chain.
#[derive(Clone, Copy, Debug)]
enum OutDid {
    /// No schedule block (unless the stream goes there; then the inputs' DID is repeated).
    Propagate,
    /// `mesh = m` and no DID: replicated.
    Replicated,
    /// `mesh = m` and a DIDx split of this axis.
    Axis(usize),
    /// `mesh = root` (one device): a gather, or a local copy on that device.
    Root,
}

#[derive(Clone, Debug)]
struct Pointwise {
    d: usize,
    s: usize,
    streams: usize,
    sizes: [usize; 2],
    /// Elements added to an axis cut only into stream chunks (uneven chunks).
    ragged: usize,
    /// Combines input `i + 1` into the running value; its length is the input count - 1.
    combine: Vec<Bin>,
    ops: Vec<PwOp>,
    dt: Dt,
    in_did: Option<usize>,
    out_did: OutDid,
    stream: PwStream,
    extra_output: bool,
    /// A vector along axis 0, broadcast over axis 1 and added after the inputs combine.
    row_vec: bool,
    rot: usize,
}

fn pointwise() -> impl Strategy<Value = Pointwise> {
    (
        (
            1usize..=4,
            1usize..=4,
            1usize..=3,
            [1usize..=2, 1usize..=2],
            0usize..3,
        ),
        proptest::collection::vec(bin(), 0..=2),
        proptest::collection::vec(pw_op(), 1..=4),
        dt(),
        prop_oneof![Just(None), (0usize..2).prop_map(Some)],
        prop_oneof![
            2 => Just(OutDid::Propagate),
            1 => Just(OutDid::Replicated),
            1 => (0usize..2).prop_map(OutDid::Axis),
            1 => Just(OutDid::Root),
        ],
        prop_oneof![
            Just(PwStream::None),
            (0usize..2).prop_map(PwStream::Output),
            (0usize..2).prop_map(PwStream::Input),
        ],
        (any::<bool>(), any::<bool>(), 0usize..4),
    )
        .prop_map(
            |(
                (d, s, streams, sizes, ragged),
                combine,
                ops,
                dt,
                in_did,
                out_did,
                stream,
                (extra_output, row_vec, rot),
            )| {
                Pointwise {
                    d,
                    s,
                    streams,
                    sizes,
                    ragged,
                    combine,
                    ops,
                    dt,
                    in_did,
                    out_did,
                    stream,
                    extra_output,
                    row_vec,
                    rot,
                }
            },
        )
}

impl Pointwise {
    /// The output's DID as written: a stream split on the output makes it user-sharded, so
    /// `Propagate` then repeats the inputs' DID.
    fn effective_out_did(&self) -> OutDid {
        match (self.out_did, self.stream) {
            (OutDid::Propagate, PwStream::Output(_)) => {
                self.in_did.map_or(OutDid::Replicated, OutDid::Axis)
            }
            (o, _) => o,
        }
    }

    /// The spec without the resharding patterns the compiler refuses on purpose (each refusal
    /// has its own test of the exact message).
    fn narrowed(&self) -> Pointwise {
        let mut p = self.clone();
        let out_axis = match p.effective_out_did() {
            OutDid::Axis(k) => Some(k),
            _ => None,
        };
        let stream_axis = match p.stream {
            PwStream::None => None,
            PwStream::Output(j) | PwStream::Input(j) => Some(j),
        };
        if let (Some(k), Some(k2)) = (p.in_did, out_axis) {
            if k != k2 {
                // An AllToAll (per stream chunk, through a gather, when a device split sits
                // inside the chunks: `all_to_all_from_or_into_stream_chunks_gathers_first`).
                return p;
            }
        }
        let Some(j) = stream_axis else { return p };
        if p.in_did != Some(j) {
            // From replicated inputs, any split of the output is a local slice.
            return p;
        }
        if let (PwStream::Output(_), OutDid::Replicated) = (p.stream, p.effective_out_did()) {
            // DID → Stream on one axis is a P2P ring or per-chunk broadcasts: load refuses
            // (clearly) stream factors that do not nest with the DID split.
            if !p.s.is_multiple_of(p.d) && !p.d.is_multiple_of(p.s) {
                p.s = p.d;
            }
            return p;
        }
        // Otherwise: an output on `root` cannot be stream-split on the inputs' DID axis
        // (decompose-reshardings refuses a DID → Stream set across meshes, clearly).
        if matches!(p.effective_out_did(), OutDid::Root) {
            let other = 1 - j;
            p.stream = match p.stream {
                PwStream::Output(_) => PwStream::Output(other),
                PwStream::Input(_) => PwStream::Input(other),
                PwStream::None => PwStream::None,
            };
        }
        p
    }

    fn case(&self) -> Case {
        let spec = self.narrowed();
        spec.case_as_is()
    }

    fn case_as_is(&self) -> Case {
        let Pointwise { d, s, .. } = *self;
        let n_inputs = self.combine.len() + 1;
        let out_did = self.effective_out_did();
        // Splits of every input (the first one also gets an input stream split).
        let in_did: Vec<Split> = self.in_did.iter().map(|&k| (k, "d", "DIDx")).collect();
        let mut first_in = Vec::new();
        if let PwStream::Input(j) = self.stream {
            first_in.push((j, "s", "Stream"));
        }
        first_in.extend(in_did.iter().copied());
        let mut out_splits: Vec<Split> = Vec::new();
        if let PwStream::Output(j) = self.stream {
            out_splits.push((j, "s", "Stream"));
        }
        if let OutDid::Axis(k) = out_did {
            out_splits.push((k, "d", "DIDx"));
        }
        let all: Vec<&Split> = first_in.iter().chain(&out_splits).collect();
        let by = |axis: usize, f: &str| all.iter().any(|sp| sp.0 == axis && sp.1 == f);
        let dims: Vec<String> = (0..2)
            .map(|a| extent(self.sizes[a], by(a, "d"), by(a, "s"), self.ragged))
            .collect();
        let in_ty = match self.dt {
            Dt::Bf16In => "bf16",
            _ => "f32",
        };

        let mut src = header("pointwise", d, s);
        src.push_str(&meshes(d, self.rot, matches!(out_did, OutDid::Root)));
        let names: Vec<String> = (0..n_inputs).map(|i| format!("in{i}")).collect();
        for n in &names {
            writeln!(src, "  tensor {n}: {in_ty}[{}] on m", dims.join(", ")).unwrap();
        }
        if self.row_vec {
            writeln!(src, "  tensor v: {in_ty}[{}] on m", dims[0]).unwrap();
        }
        let mut values: Vec<String> = Vec::new();
        let mut tmp = 0;
        let mut fresh = |src: &mut String, rhs: String| {
            let name = format!("t{tmp}");
            tmp += 1;
            writeln!(src, "  {name} = {rhs}").unwrap();
            name
        };
        for n in &names {
            let v = match self.dt {
                Dt::Bf16In => fresh(&mut src, format!("cast({n}, f32)")),
                _ => n.clone(),
            };
            values.push(v);
        }
        let mut cur = values[0].clone();
        for (i, b) in self.combine.iter().enumerate() {
            cur = fresh(&mut src, format!("{}({cur}, {})", b.name(), values[i + 1]));
            values.push(cur.clone());
        }
        if self.row_vec {
            let v = match self.dt {
                Dt::Bf16In => fresh(&mut src, "cast(v, f32)".to_string()),
                _ => "v".to_string(),
            };
            let vb = fresh(&mut src, format!("broadcast({v}, [1])"));
            cur = fresh(&mut src, format!("add({cur}, {vb})"));
            values.push(cur.clone());
        }
        // exp at most once, so that values stay far from f32 overflow.
        let mut exp_used = false;
        for op in &self.ops {
            let rhs = match *op {
                PwOp::Un(Un::Exp) if exp_used => format!("tanh({cur})"),
                PwOp::Un(u) => {
                    exp_used |= matches!(u, Un::Exp);
                    format!("{}({cur})", u.name())
                }
                PwOp::Bin(b, k) => format!("{}({cur}, {})", b.name(), values[k % values.len()]),
                PwOp::Select(k) => {
                    let other = values[k % values.len()].clone();
                    let c = fresh(&mut src, format!("lt({cur}, {other})"));
                    format!("where({c}, {other}, {cur})")
                }
            };
            cur = fresh(&mut src, rhs);
            values.push(cur.clone());
        }
        if matches!(self.dt, Dt::Bf16Out) {
            cur = fresh(&mut src, format!("cast({cur}, bf16)"));
        }
        writeln!(src, "  out = set({cur})").unwrap();
        // An intermediate that is both consumed and an output.
        let extra = self
            .extra_output
            .then(|| values[n_inputs..].first().cloned())
            .flatten();
        match &extra {
            Some(e) => writeln!(src, "  output out, {e}").unwrap(),
            None => writeln!(src, "  output out").unwrap(),
        }
        for (i, n) in names.iter().enumerate() {
            let splits = if i == 0 { &first_in } else { &in_did };
            schedule(&mut src, n, &split_steps(2, splits));
        }
        if self.row_vec && self.in_did == Some(0) {
            schedule(&mut src, "v", &split_steps(1, &[(0, "d", "DIDx")]));
        }
        if !matches!(out_did, OutDid::Propagate) {
            let mesh = if matches!(out_did, OutDid::Root) {
                "root"
            } else {
                "m"
            };
            schedule_on(&mut src, "out", mesh, &split_steps(2, &out_splits));
        }
        Case::closed("pointwise", src, d, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 2: reductions
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum RedDid {
    None,
    /// The reduced axis is DID-split on the input: a partial reduction per rank and an
    /// allreduce (output replicated on `m`), or a reduce to the one-device mesh `root`.
    Reduced {
        root: bool,
    },
    /// A kept axis (index into the kept axes) is DID-split on the input and the output.
    Kept(usize),
    /// A kept axis is DID-split on the input; the output is replicated (an allgather).
    KeptGathered(usize),
    /// The reduced axis is DID-split on the input; the output is DID-split on a kept axis
    /// (index into the kept axes): a reduce-scatter.
    Scatter(usize),
}

#[derive(Clone, Debug)]
struct Reduction {
    d: usize,
    s: usize,
    streams: usize,
    sizes: [usize; 3],
    /// Elements added to an axis cut only into stream chunks (uneven chunks).
    ragged: usize,
    max: bool,
    /// With `max`: a `min` reduction instead.
    min: bool,
    axis: usize,
    pre: Option<Un>,
    did: RedDid,
    /// A stream split of a kept axis (index into the kept axes) on the output.
    stream: Option<usize>,
    /// A pointwise op on the reduced result (then the output).
    post: Option<Un>,
    rot: usize,
}

fn reduction() -> impl Strategy<Value = Reduction> {
    (
        (
            1usize..=4,
            1usize..=4,
            1usize..=3,
            [1usize..=2, 1usize..=3, 1usize..=2],
            0usize..3,
        ),
        (any::<bool>(), any::<bool>()),
        0usize..3,
        prop_oneof![Just(None), un().prop_map(Some)],
        prop_oneof![
            Just(RedDid::None),
            any::<bool>().prop_map(|root| RedDid::Reduced { root }),
            (0usize..2).prop_map(RedDid::Kept),
            (0usize..2).prop_map(RedDid::KeptGathered),
            (0usize..2).prop_map(RedDid::Scatter),
        ],
        prop_oneof![Just(None), (0usize..2).prop_map(Some)],
        (
            prop_oneof![3 => Just(None), 1 => un().prop_map(Some)],
            0usize..4,
        ),
    )
        .prop_map(
            |((d, s, streams, sizes, ragged), (max, min), axis, pre, did, stream, (post, rot))| {
                Reduction {
                    d,
                    s,
                    streams,
                    sizes,
                    ragged,
                    max,
                    min,
                    axis,
                    pre,
                    did,
                    stream,
                    post,
                    rot,
                }
            },
        )
}

impl Reduction {
    /// The spec without the resharding patterns the compiler refuses on purpose.
    fn narrowed(&self) -> Reduction {
        let mut r = self.clone();
        if let RedDid::KeptGathered(k) = r.did {
            if r.stream == Some(k) && !r.s.is_multiple_of(r.d) && !r.d.is_multiple_of(r.s) {
                // A stream split of the gathered axis is a DID → Stream set, which
                // decompose-reshardings refuses (clearly) unless the factors nest; stream the
                // other kept axis.
                r.stream = Some(1 - k);
            }
        }
        r
    }

    fn case(&self) -> Case {
        let spec = self.narrowed();
        let Reduction { d, s, axis: r, .. } = spec;
        let kept: Vec<usize> = (0..3).filter(|&a| a != r).collect();
        let mut in_splits: Vec<Split> = Vec::new();
        let mut out_splits: Vec<Split> = Vec::new();
        let mut out_mesh = None;
        // On one axis the stream split comes first and the DID split cuts each chunk (a
        // Stream axis must be the outer output of outer splits of a logical axis).
        match spec.did {
            RedDid::None | RedDid::Kept(_) => {}
            RedDid::KeptGathered(_) => out_mesh = Some("m"),
            RedDid::Reduced { root } => {
                in_splits.push((r, "d", "DIDx"));
                out_mesh = Some(if root { "root" } else { "m" });
            }
            RedDid::Scatter(_) => {
                in_splits.push((r, "d", "DIDx"));
                out_mesh = Some("m");
                out_splits.push((r, "d", "DIDx"));
            }
        }
        if let Some(j) = spec.stream {
            out_mesh.get_or_insert("m");
            out_splits.push((kept[j], "s", "Stream"));
        }
        match spec.did {
            RedDid::Kept(k) => {
                in_splits.push((kept[k], "d", "DIDx"));
                if spec.stream.is_some() {
                    out_splits.push((kept[k], "d", "DIDx"));
                }
            }
            RedDid::Scatter(k) => out_splits.push((kept[k], "d", "DIDx")),
            RedDid::KeptGathered(k) => in_splits.push((kept[k], "d", "DIDx")),
            _ => {}
        }
        let all: Vec<&Split> = in_splits.iter().chain(&out_splits).collect();
        let by = |axis: usize, f: &str| all.iter().any(|sp| sp.0 == axis && sp.1 == f);
        let dims: Vec<String> = (0..3)
            .map(|a| extent(spec.sizes[a], by(a, "d"), by(a, "s"), spec.ragged))
            .collect();

        let mut src = header("reduction", d, s);
        src.push_str(&meshes(d, spec.rot, out_mesh == Some("root")));
        writeln!(src, "  tensor inp: f32[{}] on m", dims.join(", ")).unwrap();
        let mut cur = "inp".to_string();
        if let Some(u) = spec.pre {
            writeln!(src, "  pre = {}(inp)", u.name()).unwrap();
            cur = "pre".to_string();
        }
        let op = match (spec.max, spec.min) {
            (false, _) => "sum",
            (true, false) => "max",
            (true, true) => "min",
        };
        let red = if spec.post.is_some() { "red" } else { "out" };
        writeln!(src, "  {red} = {op}({cur}, [{r}])").unwrap();
        if let Some(u) = spec.post {
            writeln!(src, "  out = {}(red)", u.name()).unwrap();
        }
        src.push_str("  output out\n");
        schedule(&mut src, "inp", &split_steps(3, &in_splits));
        if let Some(mesh) = out_mesh {
            schedule_on(&mut src, red, mesh, &split_steps(3, &out_splits));
        }
        Case::closed("reduction", src, d, spec.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 3: matmul / linear
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum MmKind {
    Matmul,
    Linear,
    LinearBias,
}

#[derive(Clone, Copy, Debug)]
enum MmPar {
    /// Replicated weights.
    None,
    /// Contraction axis DID-split: allreduce, or reduce-scatter of the rows when `scatter`.
    Row { scatter: bool },
    /// Output features DID-split.
    Column,
    /// Rows DID-split on the input, gathered by a `set` stream-split by `d` (a P2P
    /// allgather), then a column-parallel product (as `column_parallel_linear.weave`).
    ColumnAg,
    /// Column-parallel product, an optional pointwise op, then a row-parallel product whose
    /// partial sums are allreduced (a Megatron MLP).
    Mlp { act: Option<Un> },
}

/// Where a product is stream-split.
#[derive(Clone, Copy, Debug)]
enum MmStream {
    None,
    /// `outer_split(0, s) -> Stream` on the input's rows.
    Rows,
    /// `outer_split(1, s) -> Stream` on the output's columns (`matmul_n.weave`); only with
    /// replicated weights or a replicated row-parallel output (else the rows are streamed).
    OutCols,
}

#[derive(Clone, Debug)]
struct Matmul {
    d: usize,
    s: usize,
    streams: usize,
    /// Elements added to an axis cut only into stream chunks (uneven chunks).
    ragged: usize,
    kind: MmKind,
    par: MmPar,
    stream: MmStream,
    bf16: bool,
    /// Factors of M, K, N (and the MLP's hidden size).
    sizes: [usize; 4],
    /// A column-parallel bias is DID-split like the weight's rows (else replicated).
    shard_bias: bool,
    /// A pointwise op on the product (not for the P2P allgather and the MLP).
    post: Option<Un>,
    rot: usize,
}

fn matmul() -> impl Strategy<Value = Matmul> {
    (
        (1usize..=4, 1usize..=4, 1usize..=3, 0usize..3),
        prop_oneof![
            Just(MmKind::Matmul),
            Just(MmKind::Linear),
            Just(MmKind::LinearBias)
        ],
        prop_oneof![
            Just(MmPar::None),
            any::<bool>().prop_map(|scatter| MmPar::Row { scatter }),
            Just(MmPar::Column),
            Just(MmPar::ColumnAg),
            prop_oneof![Just(None), un().prop_map(Some)].prop_map(|act| MmPar::Mlp { act }),
        ],
        prop_oneof![
            Just(MmStream::None),
            Just(MmStream::Rows),
            Just(MmStream::OutCols)
        ],
        prop::bool::weighted(0.25),
        [1usize..=3, 1usize..=4, 1usize..=3, 1usize..=3],
        (
            any::<bool>(),
            prop_oneof![2 => Just(None), 1 => un().prop_map(Some)],
            0usize..4,
        ),
    )
        .prop_map(
            |((d, s, streams, ragged), kind, par, stream, bf16, sizes, (shard_bias, post, rot))| {
                Matmul {
                    d,
                    s,
                    streams,
                    ragged,
                    kind,
                    par,
                    stream,
                    bf16,
                    sizes,
                    shard_bias,
                    post,
                    rot,
                }
            },
        )
}

impl Matmul {
    fn case(&self) -> Case {
        let Matmul { d, s, .. } = *self;
        // bf16 only where the result is rounded once: the reference rounds only at explicit
        // casts, so a bf16 intermediate (a row-parallel partial, the MLP's hidden layer) can
        // legitimately miss the tolerance on a small output with cancellation.
        let bf16 = self.bf16 && matches!(self.par, MmPar::None | MmPar::Column | MmPar::ColumnAg);
        let ty = if bf16 { "bf16" } else { "f32" };
        let [mf, kf, nf, hf] = self.sizes;
        let linear = !matches!(self.kind, MmKind::Matmul);
        let bias = matches!(self.kind, MmKind::LinearBias);
        // Stream split of the rows (not for the P2P allgather, which streams over d), or of
        // the output's columns.
        let out_cols = matches!(self.stream, MmStream::OutCols)
            && matches!(self.par, MmPar::None | MmPar::Row { scatter: false });
        let stream = !out_cols
            && !matches!(self.stream, MmStream::None)
            && !matches!(self.par, MmPar::ColumnAg);
        let row_d = matches!(self.par, MmPar::Row { scatter: true } | MmPar::ColumnAg);
        let m = extent(mf, row_d, stream, self.ragged);
        let k = extent(kf, matches!(self.par, MmPar::Row { .. }), false, 0);
        let n = extent(
            nf,
            matches!(self.par, MmPar::Column | MmPar::ColumnAg),
            out_cols,
            self.ragged,
        );
        let h = extent(hf, true, false, 0);
        let mut src = header("matmul", d, s);
        src.push_str(&meshes(d, self.rot, false));
        // A weight of a product with `rows` inputs and `cols` outputs: `[rows, cols]` for
        // matmul, `[cols, rows]` for linear. Returns the axis of `rows` and of `cols`.
        let weight = |src: &mut String, name: &str, rows: &str, cols: &str| {
            if linear {
                writeln!(src, "  tensor {name}: {ty}[{cols}, {rows}] on m").unwrap();
                (1, 0)
            } else {
                writeln!(src, "  tensor {name}: {ty}[{rows}, {cols}] on m").unwrap();
                (0, 1)
            }
        };
        let product = |a: &str, w: &str, b: Option<&str>| match (linear, b) {
            (false, _) => format!("matmul({a}, {w})"),
            (true, None) => format!("linear({a}, {w})"),
            (true, Some(b)) => format!("linear({a}, {w}, {b})"),
        };
        let stream_split: Vec<Split> = if stream {
            vec![(0, "s", "Stream")]
        } else {
            Vec::new()
        };
        let mut schedules = String::new();
        match self.par {
            MmPar::None | MmPar::Column | MmPar::Row { .. } => {
                writeln!(src, "  tensor inp: {ty}[{m}, {k}] on m").unwrap();
                let (w_rows, w_cols) = weight(&mut src, "w", &k, &n);
                if bias {
                    writeln!(src, "  tensor bias: {ty}[{n}] on m").unwrap();
                }
                let rhs = product("inp", "w", bias.then_some("bias"));
                let prod = if self.post.is_some() { "prod" } else { "out" };
                writeln!(src, "  {prod} = {rhs}").unwrap();
                if let Some(u) = self.post {
                    writeln!(src, "  out = {}(prod)", u.name()).unwrap();
                }
                src.push_str("  output out\n");
                let mut inp = stream_split.clone();
                let mut w = Vec::new();
                let mut out = Vec::new();
                match self.par {
                    MmPar::None => {}
                    MmPar::Column => {
                        w.push((w_cols, "d", "DIDx"));
                        if bias && self.shard_bias {
                            schedule(&mut schedules, "bias", &split_steps(1, &[(0, "d", "DIDx")]));
                        }
                    }
                    MmPar::Row { scatter } => {
                        inp.push((1, "d", "DIDx"));
                        w.push((w_rows, "d", "DIDx"));
                        if scatter {
                            // Loop domain of out: [M, N, r(K)].
                            out.push((2, "d", "DIDx"));
                            out.extend(stream_split.iter().copied());
                            out.push((0, "d", "DIDx"));
                        }
                    }
                    _ => unreachable!(),
                }
                if out_cols {
                    // Loop domain of out: [M, N, r(K)]; the output is replicated.
                    out.push((1, "s", "Stream"));
                }
                schedule(&mut schedules, "inp", &split_steps(2, &inp));
                schedule(&mut schedules, "w", &split_steps(2, &w));
                if !out.is_empty() {
                    schedule_on(&mut schedules, prod, "m", &split_steps(3, &out));
                }
            }
            MmPar::ColumnAg => {
                writeln!(src, "  tensor inp: {ty}[{m}, {k}] on m").unwrap();
                let (_, w_cols) = weight(&mut src, "w", &k, &n);
                if bias {
                    writeln!(src, "  tensor bias: {ty}[{n}] on m").unwrap();
                }
                src.push_str("  ag = set(inp)\n");
                let rhs = product("ag", "w", bias.then_some("bias"));
                writeln!(src, "  out = {rhs}").unwrap();
                src.push_str("  output out\n");
                schedule(&mut schedules, "inp", &split_steps(2, &[(0, "d", "DIDx")]));
                schedule(
                    &mut schedules,
                    "w",
                    &split_steps(2, &[(w_cols, "d", "DIDx")]),
                );
                if bias && self.shard_bias {
                    schedule(&mut schedules, "bias", &split_steps(1, &[(0, "d", "DIDx")]));
                }
                schedule_on(
                    &mut schedules,
                    "ag",
                    "m",
                    &split_steps(2, &[(0, "d", "Stream")]),
                );
            }
            MmPar::Mlp { act } => {
                writeln!(src, "  tensor inp: {ty}[{m}, {k}] on m").unwrap();
                let (_, w1_cols) = weight(&mut src, "w1", &k, &h);
                let (w2_rows, _) = weight(&mut src, "w2", &h, &n);
                let rhs = product("inp", "w1", None);
                writeln!(src, "  hid = {rhs}").unwrap();
                let mut cur = "hid";
                if let Some(u) = act {
                    writeln!(src, "  act = {}(hid)", u.name()).unwrap();
                    cur = "act";
                }
                let rhs = product(cur, "w2", None);
                writeln!(src, "  out = {rhs}").unwrap();
                src.push_str("  output out\n");
                schedule(&mut schedules, "inp", &split_steps(2, &stream_split));
                schedule(
                    &mut schedules,
                    "w1",
                    &split_steps(2, &[(w1_cols, "d", "DIDx")]),
                );
                schedule(
                    &mut schedules,
                    "w2",
                    &split_steps(2, &[(w2_rows, "d", "DIDx")]),
                );
            }
        }
        src.push_str(&schedules);
        Case::closed("matmul", src, d, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 4: single collectives
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Coll {
    /// `[d, n]` sharded on its logical axis 0, gathered (`allgather.weave`).
    Allgather,
    /// `[d * n, c]` DID loop split on axis 0, gathered, optionally stream-split on axis 1.
    AllgatherLoopSplit,
    /// `[r, n]` on the one-device mesh `root` copied to `m` (`broadcast.weave`).
    Broadcast,
    /// `sum` over a logical DID axis of `[d, n]`, replicated (`allreduce.weave`).
    Allreduce,
    /// The same into `root` (`reduce.weave`).
    Reduce,
    /// `sum` of `[d, d, n]` over axis 0, scattered on axis 1 (`reduce_scatter_logical.weave`).
    ReduceScatter,
    /// Sharded on one axis, resharded on the other (`all_to_all_*.weave`).
    AllToAll { dispatch: bool },
    /// `[d, n]` sharded, gathered into `root` (`gather.weave`).
    Gather,
    /// `[d, n]` on `root`, scattered over `m` (`scatter.weave`).
    Scatter,
    /// `[s, d, n]`: an allgather per stream chunk (`stream_allgather.weave`).
    StreamAllgather,
    /// `[s, d, n]`: an allreduce per stream chunk (`stream_allreduce.weave`).
    StreamAllreduce,
    /// `[s, d, d, n]`: a reduce-scatter per stream chunk (`stream_reduce_scatter.weave`).
    StreamReduceScatter,
    /// `[d, n]` DID → Stream on the same axis (`allgather_p2p.weave`).
    AllgatherP2p,
}

#[derive(Clone, Debug)]
struct Collective {
    d: usize,
    s: usize,
    streams: usize,
    coll: Coll,
    /// Size factors of the axes that are not device or stream axes.
    n: usize,
    c: usize,
    /// A stream split of the output (the loop-split allgather and the broadcast only).
    stream: bool,
    bf16: bool,
    rot: usize,
}

fn collective() -> impl Strategy<Value = Collective> {
    (
        (1usize..=4, 1usize..=4, 1usize..=3),
        prop_oneof![
            Just(Coll::Allgather),
            Just(Coll::AllgatherLoopSplit),
            Just(Coll::Broadcast),
            Just(Coll::Allreduce),
            Just(Coll::Reduce),
            Just(Coll::ReduceScatter),
            any::<bool>().prop_map(|dispatch| Coll::AllToAll { dispatch }),
            Just(Coll::Gather),
            Just(Coll::Scatter),
            Just(Coll::StreamAllgather),
            Just(Coll::StreamAllreduce),
            Just(Coll::StreamReduceScatter),
            Just(Coll::AllgatherP2p),
        ],
        1usize..=6,
        1usize..=3,
        any::<bool>(),
        prop::bool::weighted(0.25),
        0usize..4,
    )
        .prop_map(
            |((d, s, streams), coll, n, c, stream, bf16, rot)| Collective {
                d,
                s,
                streams,
                coll,
                n,
                c,
                stream,
                bf16,
                rot,
            },
        )
}

impl Collective {
    fn case(&self) -> Case {
        let Collective { d, s, n, c, .. } = *self;
        // bf16 only for copies: a reduction may round partial sums, which the reference
        // (rounding only at explicit casts) does not.
        let reduces = matches!(
            self.coll,
            Coll::Allreduce
                | Coll::Reduce
                | Coll::ReduceScatter
                | Coll::StreamAllreduce
                | Coll::StreamReduceScatter
        );
        let ty = if self.bf16 && !reduces { "bf16" } else { "f32" };
        let mut src = header("collective", d, s);
        let root = matches!(
            self.coll,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        );
        src.push_str(&meshes(d, self.rot, root));
        let (shape, on, op, inp, out): (String, &str, &str, Vec<String>, Vec<String>) =
            match self.coll {
                Coll::Allgather => (
                    format!("d, {n}"),
                    "m",
                    "set",
                    vec!["parallelize(0, DIDx)".into()],
                    vec!["mesh = m".into()],
                ),
                Coll::AllgatherLoopSplit => {
                    let mut out = vec!["mesh = m".to_string()];
                    if self.stream {
                        out.extend(split_steps(2, &[(1, "s", "Stream")]));
                    }
                    (
                        format!(
                            "{}, {}",
                            extent(n, true, false, 0),
                            extent(c, false, self.stream, 0)
                        ),
                        "m",
                        "set",
                        split_steps(2, &[(0, "d", "DIDx")]),
                        out,
                    )
                }
                Coll::Broadcast => {
                    let mut out = vec!["mesh = m".to_string()];
                    if self.stream {
                        out.extend(split_steps(2, &[(0, "s", "Stream")]));
                    }
                    (
                        format!("{}, {c}", extent(n, false, self.stream, 0)),
                        "root",
                        "set",
                        vec![],
                        out,
                    )
                }
                Coll::Allreduce | Coll::Reduce => (
                    format!("d, {n}"),
                    "m",
                    "sum0",
                    vec!["parallelize(0, DIDx)".into()],
                    vec![if matches!(self.coll, Coll::Reduce) {
                        "mesh = root".into()
                    } else {
                        "mesh = m".into()
                    }],
                ),
                Coll::ReduceScatter => (
                    format!("d, d, {n}"),
                    "m",
                    "sum0",
                    vec!["parallelize(0, DIDx)".into()],
                    vec!["mesh = m".into(), "parallelize(1, DIDx)".into()],
                ),
                Coll::AllToAll { dispatch } => {
                    let (from, to) = if dispatch { (0, 1) } else { (1, 0) };
                    let mut out = vec!["mesh = m".to_string()];
                    out.extend(split_steps(2, &[(to, "d", "DIDx")]));
                    (
                        format!(
                            "{}, {}",
                            extent(n, true, false, 0),
                            extent(c, true, false, 0)
                        ),
                        "m",
                        "set",
                        split_steps(2, &[(from, "d", "DIDx")]),
                        out,
                    )
                }
                Coll::Gather => (
                    format!("d, {n}"),
                    "m",
                    "set",
                    vec!["parallelize(0, DIDx)".into()],
                    vec!["mesh = root".into()],
                ),
                Coll::Scatter => (
                    format!("d, {n}"),
                    "root",
                    "set",
                    vec![],
                    vec!["mesh = m".into(), "parallelize(0, DIDx)".into()],
                ),
                Coll::StreamAllgather => (
                    format!("s, d, {n}"),
                    "m",
                    "set",
                    vec!["parallelize(1, DIDx)".into()],
                    vec!["mesh = m".into(), "parallelize(0, Stream)".into()],
                ),
                Coll::StreamAllreduce => (
                    format!("s, d, {n}"),
                    "m",
                    "sum1",
                    vec!["parallelize(1, DIDx)".into()],
                    vec!["mesh = m".into(), "parallelize(0, Stream)".into()],
                ),
                Coll::StreamReduceScatter => (
                    format!("s, d, d, {n}"),
                    "m",
                    "sum1",
                    vec!["parallelize(1, DIDx)".into()],
                    vec![
                        "mesh = m".into(),
                        "parallelize(0, Stream)".into(),
                        "parallelize(2, DIDx)".into(),
                    ],
                ),
                Coll::AllgatherP2p => (
                    format!("d, {n}"),
                    "m",
                    "set",
                    vec!["parallelize(0, DIDx)".into()],
                    vec!["mesh = m".into(), "parallelize(0, Stream)".into()],
                ),
            };
        writeln!(src, "  tensor inp: {ty}[{shape}] on {on}").unwrap();
        let rhs = match op {
            "sum0" => "sum(inp, [0])".to_string(),
            "sum1" => "sum(inp, [1])".to_string(),
            _ => "set(inp)".to_string(),
        };
        writeln!(src, "  out = {rhs}").unwrap();
        src.push_str("  output out\n");
        schedule(&mut src, "inp", &inp);
        schedule(&mut src, "out", &out);
        Case::closed("collective", src, d, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 5: matmul with broadcast batch axes
// ---------------------------------------------------------------------------------------

/// How one operand holds an output batch axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchAxis {
    /// An axis of the batch's extent.
    Real,
    /// A broadcast axis (from `broadcast`), which the other operand's axis stretches.
    Bcast,
}

/// Where a batched product is DID-split.
#[derive(Clone, Copy, Debug)]
enum BmmPar {
    None,
    /// The first batch axis that both operands hold (no communication).
    Batch,
    /// The contraction axis (an allreduce of the partial products).
    Contraction,
}

#[derive(Clone, Debug)]
struct BatchedMatmul {
    d: usize,
    s: usize,
    streams: usize,
    /// Per output batch axis (1 or 2 of them): how `a` and `b` hold it.
    axes: Vec<(BatchAxis, BatchAxis)>,
    /// Leave out `a`'s / `b`'s leading broadcast axes (batch axes align at the right).
    drop: (bool, bool),
    par: BmmPar,
    /// `outer_split(0, s) -> Stream` on an operand that holds batch axis 0.
    stream: bool,
    /// Factors of the batch axes, M, K and N.
    sizes: [usize; 5],
    /// Extra elements of a batch axis cut only into stream chunks (uneven chunks).
    ragged: usize,
    rot: usize,
}

fn batched_matmul() -> impl Strategy<Value = BatchedMatmul> {
    let axis = prop_oneof![
        2 => Just((BatchAxis::Real, BatchAxis::Real)),
        1 => Just((BatchAxis::Real, BatchAxis::Bcast)),
        1 => Just((BatchAxis::Bcast, BatchAxis::Real)),
    ];
    (
        (1usize..=4, 1usize..=4, 1usize..=3, 0usize..3),
        prop::collection::vec(axis, 1..=2),
        (any::<bool>(), any::<bool>()),
        prop_oneof![
            Just(BmmPar::None),
            Just(BmmPar::Batch),
            Just(BmmPar::Contraction)
        ],
        any::<bool>(),
        [1usize..=2, 1usize..=2, 1usize..=3, 1usize..=3, 1usize..=3],
        0usize..4,
    )
        .prop_map(
            |((d, s, streams, ragged), axes, drop, par, stream, sizes, rot)| BatchedMatmul {
                d,
                s,
                streams,
                axes,
                drop,
                par,
                stream,
                sizes,
                ragged,
                rot,
            },
        )
}

impl BatchedMatmul {
    fn case(&self) -> Case {
        let BatchedMatmul { d, s, .. } = *self;
        let nb = self.axes.len();
        let [b0, b1, mf, kf, nf] = self.sizes;
        let bf = [b0, b1];
        // The DID-split batch axis: the first that both operands hold, not the stream axis.
        let did_batch = match self.par {
            BmmPar::Batch => (0..nb).find(|j| {
                self.axes[*j] == (BatchAxis::Real, BatchAxis::Real) && !(self.stream && *j == 0)
            }),
            _ => None,
        };
        let batch_ext: Vec<String> = (0..nb)
            .map(|j| {
                extent(
                    bf[j],
                    did_batch == Some(j),
                    self.stream && j == 0,
                    self.ragged,
                )
            })
            .collect();
        let by_k = matches!(self.par, BmmPar::Contraction);
        let (m, k, n) = (
            extent(mf, false, false, 0),
            extent(kf, by_k, false, 0),
            extent(nf, false, false, 0),
        );
        let mut src = header("bmm", d, s);
        src.push_str(&meshes(d, self.rot, false));
        let mut schedules = String::new();
        let mut ops = String::new();
        // One operand: its input (real batch axes, then its matrix axes) and, when it has
        // broadcast axes, the `broadcast` that makes it. Returns the operand's name.
        let mut operand = |name: &str,
                           side: usize,
                           drop: bool,
                           matrix: [&str; 2],
                           k_axis: usize,
                           stream_here: bool| {
            let holds: Vec<BatchAxis> = self
                .axes
                .iter()
                .map(|a| if side == 0 { a.0 } else { a.1 })
                .collect();
            let lead = if drop {
                holds.iter().take_while(|h| **h == BatchAxis::Bcast).count()
            } else {
                0
            };
            let kept: Vec<usize> = (lead..nb).collect();
            let real: Vec<usize> = kept
                .iter()
                .copied()
                .filter(|j| holds[*j] == BatchAxis::Real)
                .collect();
            let mut dims: Vec<String> = real.iter().map(|j| batch_ext[*j].clone()).collect();
            dims.extend(matrix.iter().map(|x| x.to_string()));
            let input = format!("{name}0");
            writeln!(src, "  tensor {input}: f32[{}] on m", dims.join(", ")).unwrap();
            let bc: Vec<String> = kept
                .iter()
                .enumerate()
                .filter(|(_, j)| holds[**j] == BatchAxis::Bcast)
                .map(|(pos, _)| pos.to_string())
                .collect();
            let mut splits: Vec<Split> = Vec::new();
            if stream_here {
                splits.push((0, "s", "Stream"));
            }
            if let Some(j) = did_batch {
                let pos = real.iter().position(|x| *x == j).expect("both hold it");
                splits.push((pos, "d", "DIDx"));
            }
            if by_k {
                splits.push((real.len() + k_axis, "d", "DIDx"));
            }
            schedule(&mut schedules, &input, &split_steps(dims.len(), &splits));
            if bc.is_empty() {
                input
            } else {
                writeln!(ops, "  {name} = broadcast({input}, [{}])", bc.join(", ")).unwrap();
                name.to_string()
            }
        };
        let a_streams = self.stream && self.axes[0].0 == BatchAxis::Real;
        let b_streams = self.stream && !a_streams;
        let a = operand("a", 0, self.drop.0, [&m, &k], 1, a_streams);
        let b = operand("b", 1, self.drop.1, [&k, &n], 0, b_streams);
        src.push_str(&ops);
        writeln!(src, "  out = matmul({a}, {b})").unwrap();
        src.push_str("  output out\n");
        src.push_str(&schedules);
        Case::closed("batched_matmul", src, d, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 6: collectives over one axis of a 2-D mesh
// ---------------------------------------------------------------------------------------

/// The mesh shapes `(MESH_DY[i], MESH_DX[i])` of family 6: every shape of at most 4 devices,
/// `(1, 1)`, `(1, 2)`, `(2, 1)`, `(2, 2)`, `(1, 3)`, `(3, 1)`, `(1, 4)` and `(4, 1)`.
const MESH_DY: [usize; 8] = [1, 1, 2, 2, 1, 3, 1, 4];
/// See [`MESH_DY`].
const MESH_DX: [usize; 8] = [1, 2, 1, 2, 3, 1, 4, 1];

#[derive(Clone, Copy, Debug)]
enum Coll2d {
    /// Moving axis on 1 → replicated.
    Allgather,
    /// `sum` over the moving axis 1, replicated.
    Allreduce,
    /// `sum` over the moving axis 1, scattered on axis 2.
    ReduceScatter,
    /// Moving axis on 1 → on 2 (or back).
    AllToAll { dispatch: bool },
    /// Moving axis on 1 → Stream on 1 (a Broadcast per iteration, or the P2P ring).
    StreamBroadcast,
    /// `sum` over the moving axis 1 with the output stream-split on axis 3.
    StreamAllreduce,
    /// Both types move: the kept type from axis 0 to axis 1, the moving one from 1 to 0.
    Swap,
}

/// `inp [K * r, M * a, M * b, n]` on `devices(dy, dx)`, where `K` is the size of the mesh axis
/// that keeps its split (axis 0, on both sides) and `M` that of the axis the collective runs
/// over: within every slice of the mesh along `M`.
#[derive(Clone, Debug)]
struct Mesh2d {
    shape: (usize, usize),
    /// The collective runs over DIDx (rows of the mesh) or DIDy (its columns).
    over_x: bool,
    s: usize,
    streams: usize,
    coll: Coll2d,
    r: usize,
    a: usize,
    b: usize,
    n: usize,
    bf16: bool,
    /// The mesh written out with device `(k + rot) % (dy * dx)` at flat position `k`, so that
    /// its slices are not strided slices of the ranks.
    rot: usize,
}

fn mesh2d() -> impl Strategy<Value = Mesh2d> {
    (
        (0usize..MESH_DY.len(), any::<bool>(), 1usize..=3, 1usize..=3),
        prop_oneof![
            Just(Coll2d::Allgather),
            Just(Coll2d::Allreduce),
            Just(Coll2d::ReduceScatter),
            any::<bool>().prop_map(|dispatch| Coll2d::AllToAll { dispatch }),
            Just(Coll2d::StreamBroadcast),
            Just(Coll2d::StreamAllreduce),
            Just(Coll2d::Swap),
        ],
        (1usize..=2, 1usize..=3, 1usize..=3, 1usize..=3),
        (prop::bool::weighted(0.25), 0usize..4),
    )
        .prop_map(
            |((shape, over_x, s, streams), coll, (r, a, b, n), (bf16, rot))| Mesh2d {
                shape: (MESH_DY[shape], MESH_DX[shape]),
                over_x,
                s,
                streams,
                coll,
                r,
                a,
                b,
                n,
                bf16,
                rot,
            },
        )
}

impl Mesh2d {
    fn case(&self) -> Case {
        let (dy, dx) = self.shape;
        let (keep, keep_p, mov, mov_p) = if self.over_x {
            ("dy", "DIDy", "dx", "DIDx")
        } else {
            ("dx", "DIDx", "dy", "DIDy")
        };
        let Mesh2d { r, a, b, n, s, .. } = *self;
        let reduces = matches!(
            self.coll,
            Coll2d::Allreduce | Coll2d::ReduceScatter | Coll2d::StreamAllreduce
        );
        let ty = if self.bf16 && !reduces { "bf16" } else { "f32" };
        let n_ext = if matches!(self.coll, Coll2d::StreamAllreduce) {
            format!("s * {n}")
        } else {
            n.to_string()
        };
        let mut src = format!("fusion mesh2d(dy = {dy}, dx = {dx}, s = {s}) {{\n");
        let n_dev = dy * dx;
        if self.rot.is_multiple_of(n_dev) {
            src.push_str("  mesh m = devices(dy, dx)\n");
        } else {
            let rows: Vec<String> = (0..dy)
                .map(|y| {
                    let row: Vec<String> = (0..dx)
                        .map(|x| ((y * dx + x + self.rot) % n_dev).to_string())
                        .collect();
                    format!("[{}]", row.join(", "))
                })
                .collect();
            writeln!(src, "  mesh m = [{}]", rows.join(", ")).unwrap();
        }
        let (e0, e1) = if matches!(self.coll, Coll2d::Swap) {
            (
                format!("{keep} * {mov} * {r}"),
                format!("{keep} * {mov} * {a}"),
            )
        } else {
            (format!("{keep} * {r}"), format!("{mov} * {a}"))
        };
        writeln!(
            src,
            "  tensor inp: {ty}[{e0}, {e1}, {mov} * {b}, {n_ext}] on m"
        )
        .unwrap();
        let mut inp: Vec<Split> = vec![(0, keep, keep_p), (1, mov, mov_p)];
        let mut out: Vec<Split> = vec![(0, keep, keep_p)];
        let rhs = match self.coll {
            Coll2d::Allgather => "set(inp)",
            Coll2d::Allreduce => "sum(inp, [1])",
            Coll2d::ReduceScatter => {
                out.push((2, mov, mov_p));
                "sum(inp, [1])"
            }
            Coll2d::AllToAll { dispatch } => {
                if dispatch {
                    out.push((2, mov, mov_p));
                } else {
                    inp[1] = (2, mov, mov_p);
                    out.push((1, mov, mov_p));
                }
                "set(inp)"
            }
            Coll2d::StreamBroadcast => {
                out.push((1, mov, "Stream"));
                "set(inp)"
            }
            Coll2d::StreamAllreduce => {
                out.push((3, "s", "Stream"));
                "sum(inp, [1])"
            }
            Coll2d::Swap => {
                out = vec![(0, mov, mov_p), (1, keep, keep_p)];
                "set(inp)"
            }
        };
        writeln!(src, "  out = {rhs}").unwrap();
        src.push_str("  output out\n");
        schedule(&mut src, "inp", &split_steps(4, &inp));
        schedule_on(&mut src, "out", "m", &split_steps(4, &out));
        Case::closed("2-D mesh", src, dy * dx, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// The check
// ---------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------
// Family 12: the ops of a whole model layer (issue 28): iota, slice, concat, mean, var (with
// and without a correction), min, erf/gelu/gelu_tanh and index_select, on replicated,
// row-sharded, stream-chunked (evenly or not), stream-then-device and column-sharded layouts
// ---------------------------------------------------------------------------------------

/// One step of a layer program on the running value `v: [T, H]`.
#[derive(Clone, Copy, Debug)]
enum LayerOp {
    /// `v + cast(iota(v, 1), f32) * 0.125`: the column index, globally.
    Iota,
    /// `concat(slice(v, 1, a, H), slice(v, 1, 0, a), 1)`: the columns rotated by `a`
    /// (`1 + a % (H - 1)`: both slices non-empty).
    Rotate(usize),
    /// `slice(concat(v, u(v), 1), 1, a, a + H)`: a window of `v` next to `u(v)`.
    Window(usize, Un),
    /// `v - broadcast(mean(v, [1]), [1])`.
    Center,
    /// `v * rsqrt(broadcast(var(v, [1], c), [1]) + 1)`, `c` 0 or 1 (a layer norm's scale).
    Normalize(bool),
    /// `v + index_select(tab, ids, 0)`: an embedding of the rows' ids.
    Lookup,
    /// A unary op (erf, gelu, gelu_tanh among others).
    Unary(Un),
}

/// How the layer's input is laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum LayerLayout {
    Replicated,
    RowsDid,
    RowsStream,
    /// A stream split of the rows, each chunk across the devices.
    RowsStreamDid,
    /// The columns across the devices: only ops that keep them whole where they index them
    /// (the reductions and unary ops) are generated.
    ColsDid,
}

/// A reduction output of the layer's value.
#[derive(Clone, Copy, Debug)]
enum LayerRed {
    None,
    Mean(usize),
    Var(usize, bool),
    Min(usize),
}

#[derive(Clone, Debug)]
struct Layer {
    d: usize,
    s: usize,
    streams: usize,
    tf: usize,
    hf: usize,
    vf: usize,
    ragged: usize,
    layout: LayerLayout,
    ops: Vec<LayerOp>,
    red: LayerRed,
    /// The lookup table's rows split across the devices (vocabulary-parallel).
    table_did: bool,
}

fn layer_op() -> impl Strategy<Value = LayerOp> {
    prop_oneof![
        Just(LayerOp::Iota),
        (0usize..8).prop_map(LayerOp::Rotate),
        ((0usize..8), un()).prop_map(|(a, u)| LayerOp::Window(a, u)),
        Just(LayerOp::Center),
        any::<bool>().prop_map(LayerOp::Normalize),
        Just(LayerOp::Lookup),
        prop_oneof![Just(Un::Erf), Just(Un::Gelu), Just(Un::GeluTanh), un()]
            .prop_map(LayerOp::Unary),
    ]
}

fn layer() -> impl Strategy<Value = Layer> {
    (
        (
            1usize..=4,
            1usize..=4,
            1usize..=3,
            1usize..=3,
            2usize..=5,
            1usize..=3,
            0usize..3,
        ),
        prop_oneof![
            Just(LayerLayout::Replicated),
            Just(LayerLayout::RowsDid),
            Just(LayerLayout::RowsStream),
            Just(LayerLayout::RowsStreamDid),
            Just(LayerLayout::ColsDid),
        ],
        proptest::collection::vec(layer_op(), 1..=4),
        prop_oneof![
            Just(LayerRed::None),
            (0usize..2).prop_map(LayerRed::Mean),
            ((0usize..2), any::<bool>()).prop_map(|(a, c)| LayerRed::Var(a, c)),
            (0usize..2).prop_map(LayerRed::Min),
        ],
        any::<bool>(),
    )
        .prop_map(
            |((d, s, streams, tf, hf, vf, ragged), layout, ops, red, table_did)| Layer {
                d,
                s,
                streams,
                tf,
                hf,
                vf,
                ragged,
                layout,
                ops,
                red,
                table_did,
            },
        )
}

impl Layer {
    fn case(&self) -> Case {
        let Layer { d, s, layout, .. } = *self;
        let rows_d = matches!(layout, LayerLayout::RowsDid | LayerLayout::RowsStreamDid);
        let rows_s = matches!(layout, LayerLayout::RowsStream | LayerLayout::RowsStreamDid);
        let cols_d = layout == LayerLayout::ColsDid;
        let t = extent(self.tf, rows_d, rows_s, self.ragged);
        let h_val = self.hf * if cols_d { d } else { 1 };
        let h = if cols_d {
            extent(self.hf, true, false, 0)
        } else {
            h_val.to_string()
        };
        // The number of rows, for a correction over them.
        let t_val = self.tf * if rows_d { d } else { 1 } * if rows_s { s } else { 1 }
            + if rows_s && !rows_d { self.ragged } else { 0 };
        let ops: Vec<LayerOp> = self
            .ops
            .iter()
            .copied()
            .filter(|op| {
                !cols_d
                    || matches!(
                        op,
                        LayerOp::Center
                            | LayerOp::Normalize(_)
                            | LayerOp::Unary(_)
                            | LayerOp::Lookup
                    )
            })
            .collect();
        let lookup = ops.iter().any(|o| matches!(o, LayerOp::Lookup));
        let table_did = self.table_did && d > 1 && lookup;
        let v_rows = self.vf * if table_did { d } else { 1 };

        let mut src = header("layer", d, s);
        src.push_str(&meshes(d, 0, false));
        writeln!(src, "  tensor x: f32[{t}, {h}] on m").unwrap();
        if lookup {
            let vr = if table_did {
                extent(self.vf, true, false, 0)
            } else {
                v_rows.to_string()
            };
            writeln!(src, "  tensor tab: f32[{vr}, {h}] on m").unwrap();
            writeln!(
                src,
                "  tensor ids: i64[{t}] on m drawn uniform(0, {v_rows})"
            )
            .unwrap();
        }
        let mut cur = "x".to_string();
        for (k, op) in ops.iter().enumerate() {
            let name = format!("v{k}");
            let e = match *op {
                LayerOp::Iota => format!("{cur} + cast(iota({cur}, 1), f32) * 0.125"),
                LayerOp::Rotate(a) => {
                    // Both slices non-empty (an empty slice is refused at load).
                    let a = 1 + a % (h_val - 1);
                    format!("concat(slice({cur}, 1, {a}, {h_val}), slice({cur}, 1, 0, {a}), 1)")
                }
                LayerOp::Window(a, u) => {
                    let a = a % (h_val + 1);
                    format!(
                        "slice(concat({cur}, {}({cur}), 1), 1, {a}, {})",
                        u.name(),
                        a + h_val
                    )
                }
                LayerOp::Center => format!("{cur} - broadcast(mean({cur}, [1]), [1])"),
                LayerOp::Normalize(c) => format!(
                    "{cur} * rsqrt(broadcast(var({cur}, [1]{}), [1]) + 1)",
                    if c { ", 1" } else { "" }
                ),
                LayerOp::Lookup => format!("{cur} + index_select(tab, ids, 0)"),
                LayerOp::Unary(u) => format!("{}({cur})", u.name()),
            };
            writeln!(src, "  {name} = {e}").unwrap();
            cur = name;
        }
        // A reduction over the rows is refused where they are stream-split (a Stream axis is
        // never reduced): reduce the columns there.
        let red = match self.red {
            LayerRed::Mean(0) | LayerRed::Var(0, _) | LayerRed::Min(0) if rows_s => {
                match self.red {
                    LayerRed::Mean(_) => LayerRed::Mean(1),
                    LayerRed::Var(_, c) => LayerRed::Var(1, c),
                    _ => LayerRed::Min(1),
                }
            }
            r => r,
        };
        let mut outs = vec![cur.clone()];
        let count = |axis: usize| if axis == 0 { t_val } else { h_val };
        let r = match red {
            LayerRed::None => None,
            LayerRed::Mean(a) => Some(format!("mean({cur}, [{a}])")),
            LayerRed::Var(a, c) => Some(if c && count(a) > 1 {
                format!("var({cur}, [{a}], 1)")
            } else {
                format!("var({cur}, [{a}])")
            }),
            LayerRed::Min(a) => Some(format!("min({cur}, [{a}])")),
        };
        if let Some(r) = r {
            writeln!(src, "  r = {r}").unwrap();
            outs.push("r".to_string());
        }
        if cur == "x" {
            // No op survived the layout's filter: the layer is its reduction or a gelu.
            writeln!(src, "  g = gelu(x)").unwrap();
            outs[0] = "g".to_string();
        }
        writeln!(src, "  output {}", outs.join(", ")).unwrap();
        let x_steps: Vec<String> = match layout {
            LayerLayout::Replicated => vec![],
            LayerLayout::RowsDid => vec!["outer_split(0, d) -> DIDx".to_string()],
            LayerLayout::RowsStream => vec!["outer_split(0, s) -> Stream".to_string()],
            LayerLayout::RowsStreamDid => vec![
                "outer_split(0, s) -> Stream".to_string(),
                "outer_split(1, d) -> DIDx".to_string(),
            ],
            LayerLayout::ColsDid => vec!["outer_split(1, d) -> DIDx".to_string()],
        };
        schedule(&mut src, "x", &x_steps);
        if table_did {
            schedule(&mut src, "tab", &["outer_split(0, d) -> DIDx".to_string()]);
        }
        Case::closed("layer", src, d, self.streams)
    }
}

/// A family's generator of cases.
type Cases = fn() -> BoxedStrategy<Case>;

/// Every family of this file, by name, with its generator of cases.
const FAMILIES: &[(&str, Cases)] = &[
    ("pointwise", || pointwise().prop_map(|p| p.case()).boxed()),
    ("reduction", || reduction().prop_map(|r| r.case()).boxed()),
    ("matmul", || matmul().prop_map(|m| m.case()).boxed()),
    ("collective", || collective().prop_map(|c| c.case()).boxed()),
    ("batched-matmul", || {
        batched_matmul().prop_map(|b| b.case()).boxed()
    }),
    ("mesh2d", || mesh2d().prop_map(|m| m.case()).boxed()),
    ("ragged", || ragged().prop_map(|r| r.case()).boxed()),
    ("grid", || grid().prop_map(|g| g.case()).boxed()),
    ("multi-mesh", || multi_mesh().prop_map(|m| m.case()).boxed()),
    ("backward", || backward().prop_map(|b| b.case()).boxed()),
    ("seq-par", || seq_par().prop_map(|q| q.case()).boxed()),
    ("layer", || layer().prop_map(|l| l.case()).boxed()),
];

/// The cases of the family `name`.
fn family(name: &str) -> BoxedStrategy<Case> {
    match FAMILIES.iter().find(|f| f.0 == name) {
        Some((_, cases)) => cases(),
        None => panic!("no family `{name}`"),
    }
}

/// A case of any family.
fn any_case() -> impl Strategy<Value = Case> {
    proptest::strategy::Union::new(FAMILIES.iter().map(|(_, cases)| cases()))
}

/// Loads, compiles and runs `case`; an error describes the failure with the whole case.
fn check(case: &Case) -> Result<(), String> {
    let seed = case.seed();
    let what = |stage: &str, detail: String| {
        format!(
            "{} case failed at {stage} (ranks = {}, numberOfStreams = {}, input seed = \
             {seed:#x}):\n{}\n--- {stage}:\n{detail}",
            case.family, case.ranks, case.streams, case.source
        )
    };
    let fusion = streamweave::load("gen.weave", &case.source, &[])
        .map_err(|e| what("load", e.to_string()))?;
    common::run_checked(fusion, case.ranks, case.streams, seed)
        .map(|_| ())
        .map_err(|f| what(f.stage, f.detail))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        // No proptest-regressions file: a failure prints the whole program to reproduce it.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Every generated fusion compiles, runs without races and matches the reference.
    #[test]
    fn random_fusions_match_the_reference(case in any_case()) {
        if let Err(e) = check(&case) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// One fixed program per family (and per interesting sub-shape), so every family is covered
/// whatever the random cases pick.
#[test]
fn fixed_programs_of_every_family_match_the_reference() {
    let cases = vec![
        // DID rows, a stream over the columns of the output, an intermediate output.
        Pointwise {
            d: 2,
            s: 3,
            streams: 2,
            sizes: [2, 1],
            ragged: 0,
            combine: vec![Bin::Add, Bin::Mul],
            ops: vec![
                PwOp::Un(Un::Exp),
                PwOp::Bin(Bin::Sub, 1),
                PwOp::Un(Un::Relu),
            ],
            dt: Dt::F32,
            in_did: Some(0),
            out_did: OutDid::Propagate,
            stream: PwStream::Output(1),
            extra_output: true,
            row_vec: true,
            rot: 1,
        }
        .case(),
        // bf16 inputs sharded on the rows, gathered by a DID → Stream P2P allgather.
        Pointwise {
            d: 3,
            s: 1,
            streams: 3,
            sizes: [1, 2],
            ragged: 1,
            combine: vec![Bin::Maximum],
            ops: vec![PwOp::Un(Un::Tanh)],
            dt: Dt::Bf16In,
            in_did: Some(0),
            out_did: OutDid::Replicated,
            stream: PwStream::Output(0),
            extra_output: false,
            row_vec: false,
            rot: 0,
        }
        .case(),
        // Allreduce of a DID-split reduced axis, per stream chunk, then a pointwise op.
        Reduction {
            d: 2,
            s: 2,
            streams: 2,
            sizes: [2, 1, 2],
            ragged: 0,
            max: false,
            min: false,
            axis: 1,
            pre: Some(Un::Abs),
            did: RedDid::Reduced { root: false },
            stream: Some(0),
            post: Some(Un::Neg),
            rot: 1,
        }
        .case(),
        // Reduce-scatter inside each stream chunk.
        Reduction {
            d: 3,
            s: 2,
            streams: 1,
            sizes: [1, 2, 1],
            ragged: 1,
            max: true,
            min: false,
            axis: 0,
            pre: None,
            did: RedDid::Scatter(1),
            stream: Some(1),
            post: None,
            rot: 0,
        }
        .case(),
        // A min over a DID-split axis (an allreduce of ncclMin's kind), gelu before it.
        Reduction {
            d: 4,
            s: 2,
            streams: 2,
            sizes: [1, 2, 2],
            ragged: 0,
            max: true,
            min: true,
            axis: 1,
            pre: Some(Un::Gelu),
            did: RedDid::Reduced { root: false },
            stream: Some(0),
            post: Some(Un::Erf),
            rot: 0,
        }
        .case(),
        // Row-parallel linear, reduce-scattered per stream chunk (matmul_rs.weave).
        Matmul {
            d: 2,
            s: 3,
            streams: 2,
            kind: MmKind::Linear,
            par: MmPar::Row { scatter: true },
            stream: MmStream::Rows,
            bf16: false,
            sizes: [1, 2, 2, 1],
            ragged: 0,
            shard_bias: false,
            post: None,
            rot: 0,
        }
        .case(),
        // Megatron MLP: column-parallel, relu, row-parallel with an allreduce.
        Matmul {
            d: 3,
            s: 2,
            streams: 3,
            kind: MmKind::Matmul,
            par: MmPar::Mlp {
                act: Some(Un::Relu),
            },
            stream: MmStream::Rows,
            bf16: false,
            sizes: [2, 2, 2, 1],
            ragged: 1,
            shard_bias: false,
            post: None,
            rot: 2,
        }
        .case(),
        // P2P allgather feeding a column-parallel linear with a sharded bias.
        Matmul {
            d: 4,
            s: 1,
            streams: 2,
            kind: MmKind::LinearBias,
            par: MmPar::ColumnAg,
            stream: MmStream::None,
            bf16: true,
            sizes: [1, 3, 1, 1],
            ragged: 0,
            shard_bias: true,
            post: None,
            rot: 0,
        }
        .case(),
        Collective {
            d: 4,
            s: 2,
            streams: 2,
            coll: Coll::StreamReduceScatter,
            n: 3,
            c: 1,
            stream: false,
            bf16: false,
            rot: 0,
        }
        .case(),
        Collective {
            d: 3,
            s: 3,
            streams: 2,
            coll: Coll::Broadcast,
            n: 2,
            c: 2,
            stream: true,
            bf16: false,
            rot: 2,
        }
        .case(),
    ];
    // Every collective of family 6 over the rows and over the columns of a 2 × 2 mesh, with
    // its devices in rank order and rotated.
    let mut cases = cases;
    for coll in [
        Coll2d::Allgather,
        Coll2d::Allreduce,
        Coll2d::ReduceScatter,
        Coll2d::AllToAll { dispatch: true },
        Coll2d::AllToAll { dispatch: false },
        Coll2d::StreamBroadcast,
        Coll2d::StreamAllreduce,
        Coll2d::Swap,
    ] {
        for (over_x, rot) in [(true, 0), (false, 0), (true, 1), (false, 3)] {
            let spec = Mesh2d {
                shape: (2, 2),
                over_x,
                s: 2,
                streams: 2,
                coll,
                r: 1,
                a: 2,
                b: 3,
                n: 2,
                bf16: false,
                rot,
            };
            cases.push(spec.case());
        }
    }
    // Every op of the `layer` family on every layout, on 2 ranks (4 with the table's rows
    // split), with uneven stream chunks where the rows are only streamed.
    let all_ops = vec![
        LayerOp::Lookup,
        LayerOp::Iota,
        LayerOp::Rotate(1),
        LayerOp::Window(3, Un::GeluTanh),
        LayerOp::Center,
        LayerOp::Normalize(true),
        LayerOp::Unary(Un::Erf),
        LayerOp::Unary(Un::Gelu),
    ];
    for (layout, red, d) in [
        (LayerLayout::Replicated, LayerRed::Var(0, true), 2),
        (LayerLayout::RowsDid, LayerRed::Mean(0), 4),
        (LayerLayout::RowsStream, LayerRed::Var(1, true), 2),
        (LayerLayout::RowsStreamDid, LayerRed::Min(1), 2),
        (LayerLayout::ColsDid, LayerRed::Var(1, false), 2),
    ] {
        let spec = Layer {
            d,
            s: 3,
            streams: 2,
            tf: 2,
            hf: 3,
            vf: 2,
            ragged: 1,
            layout,
            ops: all_ops.clone(),
            red,
            table_did: d == 4,
        };
        cases.push(spec.case());
    }
    let failures: Vec<String> = cases.iter().filter_map(|c| check(c).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---------------------------------------------------------------------------------------
// Regressions: minimized reproducers of the failures this generator found, each fixed; the
// families generate their shapes too.
// ---------------------------------------------------------------------------------------

/// Runs a literal program on `ranks` ranks and panics with the report when it fails.
fn assert_runs(source: &str, ranks: usize, streams: usize) {
    let case = Case {
        family: "known bug",
        source: source.to_string(),
        ranks,
        streams,
    };
    if let Err(e) = check(&case) {
        panic!("{e}");
    }
}

/// A device split moved to another axis from or into stream chunks (`[s, d, ..]` on one axis
/// against a plain DIDx split of the other), or next to a stream split of the other side's
/// device axis: the pieces are no blocks of both axes (or no chunk of every shard), so the copy
/// gathers per chunk and takes its rows, instead of an AllToAll.
#[test]
fn all_to_all_from_or_into_stream_chunks_gathers_first() {
    let into = "fusion into(d = 2, s = 2) {
  mesh m = devices(d)
  tensor x: f32[2 * d * s, 2 * d] on m
  out = set(x)
  output out
  schedule x { outer_split(1, d) -> DIDx }
  schedule out { mesh = m; outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }
}
";
    let from = into
        .replace("fusion into", "fusion from")
        .replace(
            "schedule x { outer_split(1, d) -> DIDx }",
            "schedule x { outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }",
        )
        .replace(
            "schedule out { mesh = m; outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }",
            "schedule out { mesh = m; outer_split(1, d) -> DIDx }",
        );
    // The output stream-split on the axis the input splits across devices (and the input
    // stream-split on the axis the output splits): a chunk of the stream axis is no chunk of
    // every device's shard (the generator found these giving wrong numbers).
    let across = "fusion across(d = 2, s = 2) {
  mesh m = devices(d)
  tensor x: f32[d, 2 * d * s] on m
  out = set(x)
  output out
  schedule x { outer_split(1, d) -> DIDx }
  schedule out { mesh = m; outer_split(1, s) -> Stream; outer_split(0, d) -> DIDx }
}
";
    let back = "fusion back(d = 2, s = 2) {
  mesh m = devices(d)
  tensor x: f32[2 * d, d * s] on m
  out = set(x)
  output out
  schedule x { outer_split(1, s) -> Stream; outer_split(0, d) -> DIDx }
  schedule out { mesh = m; outer_split(1, d) -> DIDx }
}
";
    for source in [into.to_string(), from, across.to_string(), back.to_string()] {
        for d in 1..=4 {
            for s in 1..=3 {
                let source = source.replace("(d = 2, s = 2)", &format!("(d = {d}, s = {s})"));
                assert_runs(&source, d, 2);
            }
        }
        // No AllToAll: a gather (an Allgather of the whole or per chunk, or a Broadcast per
        // chunk where the stream chunks nest in the shards), then the slice.
        let fusion = streamweave::load("a2a.weave", &source, &[]).unwrap();
        let compiled = Compiler::new().compile(&fusion).unwrap();
        let text = compiled.program().to_string();
        assert!(!text.contains("type=AllToAll"), "{text}");
        assert!(
            text.contains("type=Allgather") || text.contains("type=Broadcast"),
            "{text}"
        );
    }
}

/// A row-parallel `linear(x, w, bias)` is decomposed into the product, the reduction over
/// devices, and the bias added once after it (the generator first found the bias added on
/// every rank): with an Allreduce, per stream chunk, reduce-scattered per chunk, and with the
/// output's columns stream-split (the bias is then chunked too).
#[test]
fn row_parallel_linear_with_a_bias_adds_the_bias_once() {
    let allreduce = "fusion bias(d = 2) {
  mesh m = devices(d)
  tensor inp: f32[2, 2 * d] on m
  tensor w: f32[1, 2 * d] on m
  tensor bias: f32[1] on m
  out = linear(inp, w, bias)
  output out
  schedule inp { outer_split(1, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
}
";
    let streamed = "fusion bias_stream(d = 2, s = 3) {
  mesh m = devices(d)
  tensor inp: f32[2 * s, 2 * d] on m
  tensor w: f32[3, 2 * d] on m
  tensor bias: f32[3] on m
  out = linear(inp, w, bias)
  output out
  schedule inp { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
}
";
    let scattered = "fusion bias_rs(d = 2, s = 2) {
  mesh m = devices(d)
  tensor inp: f32[2 * s * d, 2 * d] on m
  tensor w: f32[3, 2 * d] on m
  tensor bias: f32[3] on m
  out = linear(inp, w, bias)
  output out
  schedule inp { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
  schedule out { mesh = m; outer_split(2, d) -> DIDx; outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }
}
";
    let columns = "fusion bias_n(d = 2, s = 3) {
  mesh m = devices(d)
  tensor inp: f32[4, 2 * d] on m
  tensor w: f32[3 * s, 2 * d] on m
  tensor bias: f32[3 * s] on m
  out = linear(inp, w, bias)
  output out
  schedule inp { outer_split(1, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
  schedule out { mesh = m; outer_split(1, s) -> Stream }
}
";
    // A vector input, a batched input, and a bias DID-split on the output features (gathered
    // for the add after the Allreduce).
    let vector = "fusion bias1d(d = 2) {
  mesh m = devices(d)
  tensor inp: f32[2 * d] on m
  tensor w: f32[3, 2 * d] on m
  tensor bias: f32[3] on m
  out = linear(inp, w, bias)
  output out
  schedule inp { outer_split(0, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
}
";
    let batched = "fusion bias3d(d = 2, s = 2) {
  mesh m = devices(d)
  tensor inp: f32[2, 2 * s, 2 * d] on m
  tensor w: f32[3, 2 * d] on m
  tensor bias: f32[3] on m
  out = linear(inp, w, bias)
  output out
  schedule inp { outer_split(1, s) -> Stream; outer_split(3, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
}
";
    let sharded_bias = "fusion biasdid(d = 2) {
  mesh m = devices(d)
  tensor inp: f32[4, 2 * d] on m
  tensor w: f32[2 * d, 2 * d] on m
  tensor bias: f32[2 * d] on m
  out = linear(inp, w, bias)
  output out
  schedule inp { outer_split(1, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
  schedule bias { outer_split(0, d) -> DIDx }
}
";
    for source in [
        allreduce,
        streamed,
        scattered,
        columns,
        vector,
        batched,
        sharded_bias,
    ] {
        for d in 1..=4 {
            let source = source.replacen("(d = 2", &format!("(d = {d}"), 1);
            assert_runs(&source, d, 2);
        }
    }
}

/// Resharding rows → columns is one AllToAll, whose flat pieces are the blocks of both axes
/// only when the scattered axis is outermost in the input and the gathered one in the output
/// (`all_to_all_dispatch.weave`, whose axis 0 has exactly `d` elements). With longer axes
/// `reorder-sharded-axis` packs the input (reshape + permute) and unpacks the output; both
/// directions, any lengths divisible by `d`, and the shapes of issue 19 (`t = h = 8`, `d = 2`
/// or 4; `t = h = 4`, `d = 2`).
#[test]
fn all_to_all_of_long_axes_places_every_block() {
    let long = |rows: &str, cols: &str, from: usize, to: usize| {
        format!(
            "fusion a2a(d = 2, t = 8, h = 8) {{
  mesh m = devices(d)
  tensor inp: f32[{rows}, {cols}] on m
  out = set(inp)
  output out
  schedule inp {{ outer_split({from}, d) -> DIDx }}
  schedule out {{ mesh = m; outer_split({to}, d) -> DIDx }}
}}
"
        )
    };
    let mut cases = Vec::new();
    for d in [1usize, 2, 3, 4] {
        for (rows, cols) in [("2 * d", "d"), ("d", "2 * d"), ("2 * d", "3 * d")] {
            for (from, to) in [(0, 1), (1, 0)] {
                cases.push((long(rows, cols, from, to), d, vec![]));
            }
        }
    }
    for (t, h, d) in [(8, 8, 2), (8, 8, 4), (4, 4, 2)] {
        let overrides = vec![("t", t), ("h", h)];
        cases.push((long("t", "h", 1, 0), d, overrides.clone()));
        cases.push((long("t", "h", 0, 1), d, overrides));
    }
    // A rank-3 tensor whose gathered axis is not the first one.
    let rank3 = "fusion a2a3(a = 2, b = 3, r = 2, d = 2) {
  mesh m = devices(d)
  tensor x: f32[r, d * a, d * b] on m
  y = set(x)
  output y
  schedule x { outer_split(2, d) -> DIDx }
  schedule y { mesh = m; outer_split(1, d) -> DIDx }
}
";
    for d in [2usize, 3] {
        cases.push((rank3.to_string(), d, vec![]));
    }
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(source, d, overrides)| {
            let mut source = source.replacen("d = 2", &format!("d = {d}"), 1);
            for (k, v) in overrides {
                source = source.replacen(&format!("{k} = 8"), &format!("{k} = {v}"), 1);
            }
            check(&Case {
                family: "all-to-all",
                source,
                ranks: *d,
                streams: 2,
            })
            .err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A sum over a DID-split axis of extent `2 * d` into a one-device mesh is rfactored like the
/// Allreduce form: a local partial sum on the senders' mesh, then a Reduce of one element per
/// device to the root (also a `max` over every axis to a root that is not device 0, and a
/// row-parallel `linear` whose output lives on the root).
#[test]
fn reduce_to_a_root_mesh_reduces_locally_first() {
    let sources = [
        "fusion reduce(d = 2) {
  mesh m = devices(d)
  mesh root = [0]
  tensor inp: f32[2 * d, 3] on m
  out = sum(inp, [0])
  output out
  schedule inp { outer_split(0, d) -> DIDx }
  schedule out { mesh = root }
}
",
        "fusion reduce_max(d = 2) {
  mesh m = devices(d)
  mesh root = [1]
  tensor inp: f32[2 * d, 3] on m
  out = max(inp, [0, 1])
  output out
  schedule inp { outer_split(0, d) -> DIDx }
  schedule out { mesh = root }
}
",
        "fusion linear_to_root(t = 4, h = 3, d = 2) {
  mesh m = devices(d)
  mesh root = [0]
  tensor inp: f32[t, 4 * d] on m
  tensor w: f32[h, 4 * d] on m
  out = linear(inp, w)
  output out
  schedule inp { outer_split(1, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
  schedule out { mesh = root }
}
",
    ];
    for source in sources {
        assert_runs(source, 2, 2);
    }
    let source = sources[0].replace("d = 2", "d = 3");
    assert_runs(&source, 3, 2);
}

/// A tensor whose DID split cuts each stream chunk (`outer_split(0, s) -> Stream;
/// outer_split(1, d) -> DIDx`, the layout `matmul_rs.weave` gives its output) resharded to a
/// plain DID split of the same axis: no shard moves whole to one device, so the copy is an
/// allgather into a replicated tensor and a scatter from it (it was a SendRecv whose team was
/// one rank).
#[test]
fn resharding_did_inside_stream_to_did_gathers_then_scatters() {
    assert_runs(
        "fusion nested(d = 2, s = 2) {
  mesh m = devices(d)
  tensor inp: f32[d * s, 2] on m
  out = set(inp)
  output out
  schedule inp { outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }
  schedule out { mesh = m; outer_split(0, d) -> DIDx }
}
",
        2,
        2,
    );
}

/// The same layout gathered into a replicated tensor: one Allgather per stream chunk (a single
/// one put the shards back as if the DID split were outermost, rows in the wrong order).
#[test]
fn allgather_of_did_inside_stream_is_posted_per_chunk() {
    assert_runs(
        "fusion nested_ag(d = 2, s = 2) {
  mesh m = devices(d)
  tensor inp: f32[d * s, 2] on m
  out = neg(inp)
  output out
  schedule inp { outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }
  schedule out { mesh = m }
}
",
        2,
        2,
    );
}

/// A pointwise chain whose inputs are sliced for a sharded output while a replicated vector
/// is sliced and broadcast: the vector's segments sit outside the stream loop without
/// depending on it, and lowering moves them before the loop instead of cutting it in two (the
/// loop's shapes from the linear side, with structural checks, are in
/// `tests/run_regressions.rs`).
#[test]
fn a_top_level_segment_between_two_parts_of_a_stream_loop_moves_before_it() {
    let row_vec = "fusion row_vec(d = 2, s = 2) {
  mesh m = devices(d)
  tensor in0: f32[d, s] on m
  tensor in1: f32[d, s] on m
  tensor v: f32[d] on m
  t0 = add(in0, in1)
  t1 = broadcast(v, [1])
  t2 = add(t0, t1)
  out = set(t2)
  output out
  schedule in0 { outer_split(1, s) -> Stream }
  schedule out { mesh = m; outer_split(0, d) -> DIDx }
}
";
    for d in 1..=4 {
        assert_runs(&row_vec.replace("(d = 2,", &format!("(d = {d},")), d, 2);
    }
}

/// Several meshes in one fusion, and 2-D meshes: a sharded copy to a disjoint mesh (one
/// SendRecv node of two pairs), computed there and copied back the same way; gathers and
/// reductions to receivers outside the sender mesh (through the senders, then a Broadcast);
/// and an AllToAll within the rows of a 2-D mesh whose tensors are also DIDy-split.
#[test]
fn several_meshes_and_two_dimensional_meshes_match_the_reference() {
    let outside = |op: &str, receivers: &str| {
        format!(
            "fusion outside(d = 2) {{
  mesh m = [0, 1]
  mesh r = {receivers}
  tensor inp: f32[4, 3] on m
  out = {op}
  output out
  schedule inp {{ outer_split(0, 2) -> DIDx }}
  schedule out {{ mesh = r }}
}}
"
        )
    };
    for (op, receivers, ranks) in [
        ("set(inp)", "[2]", 3),
        ("set(inp)", "[1, 2, 3]", 4),
        ("sum(inp, [0])", "[2]", 3),
        ("max(inp, [0, 1])", "[3, 2]", 4),
    ] {
        assert_runs(&outside(op, receivers), ranks, 2);
    }
    assert_runs(
        "fusion linear_outside(t = 4, h = 3) {
  mesh m = [0, 1]
  mesh r = [2]
  tensor inp: f32[t, 8] on m
  tensor w: f32[h, 8] on m
  out = linear(inp, w)
  output out
  schedule inp { outer_split(1, 2) -> DIDx }
  schedule w { outer_split(1, 2) -> DIDx }
  schedule out { mesh = r }
}
",
        3,
        2,
    );
    assert_runs(
        "fusion pairs(t = 4, h = 6) {
  mesh a = [0, 1]
  mesh b = [2, 3]
  tensor x: f32[t, h] on a
  y = set(x)
  z = neg(y)
  u = set(z)
  output u
  schedule x { outer_split(0, 2) -> DIDx }
  schedule y { mesh = b; outer_split(0, 2) -> DIDx }
  schedule u { mesh = a; outer_split(0, 2) -> DIDx }
}
",
        4,
        2,
    );
    // Sets that change DIDx and DIDy at once: one collective per change.
    let both = |from: &str, to: &str| {
        format!(
            "fusion both(a = 2, b = 3) {{
  mesh m = devices(2, 2)
  tensor x: f32[4 * a, 4 * b] on m
  y = set(x)
  output y
  schedule x {{ {from} }}
  schedule y {{ mesh = m; {to} }}
}}
"
        )
    };
    for (from, to) in [
        (
            "outer_split(0, 2) -> DIDx; outer_split(2, 2) -> DIDy",
            "outer_split(0, 2) -> DIDy; outer_split(2, 2) -> DIDx",
        ),
        ("outer_split(0, 2) -> DIDx", "outer_split(1, 2) -> DIDy"),
        ("", "outer_split(0, 2) -> DIDy; outer_split(2, 2) -> DIDx"),
        ("outer_split(0, 2) -> DIDy; outer_split(2, 2) -> DIDx", ""),
    ] {
        assert_runs(&both(from, to), 4, 2);
    }
    // The swap on meshes with one device along an axis: that type's split is a one-member
    // copy around the AllToAll of the other.
    let swap = both(
        "outer_split(0, dx) -> DIDx; outer_split(2, dy) -> DIDy",
        "outer_split(0, dy) -> DIDy; outer_split(2, dx) -> DIDx",
    );
    for (dy, dx) in [(1, 2), (2, 1), (1, 3)] {
        let source = swap
            .replace(
                "both(a = 2, b = 3)",
                &format!("both(a = 2, b = 3, dy = {dy}, dx = {dx})"),
            )
            .replace("devices(2, 2)", "devices(dy, dx)")
            .replace("4 * a", "dy * dx * a")
            .replace("4 * b", "dy * dx * b");
        assert_runs(&source, dy * dx, 2);
    }
    for (dy, dx) in [(1, 2), (2, 1), (2, 2), (1, 3)] {
        let source = format!(
            "fusion a2a2d(r = 6, a = 2, b = 3, dy = {dy}, dx = {dx}) {{
  mesh m = devices(dy, dx)
  tensor x: f32[r, dx * a, dx * b] on m
  y = set(x)
  output y
  schedule x {{ outer_split(0, dy) -> DIDy; outer_split(3, dx) -> DIDx }}
  schedule y {{ mesh = m; outer_split(0, dy) -> DIDy; outer_split(2, dx) -> DIDx }}
}}
"
        );
        assert_runs(&source, (dy * dx) as usize, 2);
    }
}

/// A copy to a DID-split tensor on a mesh that shares no device with the sender mesh: the
/// first sender sends each receiver its piece, one SendRecv pair per receiver (no Scatter),
/// after an Allgather on the senders when the input is split there; also when the meshes
/// differ in size, in stream chunks, and from a DIDx split of a 2-D mesh.
#[test]
fn scatters_to_a_disjoint_mesh_send_each_receiver_its_piece_from_the_first_sender() {
    use streamweave::host_ir::{CommunicationType, Stmt};
    let program = |a: &str, b: &str, rows: usize, x: &str, z: &str| {
        format!(
            "fusion stages(s = 2) {{
  mesh ma = {a}
  mesh mb = {b}
  tensor x: f32[{rows}, 2] on ma
  y = relu(x)
  z = set(y)
  out = neg(z)
  output out
  schedule x {{ {x} }}
  schedule z {{ mesh = mb; {z} }}
}}
"
        )
    };
    let split = |d: usize| format!("outer_split(0, {d}) -> DIDx");
    let streamed = |d: usize| format!("outer_split(1, s) -> Stream; outer_split(0, {d}) -> DIDx");
    // (sender mesh, receiver mesh, rows, x's schedule, z's schedule, ranks, allgather first)
    let cases = [
        ("[0, 1]", "[2]", 2, String::new(), split(1), 3, false),
        ("[0]", "[1, 2]", 6, String::new(), split(2), 3, false),
        ("[0]", "[1, 2]", 4, split(1), split(2), 3, true),
        ("[0, 1]", "[2]", 6, String::new(), streamed(1), 3, false),
        ("[0]", "[1, 2]", 2, split(1), streamed(2), 3, true),
        (
            "[0, 1]",
            "[2, 3, 4]",
            6,
            String::new(),
            streamed(3),
            5,
            false,
        ),
        ("[0, 1]", "[2, 3, 4]", 6, split(2), split(3), 5, true),
        ("devices(2, 2)", "[4, 5]", 4, split(2), split(2), 6, true),
    ];
    for (a, b, rows, x, z, ranks, gathers) in cases {
        let source = program(a, b, rows, &x, &z);
        assert_runs(&source, ranks, 2);
        let fusion = streamweave::load("scatter.weave", &source, &[]).unwrap();
        let compiled = Compiler::new().compile(&fusion).unwrap();
        let p = compiled.program();
        let mut comms = Vec::new();
        for w in p.walk() {
            if let Stmt::Communication(c) = &p.stmts[w.stmt] {
                comms.push((c.kind, c.teams.clone()));
            }
        }
        let receivers = ranks - b.matches(',').count() - 1..ranks;
        let pairs: Vec<_> = receivers
            .map(|r| (CommunicationType::SendRecv, vec![vec![0, r as i64]]))
            .collect();
        let sends: Vec<_> = comms
            .iter()
            .filter(|(k, _)| *k != CommunicationType::Allgather)
            .cloned()
            .collect();
        assert!(
            sends.len() % pairs.len() == 0
                && sends.chunks(pairs.len()).all(|c| c == pairs.as_slice()),
            "{source}: {comms:?}"
        );
        let allgathers = comms.len() - sends.len();
        assert_eq!(allgathers > 0, gathers, "{source}: {comms:?}");
    }
}

/// Exprs on a 2-D mesh that change several shardings at once, one of them the layout of the
/// DIDy split (`[dy, ..]` against the output's `[s, dy, ..]`, rows DIDy inside stream chunks):
/// a reduction over a DIDx axis (an Allreduce keeping the input's row layout, then the layout
/// change as a gather and a scatter per chunk), a row-parallel `linear`, and a pointwise op on
/// a column-parallel `linear` whose output keeps DIDx (the layout change gathers only DIDy).
#[test]
fn layout_changes_next_to_other_changes_on_two_dimensional_meshes_match_the_reference() {
    let reduce = |op: &str, dy: usize, dx: usize, s: usize, a: usize, b: usize| {
        format!(
            "fusion mesh2d(dy = {dy}, dx = {dx}, s = {s}) {{
  mesh m = devices(dy, dx)
  tensor inp: f32[{a} * dy * s, {b} * dx] on m
  out = {op}
  output out
  schedule inp {{ outer_split(0, dy) -> DIDy; outer_split(2, dx) -> DIDx }}
  schedule out {{ mesh = m; outer_split(0, s) -> Stream; outer_split(1, dy) -> DIDy }}
}}
"
        )
    };
    for (op, dy, dx, s, a, b) in [
        ("sum(inp, [1])", 2, 2, 4, 2, 3),
        ("sum(inp, [1])", 1, 1, 3, 2, 1),
        ("sum(inp, [1])", 1, 2, 4, 1, 3),
        ("sum(inp, [1])", 2, 2, 1, 1, 3),
        ("sum(inp, [1])", 2, 1, 2, 3, 1),
        ("max(inp, [1])", 2, 2, 4, 2, 3),
        ("relu(inp)", 2, 2, 2, 2, 3),
    ] {
        assert_runs(&reduce(op, dy, dx, s, a, b), dy * dx, 2);
    }
    let linear = |dy: usize, dx: usize, bias: bool| {
        let (b, decl) = if bias {
            (", b", "\n  tensor b: f32[5] on m")
        } else {
            ("", "")
        };
        format!(
            "fusion row(dy = {dy}, dx = {dx}, s = 2) {{
  mesh m = devices(dy, dx)
  tensor inp: f32[2 * dy * s, 3 * dx] on m
  tensor w: f32[5, 3 * dx] on m{decl}
  out = linear(inp, w{b})
  output out
  schedule inp {{ outer_split(0, dy) -> DIDy; outer_split(2, dx) -> DIDx }}
  schedule w {{ outer_split(1, dx) -> DIDx }}
  schedule out {{ mesh = m; outer_split(0, s) -> Stream; outer_split(1, dy) -> DIDy }}
}}
"
        )
    };
    for (dy, dx, bias) in [(2, 2, false), (2, 2, true), (2, 1, false), (1, 2, true)] {
        assert_runs(&linear(dy, dx, bias), dy * dx, 2);
    }
    for (dy, dx) in [(2, 1), (2, 2), (1, 2)] {
        let source = format!(
            "fusion column(dy = {dy}, dx = {dx}, s = 3) {{
  mesh m = devices(dy, dx)
  tensor inp: f32[2 * dy * s, 3] on m
  tensor w: f32[2 * dx, 3] on m
  y = linear(inp, w)
  out = relu(y)
  output out
  schedule w {{ outer_split(0, dx) -> DIDx }}
  schedule inp {{ outer_split(0, dy) -> DIDy }}
  schedule out {{ mesh = m; outer_split(0, s) -> Stream; outer_split(1, dy) -> DIDy; outer_split(3, dx) -> DIDx }}
}}
"
        );
        assert_runs(&source, dy * dx, 2);
    }
}

/// A replicated tensor copied to a one-device mesh is a Broadcast whose team is that one
/// device: the member copies locally, and the ranks outside the team post nothing.
#[test]
fn copy_of_a_replicated_tensor_to_a_one_device_mesh_runs_on_the_member_only() {
    assert_runs(
        "fusion to_root(d = 2) {
  mesh m = devices(d)
  mesh root = [0]
  tensor a: f32[2, 3] on m
  out = set(a)
  output out
  schedule out { mesh = root }
}
",
        2,
        2,
    );
}

// ---------------------------------------------------------------------------------------
// Family 7: uneven and over-long stream splits, Serial splits
// ---------------------------------------------------------------------------------------

/// What a ragged program computes; its rows are cut into `s` ceilDiv chunks whatever their
/// number (a short last chunk, or empty ones when `s` exceeds the rows).
#[derive(Clone, Copy, Debug)]
enum RaggedKind {
    /// `out = relu(add(a, b))`; the columns DID-split when `did`.
    Pointwise { did: bool },
    /// `out = sum(a, [1])`: with `did`, the reduced columns are DID-split (an Allreduce per
    /// chunk).
    RowSum { did: bool },
    /// `out = linear(inp, w)` with replicated weights.
    Linear,
    /// `out = linear(inp, w)` with the contraction axis DID-split: an Allreduce per chunk.
    RowParallel,
    /// `out = linear(inp, w)` with the output features DID-split.
    ColumnParallel,
}

#[derive(Clone, Debug)]
struct Ragged {
    d: usize,
    s: usize,
    streams: usize,
    /// The stream-split axis: any length, not a multiple of `s`.
    rows: usize,
    /// Per-device column factor.
    cols: usize,
    kind: RaggedKind,
    /// `Some(k)`: the output's columns (or, for a row sum, its rows) also get
    /// `outer_split(.., k) -> Serial`, any `k`, larger than the axis too.
    serial: Option<usize>,
    /// Whether the stream split goes on the output (else on the first input).
    on_output: bool,
}

fn ragged() -> impl Strategy<Value = Ragged> {
    (
        (1usize..=4, 1usize..=6, 1usize..=3),
        (1usize..=9, 1usize..=3),
        prop_oneof![
            any::<bool>().prop_map(|did| RaggedKind::Pointwise { did }),
            any::<bool>().prop_map(|did| RaggedKind::RowSum { did }),
            Just(RaggedKind::Linear),
            Just(RaggedKind::RowParallel),
            Just(RaggedKind::ColumnParallel),
        ],
        prop_oneof![2 => Just(None), 1 => (1usize..=7).prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(
            |((d, s, streams), (rows, cols), kind, serial, on_output)| Ragged {
                d,
                s,
                streams,
                rows,
                cols,
                kind,
                serial,
                on_output,
            },
        )
}

impl Ragged {
    fn case(&self) -> Case {
        let Ragged { d, s, rows, .. } = *self;
        let k = self.serial.unwrap_or(1);
        let mut src = format!("fusion ragged(d = {d}, s = {s}, k = {k}) {{\n");
        src.push_str("  mesh m = devices(d)\n");
        let cols = extent(
            self.cols,
            !matches!(
                self.kind,
                RaggedKind::Pointwise { did: false } | RaggedKind::RowSum { did: false }
            ) && !matches!(self.kind, RaggedKind::Linear),
            false,
            0,
        );
        let stream: Vec<Split> = vec![(0, "s", "Stream")];
        // (input splits, output loop rank, output splits without the stream split)
        let mut inputs: Vec<(&str, Vec<Split>)> = Vec::new();
        let out_rank;
        let mut out_splits: Vec<Split> = Vec::new();
        let serial_axis;
        match self.kind {
            RaggedKind::Pointwise { did } => {
                writeln!(src, "  tensor a: f32[{rows}, {cols}] on m").unwrap();
                writeln!(src, "  tensor b: f32[{rows}, {cols}] on m").unwrap();
                src.push_str("  t0 = add(a, b)\n  out = relu(t0)\n");
                let split: Vec<Split> = if did { vec![(1, "d", "DIDx")] } else { vec![] };
                inputs.push(("a", split.clone()));
                inputs.push(("b", split.clone()));
                out_rank = 2;
                out_splits = split;
                serial_axis = 1;
            }
            RaggedKind::RowSum { did } => {
                writeln!(src, "  tensor a: f32[{rows}, {cols}] on m").unwrap();
                src.push_str("  out = sum(a, [1])\n");
                let split: Vec<Split> = if did { vec![(1, "d", "DIDx")] } else { vec![] };
                inputs.push(("a", split));
                out_rank = 2;
                serial_axis = 0;
            }
            RaggedKind::Linear | RaggedKind::RowParallel | RaggedKind::ColumnParallel => {
                let n = if matches!(self.kind, RaggedKind::ColumnParallel) {
                    extent(2, true, false, 0)
                } else {
                    "2".to_string()
                };
                let kk = if matches!(self.kind, RaggedKind::ColumnParallel) {
                    self.cols.to_string()
                } else {
                    cols.clone()
                };
                writeln!(src, "  tensor inp: f32[{rows}, {kk}] on m").unwrap();
                writeln!(src, "  tensor w: f32[{n}, {kk}] on m").unwrap();
                src.push_str("  out = linear(inp, w)\n");
                match self.kind {
                    RaggedKind::RowParallel => {
                        inputs.push(("inp", vec![(1, "d", "DIDx")]));
                        inputs.push(("w", vec![(1, "d", "DIDx")]));
                    }
                    RaggedKind::ColumnParallel => {
                        inputs.push(("inp", vec![]));
                        inputs.push(("w", vec![(0, "d", "DIDx")]));
                        out_splits.push((1, "d", "DIDx"));
                    }
                    _ => {
                        inputs.push(("inp", vec![]));
                        inputs.push(("w", vec![]));
                    }
                }
                out_rank = 3;
                serial_axis = 1;
            }
        }
        src.push_str("  output out\n");
        for (i, (name, splits)) in inputs.iter().enumerate() {
            let mut all = Vec::new();
            if i == 0 && !self.on_output {
                all.extend(stream.iter().copied());
            }
            all.extend(splits.iter().copied());
            schedule(&mut src, name, &split_steps(2, &all));
        }
        let mut out = Vec::new();
        if self.on_output {
            out.extend(stream.iter().copied());
        }
        out.extend(out_splits.iter().copied());
        if self.serial.is_some() {
            out.push((serial_axis, "k", "Serial"));
        }
        if !out.is_empty() {
            schedule_on(&mut src, "out", "m", &split_steps(out_rank, &out));
        }
        Case::closed("ragged", src, d, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 8: 2-D meshes (data × tensor parallel)
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum GridKind {
    /// Tokens DIDy, contraction DIDx: a partial product per rank, an Allreduce among the
    /// ranks of one row of the mesh.
    RowParallel,
    /// Tokens DIDy, output features DIDx (no communication); with `gather`, the output is
    /// then gathered along the features within each mesh row.
    ColumnParallel { gather: bool },
    /// `sum` over a DIDx axis of a tensor whose other axis is DIDy.
    SumOverX,
    /// A pointwise op whose output keeps only the DIDx split (gathered along DIDy).
    GatherY,
}

#[derive(Clone, Debug)]
struct Grid {
    dy: usize,
    dx: usize,
    s: usize,
    streams: usize,
    kind: GridKind,
    /// Per-device factors of the two axes.
    a: usize,
    b: usize,
    /// A stream split of the (DIDy) rows on the output, by `s`.
    stream: bool,
}

fn grid() -> impl Strategy<Value = Grid> {
    (
        prop_oneof![
            Just((1usize, 2usize)),
            Just((2, 1)),
            Just((2, 2)),
            Just((3, 1)),
            Just((1, 3)),
            Just((1, 1)),
        ],
        (1usize..=4, 1usize..=3),
        prop_oneof![
            Just(GridKind::RowParallel),
            any::<bool>().prop_map(|gather| GridKind::ColumnParallel { gather }),
            Just(GridKind::SumOverX),
            Just(GridKind::GatherY),
        ],
        (1usize..=3, 1usize..=3),
        any::<bool>(),
    )
        .prop_map(|((dy, dx), (s, streams), kind, (a, b), stream)| Grid {
            dy,
            dx,
            s,
            streams,
            kind,
            a,
            b,
            stream,
        })
}

impl Grid {
    fn case(&self) -> Case {
        let Grid { dy, dx, a, b, .. } = *self;
        // A DID → Stream copy (the gather along DIDy into stream chunks) needs factors that
        // nest; any `s` that is a multiple of `dy` does (the other factors are refused at load,
        // tests/stream_did.rs).
        let s = if matches!(self.kind, GridKind::GatherY) && self.stream {
            dy * self.s.div_ceil(2)
        } else {
            self.s
        };
        let mut src = format!("fusion mesh2d(dy = {dy}, dx = {dx}, s = {s}) {{\n");
        src.push_str("  mesh m = devices(dy, dx)\n");
        // The rows are split by DIDy (per device `a` rows; times `s` when streamed, so that
        // each chunk splits evenly across the mesh rows).
        let rows = if self.stream {
            format!("{a} * dy * s")
        } else {
            format!("{a} * dy")
        };
        let xcols = format!("{b} * dx");
        let rows_split = |stream: bool| -> Vec<Split> {
            if stream {
                vec![(0, "s", "Stream"), (0, "dy", "DIDy")]
            } else {
                vec![(0, "dy", "DIDy")]
            }
        };
        match self.kind {
            GridKind::RowParallel | GridKind::ColumnParallel { .. } => {
                let row = matches!(self.kind, GridKind::RowParallel);
                let (k, n) = if row {
                    (xcols.clone(), "2".to_string())
                } else {
                    ("3".to_string(), xcols.clone())
                };
                writeln!(src, "  tensor inp: f32[{rows}, {k}] on m").unwrap();
                writeln!(src, "  tensor w: f32[{n}, {k}] on m").unwrap();
                src.push_str("  y = linear(inp, w)\n");
                let gather = matches!(self.kind, GridKind::ColumnParallel { gather: true });
                if gather {
                    src.push_str("  out = set(y)\n");
                } else {
                    src.push_str("  out = relu(y)\n");
                }
                src.push_str("  output out\n");
                let mut inp = rows_split(false);
                if row {
                    inp.push((1, "dx", "DIDx"));
                    schedule(&mut src, "w", &split_steps(2, &[(1, "dx", "DIDx")]));
                } else {
                    schedule(&mut src, "w", &split_steps(2, &[(0, "dx", "DIDx")]));
                }
                schedule(&mut src, "inp", &split_steps(2, &inp));
                let mut out = vec!["mesh = m".to_string()];
                let mut splits = rows_split(self.stream);
                if !row && !gather {
                    splits.push((1, "dx", "DIDx"));
                }
                out.extend(split_steps(2, &splits));
                schedule(&mut src, "out", &out);
            }
            GridKind::SumOverX => {
                writeln!(src, "  tensor inp: f32[{rows}, {xcols}] on m").unwrap();
                src.push_str("  out = sum(inp, [1])\n  output out\n");
                let mut inp = rows_split(false);
                inp.push((1, "dx", "DIDx"));
                schedule(&mut src, "inp", &split_steps(2, &inp));
                let mut out = vec!["mesh = m".to_string()];
                out.extend(split_steps(2, &rows_split(self.stream)));
                schedule(&mut src, "out", &out);
            }
            GridKind::GatherY => {
                writeln!(src, "  tensor inp: f32[{rows}, {xcols}] on m").unwrap();
                src.push_str("  out = neg(inp)\n  output out\n");
                let mut inp = rows_split(false);
                inp.push((1, "dx", "DIDx"));
                schedule(&mut src, "inp", &split_steps(2, &inp));
                let mut out = vec!["mesh = m".to_string()];
                let mut splits = if self.stream {
                    vec![(0, "s", "Stream")]
                } else {
                    vec![]
                };
                splits.push((1, "dx", "DIDx"));
                out.extend(split_steps(2, &splits));
                schedule(&mut src, "out", &out);
            }
        }
        Case::closed("grid", src, dy * dx, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 9: several meshes in one fusion
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct MultiMesh {
    /// Sizes of the two meshes.
    na: usize,
    nb: usize,
    /// Whether the second mesh is the first one reversed (else the next ranks).
    reversed: bool,
    /// DIDx splits of the rows on the first and the second mesh.
    did_a: bool,
    did_b: bool,
    rows: usize,
    cols: usize,
    /// A stream split of the rows of the second stage's output.
    stream: bool,
    s: usize,
    streams: usize,
}

fn multi_mesh() -> impl Strategy<Value = MultiMesh> {
    (
        (1usize..=2, 1usize..=2, any::<bool>()),
        (any::<bool>(), any::<bool>()),
        (1usize..=3, 1usize..=3),
        (any::<bool>(), 1usize..=3, 1usize..=3),
    )
        .prop_map(
            |((na, nb, reversed), (did_a, did_b), (rows, cols), (stream, s, streams))| MultiMesh {
                na,
                nb,
                reversed,
                did_a,
                did_b,
                rows,
                cols,
                stream,
                s,
                streams,
            },
        )
}

impl MultiMesh {
    fn case(&self) -> Case {
        let nb = if self.reversed { self.na } else { self.nb };
        let a: Vec<usize> = (0..self.na).collect();
        let b: Vec<usize> = if self.reversed {
            a.iter().rev().copied().collect()
        } else {
            (self.na..self.na + nb).collect()
        };
        let list = |v: &[usize]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (da, db) = (self.na, nb);
        // Rows divisible by both mesh sizes.
        let rows = self.rows * da * db;
        let mut src = format!("fusion stages(da = {da}, db = {db}, s = {}) {{\n", self.s);
        writeln!(src, "  mesh ma = [{}]", list(&a)).unwrap();
        writeln!(src, "  mesh mb = [{}]", list(&b)).unwrap();
        writeln!(src, "  tensor x: f32[{rows}, {}] on ma", self.cols).unwrap();
        src.push_str("  y = relu(x)\n  z = set(y)\n  out = neg(z)\n  output out\n");
        if self.did_a {
            schedule(&mut src, "x", &split_steps(2, &[(0, "da", "DIDx")]));
        }
        let mut steps = vec!["mesh = mb".to_string()];
        let mut splits = Vec::new();
        if self.stream {
            splits.push((1, "s", "Stream"));
        }
        if self.did_b {
            splits.push((0, "db", "DIDx"));
        }
        steps.extend(split_steps(2, &splits));
        schedule(&mut src, "z", &steps);
        Case::closed(
            "multi-mesh",
            src,
            if self.reversed { da } else { da + db },
            self.streams,
        )
    }
}

// ---------------------------------------------------------------------------------------
// Family 10: backward (transposed) matmuls
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum BwdPar {
    None,
    /// The forward was row-parallel (`x`, `w` split on K): both gradients stay split on K.
    Row,
    /// The forward was column-parallel (`w`, `grad_out` split on N): `grad_x` sums over
    /// devices (an Allreduce), `grad_w` stays split on N.
    Column,
}

/// Where the backward is stream-split on the tokens.
#[derive(Clone, Copy, Debug)]
enum BwdStream {
    None,
    /// On `grad_x` (the user's schedule).
    GradX,
    /// On the input `grad_out` (reaches `grad_x` by propagation, and must not reach the
    /// token reduction of `grad_w`).
    GradOut,
}

#[derive(Clone, Debug)]
struct Backward {
    d: usize,
    s: usize,
    streams: usize,
    par: BwdPar,
    stream: BwdStream,
    /// Factors of T, N, K.
    sizes: [usize; 3],
}

fn backward() -> impl Strategy<Value = Backward> {
    (
        (1usize..=4, 1usize..=4, 1usize..=3),
        prop_oneof![Just(BwdPar::None), Just(BwdPar::Row), Just(BwdPar::Column)],
        prop_oneof![
            Just(BwdStream::None),
            Just(BwdStream::GradX),
            Just(BwdStream::GradOut)
        ],
        [1usize..=5, 1usize..=3, 1usize..=3],
    )
        .prop_map(|((d, s, streams), par, stream, sizes)| Backward {
            d,
            s,
            streams,
            par,
            stream,
            sizes,
        })
}

impl Backward {
    fn case(&self) -> Case {
        let Backward { d, s, .. } = *self;
        let [t, n, k] = self.sizes;
        let n = extent(n, matches!(self.par, BwdPar::Column), false, 0);
        let k = extent(k, matches!(self.par, BwdPar::Row), false, 0);
        let mut src = header("backward", d, s);
        src.push_str("  mesh m = devices(d)\n");
        writeln!(src, "  tensor grad_out: f32[{t}, {n}] on m").unwrap();
        writeln!(src, "  tensor w: f32[{n}, {k}] on m").unwrap();
        writeln!(src, "  tensor x: f32[{t}, {k}] on m").unwrap();
        src.push_str(
            "  grad_x = matmul(grad_out, w)\n  go_t = permute(grad_out, [1, 0])\n  \
             grad_w = matmul(go_t, x)\n  output grad_x, grad_w\n",
        );
        let mut go = Vec::new();
        if matches!(self.stream, BwdStream::GradOut) {
            go.push((0, "s", "Stream"));
        }
        match self.par {
            BwdPar::None => {}
            BwdPar::Row => {
                schedule(&mut src, "w", &split_steps(2, &[(1, "d", "DIDx")]));
                schedule(&mut src, "x", &split_steps(2, &[(1, "d", "DIDx")]));
            }
            BwdPar::Column => {
                schedule(&mut src, "w", &split_steps(2, &[(0, "d", "DIDx")]));
                go.push((1, "d", "DIDx"));
            }
        }
        schedule(&mut src, "grad_out", &split_steps(2, &go));
        if matches!(self.stream, BwdStream::GradX) {
            // Loop domain of grad_x: [T, K, r(N)].
            let mut splits = vec![(0, "s", "Stream")];
            if matches!(self.par, BwdPar::Row) {
                splits.push((1, "d", "DIDx"));
            }
            schedule_on(&mut src, "grad_x", "m", &split_steps(3, &splits));
        }
        Case::closed("backward", src, d, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// Family 11: sequence parallelism in loop-split form (DID inside Stream chunks)
// ---------------------------------------------------------------------------------------

/// A sequence-parallel MLP as users write it: the tokens of `x` are cut into `s` stream
/// chunks and each chunk across the devices; every chunk is gathered, goes through a
/// column-parallel and a row-parallel linear, and is reduce-scattered back onto the tokens.
#[derive(Clone, Debug)]
struct SeqPar {
    d: usize,
    s: usize,
    streams: usize,
    /// Tokens per device and chunk, model and hidden factors.
    sizes: [usize; 3],
    act: Option<Un>,
    /// Where it stops: 0 = the gather alone, 1 = gather + column-parallel linear, 2 = the
    /// whole MLP reduce-scattered, 3 = the whole MLP allreduced (replicated output).
    depth: usize,
}

fn seq_par() -> impl Strategy<Value = SeqPar> {
    (
        (1usize..=4, 1usize..=4, 1usize..=3),
        [1usize..=2, 1usize..=3, 1usize..=2],
        prop_oneof![Just(None), un().prop_map(Some)],
        0usize..4,
    )
        .prop_map(|((d, s, streams), sizes, act, depth)| SeqPar {
            d,
            s,
            streams,
            sizes,
            act,
            depth,
        })
}

impl SeqPar {
    fn case(&self) -> Case {
        let SeqPar { d, s, depth, .. } = *self;
        let [tf, hf, ff] = self.sizes;
        let mut src = header("seq_par", d, s);
        src.push_str("  mesh m = devices(d)\n");
        writeln!(src, "  tensor x: f32[{tf} * s * d, {hf}] on m").unwrap();
        writeln!(src, "  tensor w1: f32[{ff} * d, {hf}] on m").unwrap();
        writeln!(src, "  tensor w2: f32[{hf}, {ff} * d] on m").unwrap();
        src.push_str("  ag = set(x)\n");
        let mut last = "ag";
        if depth >= 1 {
            src.push_str("  h1 = linear(ag, w1)\n");
            last = "h1";
        }
        if depth >= 2 {
            if let Some(u) = self.act {
                writeln!(src, "  a1 = {}(h1)", u.name()).unwrap();
                last = "a1";
            }
            writeln!(src, "  y = linear({last}, w2)").unwrap();
            last = "y";
        }
        writeln!(src, "  output {last}").unwrap();
        let chunked = [(0, "s", "Stream"), (0, "d", "DIDx")];
        schedule(&mut src, "x", &split_steps(2, &chunked));
        schedule(&mut src, "w1", &split_steps(2, &[(0, "d", "DIDx")]));
        schedule(&mut src, "w2", &split_steps(2, &[(1, "d", "DIDx")]));
        let mut ag = vec!["mesh = m".to_string()];
        ag.extend(split_steps(2, &[(0, "s", "Stream")]));
        schedule(&mut src, "ag", &ag);
        if depth >= 2 {
            // Loop domain of y: [t, h, r(f)].
            let mut steps = vec!["mesh = m".to_string()];
            let splits: Vec<Split> = if depth == 2 {
                vec![(2, "d", "DIDx"), (0, "s", "Stream"), (0, "d", "DIDx")]
            } else {
                vec![(0, "s", "Stream")]
            };
            steps.extend(split_steps(3, &splits));
            schedule(&mut src, "y", &steps);
        }
        Case::closed("seq-par", src, d, self.streams)
    }
}

// ---------------------------------------------------------------------------------------
// One random test per family
// ---------------------------------------------------------------------------------------

/// A property test per family (each with its own case budget, so that a failure names its
/// family), and the list of the families they cover.
macro_rules! family_tests {
    ($($test:ident: $name:literal,)*) => {
        const TESTED_FAMILIES: &[&str] = &[$($name),*];

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 64,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]
            $(
                #[doc = concat!("Every generated `", $name, "` program matches the reference.")]
                #[test]
                fn $test(case in family($name)) {
                    if let Err(e) = check(&case) {
                        prop_assert!(false, "{}", e);
                    }
                }
            )*
        }
    };
}

family_tests! {
    pointwise_programs_match_the_reference: "pointwise",
    reduction_programs_match_the_reference: "reduction",
    matmul_programs_match_the_reference: "matmul",
    collective_programs_match_the_reference: "collective",
    batched_matmul_programs_match_the_reference: "batched-matmul",
    mesh2d_collectives_match_the_reference: "mesh2d",
    ragged_programs_match_the_reference: "ragged",
    grid_programs_match_the_reference: "grid",
    multi_mesh_programs_match_the_reference: "multi-mesh",
    backward_programs_match_the_reference: "backward",
    seq_par_programs_match_the_reference: "seq-par",
    layer_programs_match_the_reference: "layer",
}

#[test]
fn every_family_has_its_own_test() {
    let names: Vec<&str> = FAMILIES.iter().map(|f| f.0).collect();
    assert_eq!(names, TESTED_FAMILIES);
}
