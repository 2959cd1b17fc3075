//! The ring form of a fusion: its device-reduced GEMMs and its allgathers rewritten with one
//! stream chunk per device, as `matmul_rs_ring.weave` and `sequence_parallel_mlp_ring.weave`
//! write them by hand, so that lowering posts them as P2P rings (and
//! `lower-to-host{ring-pieces=K}` sums the reduce rings in their GEMMs).
//!
//! Contract.
//!
//! * Input: a loaded fusion (schedules applied), at the chunk count that runs its Stream axes
//!   as one chunk where it has a chunk-count parameter. Its Stream axes are run serially here
//!   (`Fusion::serialize_streams`): the ring form starts from the fusion's one-chunk form,
//!   whose device blocks are contiguous.
//! * Output: the canonical text of the rewritten fusion ([`RingForm::source`]) and what was
//!   rewritten ([`RingForm::rings`]); the same values for the same inputs, each rank's blocks of
//!   the inputs and outputs laid out as in the one-chunk form. Tensor names of the fusion are
//!   kept; new tensors are named `<out>_ring`, `<out>_ring_reduced`, `<out>_ring_gathered`
//!   and `<out>_ring_bias` (made unique).
//! * Not a pass: it reads the shardings that `propagate-shardings` and `decompose-reshardings`
//!   give a copy of the fusion and rewrites the fusion as written, which the caller loads again.
//!
//! Two rewrites, found from the communications of the decomposed copy:
//!
//! 1. **Reduce rings.** `out = linear(a, w)` (or `matmul`) whose contraction is split over the
//!    `d` devices of a 1-D mesh, reduced by a ReduceScatter on a row axis `A` of `out`, becomes
//!    `out_ring = linear(a, w)` with `schedule out_ring { mesh = m; outer_split(R, d) -> DIDx;
//!    outer_split(A, d) -> Stream }` (`R` the contraction axis) and `out = set(out_ring)` with
//!    `schedule out { mesh = m; outer_split(A, d) -> DIDx }`. Reduced by an Allreduce, `A` is
//!    axis 0 and the ring's output is gathered after it: `out_ring_reduced = set(out_ring)`
//!    split like that, and `out = set(out_ring_reduced)` replicated. A `linear` with a bias
//!    (which `decompose-reshardings` adds after the reduction) sums without it in the ring,
//!    and the bias, broadcast, is added after: to the blocks of a reduce-scatter, to the
//!    gathered tensor of an allreduce (`out_ring_gathered`), so that the gather still reads
//!    the ring's output alone and goes out in its last step.
//! 2. **Allgather rings.** `ag = set(x)` gathering `x`'s device blocks of axis `A` into a
//!    replicated tensor becomes stream-split on `A` in `d` chunks (chunk `i` is device `i`'s
//!    block): `schedule ag { mesh = m; outer_split(A, d) -> Stream }`.
//!
//! A fusion with neither is refused with a message saying so; sites that do not fit (a mesh of
//! more than one axis, the GEMM's column axis scattered, an extent that `d` does not divide)
//! are left as they are and named in the refusal when nothing else is found.

use std::fmt;

use weave_host_ir::CommunicationType;
use weave_ir::{Diagnostic, ExprKind, Fusion, IterType, ParallelType, TensorId};

use crate::communication::derive_communication;
use crate::decompose_reshardings::decompose_reshardings;
use crate::propagate_shardings::propagate_shardings;
use crate::resharding::is_resharding;

/// A fusion rewritten into rings ([`ring_form`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingForm {
    /// The rewritten fusion's canonical `.weave` text.
    pub source: String,
    /// What was rewritten, in program order.
    pub rings: Vec<Ring>,
}

/// One rewritten communication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    /// The tensor the communication produced (a name of the fusion).
    pub tensor: String,
    /// The collective it was.
    pub kind: RingKind,
    /// The axis of the tensor the ring's chunks cut (each device's block).
    pub axis: usize,
    /// The ring's devices.
    pub devices: usize,
    /// The extent of that axis (a multiple of `devices`).
    pub extent: i64,
}

/// Which collective a [`Ring`] replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingKind {
    /// A ReduceScatter: a reduce ring.
    ReduceScatter,
    /// An Allreduce: a reduce ring whose blocks are then gathered.
    Allreduce,
    /// An Allgather: a ring of blocks.
    Allgather,
}

impl fmt::Display for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            RingKind::ReduceScatter => "reduce-scatter as a reduce ring",
            RingKind::Allreduce => "allreduce as a reduce ring and its gather",
            RingKind::Allgather => "allgather as a ring",
        };
        write!(
            f,
            "`{}`: {what} on axis {} ({} devices)",
            self.tensor, self.axis, self.devices
        )
    }
}

impl fmt::Display for RingForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rings: Vec<String> = self.rings.iter().map(Ring::to_string).collect();
        f.write_str(&rings.join("; "))
    }
}

/// One site found, with what the text edit needs.
struct Site {
    ring: Ring,
    /// The mesh's name.
    mesh: String,
    /// Of a reduce ring: the contraction axis's position in the GEMM's logical domain.
    contraction: usize,
    /// Of an allgather ring: the gathered axis's extent is the device count (`parallelize`).
    whole_axis: bool,
    /// Of a reduce ring: the GEMM's call without its bias (`linear(a, w)`).
    call: String,
    /// Of a reduce ring: the linear's bias, added after the reduction.
    bias: Option<String>,
    /// The tensor's axes (without reductions).
    rank: usize,
}

/// Rewrites `fusion` into its ring form (see the module doc), or says why it has none.
pub fn ring_form(fusion: &Fusion) -> Result<RingForm, Diagnostic> {
    let mut serial = fusion.clone();
    serial.serialize_streams();
    let mut decomposed = serial.clone();
    propagate_shardings(&mut decomposed)?;
    decompose_reshardings(&mut decomposed)?;
    let mut sites = Vec::new();
    let mut unfit = Vec::new();
    for &e in decomposed.exprs() {
        if !is_resharding(&decomposed, e) {
            continue;
        }
        let Ok(info) = derive_communication(&decomposed, e) else {
            continue;
        };
        let expr = decomposed.expr(e);
        let (Some(&input), Some(&output)) = (expr.inputs.first(), expr.outputs.first()) else {
            continue;
        };
        let kind = match info.kind {
            CommunicationType::ReduceScatter => RingKind::ReduceScatter,
            CommunicationType::Allreduce => RingKind::Allreduce,
            CommunicationType::Allgather => RingKind::Allgather,
            _ => continue,
        };
        match site(&serial, &decomposed, (input, output), kind, &info) {
            Ok(Some(s)) => sites.push(s),
            Ok(None) => {}
            Err(why) => unfit.push(why),
        }
    }
    if sites.is_empty() {
        let why = if unfit.is_empty() {
            "it has no allgather, and no GEMM whose contraction is split over devices and \
             reduced by an allreduce or reduce-scatter"
                .to_string()
        } else {
            unfit.join("; ")
        };
        return Err(Diagnostic::new(format!(
            "`{}` has no ring form: {why}",
            fusion.name
        )));
    }
    let source = rewrite(&serial, &sites)?;
    Ok(RingForm {
        source,
        rings: sites.into_iter().map(|s| s.ring).collect(),
    })
}

/// The site of communication `input → output` of the decomposed copy in `serial` (the fusion
/// as written, run serially): `None` where it is not one the ring form rewrites (a tensor the
/// decomposition made), the reason where it is one that does not fit.
fn site(
    serial: &Fusion,
    decomposed: &Fusion,
    (input, output): (TensorId, TensorId),
    kind: RingKind,
    info: &crate::communication::CommunicationInfo,
) -> Result<Option<Site>, String> {
    let communicated = &decomposed.tensor(output).name;
    // `decompose-reshardings` splits a linear's bias off its device-reduced product
    // (`<out>_nobias`): the site is `out`, whose bias the ring form adds after the ring.
    let found = serial
        .tensor_by_name(communicated)
        .map(|t| (communicated, t));
    let Some((name, t)) = found.or_else(|| {
        communicated
            .strip_suffix("_nobias")
            .and_then(|out| serial.tensor_by_name(out))
            .map(|t| (&serial.tensor(t).name, t))
    }) else {
        return Ok(None);
    };
    let Some(def) = serial.tensor(t).definition else {
        return Ok(None);
    };
    let def = serial.expr(def);
    let written = match kind {
        RingKind::Allgather => {
            def.kind == ExprKind::Set
                && def.inputs.first().map(|&x| &serial.tensor(x).name)
                    == Some(&decomposed.tensor(input).name)
        }
        _ => matches!(def.kind, ExprKind::Linear | ExprKind::Matmul) && def.inputs.len() >= 2,
    };
    if !written {
        return Ok(None);
    }
    let Some(mesh_id) = decomposed.tensor(output).mesh else {
        return Ok(None);
    };
    let decl = decomposed.mesh(mesh_id);
    let devices = decl.mesh.size();
    if decl.mesh.shape().len() != 1 || info.parallel != Some(ParallelType::DIDx) {
        return Err(format!(
            "`{name}` is communicated over a mesh of {} axes or along DIDy (rings run over a \
             1-D mesh)",
            decl.mesh.shape().len()
        ));
    }
    if devices < 2 {
        return Err(format!("`{name}`'s mesh has one device"));
    }
    let axis = match kind {
        RingKind::Allreduce => Some(0),
        RingKind::ReduceScatter | RingKind::Allgather => {
            info.consumer_axis.as_ref().and_then(|a| a.axis)
        }
    };
    let Some(axis) = axis else {
        return Err(format!("`{name}`'s communicated axis is a reduction axis"));
    };
    // The axis among the tensor's logical axes without reductions (the materialized ones).
    let tv = serial.tensor(t);
    let axes: Vec<_> = tv
        .logical
        .iter()
        .filter(|id| serial.id(**id).iter_type != IterType::Reduction)
        .collect();
    let Some(&&id) = axes.get(axis) else {
        return Err(format!("`{name}` has no axis {axis}"));
    };
    let gemm = !matches!(kind, RingKind::Allgather);
    if gemm && axis + 1 >= axes.len() {
        return Err(format!(
            "`{name}`'s {} axis {axis} is its GEMM's columns (a ring's chunks are blocks of \
             rows)",
            if kind == RingKind::Allreduce {
                "first"
            } else {
                "scattered"
            }
        ));
    }
    let d = i64::try_from(devices).unwrap_or(i64::MAX);
    let extent = match serial.eval(&serial.id(id).extent) {
        Some(e) if e % d == 0 => e,
        e => {
            return Err(format!(
                "`{name}`'s axis {axis} ({}) does not fall into {devices} equal blocks",
                e.map_or("an unknown extent".to_string(), |e| e.to_string())
            ))
        }
    };
    let contraction = if gemm {
        match tv
            .logical
            .iter()
            .position(|id| serial.id(*id).iter_type == IterType::Reduction)
        {
            Some(r) => r,
            None => return Err(format!("`{name}` has no contraction axis")),
        }
    } else {
        0
    };
    let operand = |i: usize| def.inputs.get(i).map(|&x| serial.tensor(x).name.clone());
    let (call, bias) = match (gemm, operand(0), operand(1)) {
        (true, Some(a), Some(b)) => (format!("{}({a}, {b})", def.kind.op_name()), operand(2)),
        _ => (String::new(), None),
    };
    Ok(Some(Site {
        call,
        bias,
        rank: axes.len(),
        ring: Ring {
            tensor: name.clone(),
            kind,
            axis,
            devices,
            extent,
        },
        mesh: decl.name.clone(),
        contraction,
        whole_axis: extent == d,
    }))
}

/// `serial`'s canonical text with `sites` rewritten: a reduce ring's GEMM renamed into its
/// `_ring` tensor and followed by the sets that give the tensor back its name, an allgather
/// ring's schedule replaced; a new schedule line for each tensor whose schedule changes.
fn rewrite(serial: &Fusion, sites: &[Site]) -> Result<String, Diagnostic> {
    let text = weave_ir::text::print(serial);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut schedules = Vec::new();
    let mut taken: Vec<String> = Vec::new();
    let mut fresh = |base: String| {
        let mut name = base.clone();
        let mut n = 1;
        while serial.tensor_by_name(&name).is_some() || taken.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        taken.push(name.clone());
        name
    };
    for s in sites {
        let r = &s.ring;
        let (name, m, a, d) = (&r.tensor, &s.mesh, r.axis, r.devices);
        // Every schedule line of the tensor goes: the rewrite gives it a new one.
        lines.retain(|l| !l.starts_with(&format!("  schedule {name} {{")));
        if r.kind == RingKind::Allgather {
            let split = if s.whole_axis {
                format!("parallelize({a}, Stream)")
            } else {
                format!("outer_split({a}, {d}) -> Stream")
            };
            schedules.push(format!("  schedule {name} {{ mesh = {m}; {split} }}"));
            continue;
        }
        let head = format!("  {name} = ");
        let Some(at) = lines.iter().position(|l| l.starts_with(&head)) else {
            return Err(Diagnostic::new(format!(
                "the ring form did not find the definition of `{name}` in the fusion's text"
            )));
        };
        let ring = fresh(format!("{name}_ring"));
        let mut defs = vec![format!("  {ring} = {}", s.call)];
        schedules.push(format!(
            "  schedule {ring} {{ mesh = {m}; outer_split({}, {d}) -> DIDx; outer_split({a}, {d}) -> Stream }}",
            s.contraction
        ));
        // The ring's output, each device's block summed: the tensor itself unless it is then
        // gathered (an allreduce) or has its bias added.
        let gathered = r.kind == RingKind::Allreduce;
        let mut last = match gathered || s.bias.is_some() {
            true => fresh(format!("{name}_ring_reduced")),
            false => name.clone(),
        };
        defs.push(format!("  {last} = set({ring})"));
        schedules.push(format!(
            "  schedule {last} {{ mesh = {m}; outer_split({a}, {d}) -> DIDx }}"
        ));
        if gathered {
            let whole = match s.bias {
                Some(_) => fresh(format!("{name}_ring_gathered")),
                None => name.clone(),
            };
            defs.push(format!("  {whole} = set({last})"));
            schedules.push(format!("  schedule {whole} {{ mesh = {m} }}"));
            last = whole;
        }
        if let Some(bias) = &s.bias {
            let broadcast = fresh(format!("{name}_ring_bias"));
            let axes: Vec<String> = (0..s.rank.saturating_sub(1))
                .map(|i| i.to_string())
                .collect();
            defs.push(format!(
                "  {broadcast} = broadcast({bias}, [{}])",
                axes.join(", ")
            ));
            defs.push(format!("  {name} = add({last}, {broadcast})"));
            schedules.push(match gathered {
                true => format!("  schedule {name} {{ mesh = {m} }}"),
                false => {
                    format!("  schedule {name} {{ mesh = {m}; outer_split({a}, {d}) -> DIDx }}")
                }
            });
        }
        lines.splice(at..=at, defs);
    }
    // The schedules go before the closing brace.
    let close = lines.len().saturating_sub(1);
    lines.splice(close..close, schedules);
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out)
}
