//! Turning fusions into executables: [`Compiler`] (the pass pipeline, parameter values, the
//! device count) and [`Chunks`], how it picks the chunk count.

use std::time::Instant;

use weave_host_ir::HostProgram;
use weave_ir::{Fusion, ParamRole};
use weave_passes::{DumpOptions, PassManager, Pipeline, Registry};

use super::{Error, Executable};
use crate::chunks::Calibration;

/// How a [`Compiler`] picks the chunk count of the fusion's chunk-count parameter.
#[derive(Clone, Debug, Default)]
pub enum Chunks {
    /// The value the fusion gives it.
    #[default]
    AsWritten,
    /// This many. For a fusion without a chunk-count parameter: 1 runs its Stream axes
    /// serially, the chunks its loops run leave it as written, and a multiple `K·d` of those
    /// `d` chunks cuts a reduce ring's steps into `K` pieces summed in its GEMMs
    /// (`lower-to-host{ring-pieces=K}`); any other count is refused.
    Fixed(usize),
    /// The cost model's choice for this calibration (GEMM throughput, link bandwidths).
    Auto(Calibration),
    /// The fusion's ring form (`weave_passes::ring_form`): from its one-chunk form, each
    /// GEMM whose contraction is split over the devices and reduced by an allreduce or
    /// reduce-scatter becomes a reduce ring, and each allgather a ring, one stream chunk per
    /// device; with `pieces` ≥ 2 the reduce rings' steps are cut into that many pieces summed
    /// in their GEMMs (`lower-to-host{ring-pieces=K}`), with 1 they run as written. Refused,
    /// saying why, for a fusion with no such communication.
    Ring(usize),
}

/// The most pieces a step [`Chunks::parse`] takes for a ring form (`ring-pieces` takes as
/// many).
pub const MAX_RING_PIECES: usize = 64;

impl Chunks {
    /// A fixed choice written as text, as `weave run --chunks` and Python's
    /// `Fusion.compile(chunks=)` take it: a positive count ([`Chunks::Fixed`]), `ring` or
    /// `ring:K` with `K` from 1 to [`MAX_RING_PIECES`] ([`Chunks::Ring`]; `ring` is `ring:1`).
    /// The error says what was expected.
    pub fn parse(s: &str) -> Result<Chunks, ChunksParseError> {
        let chunks = match s.strip_prefix("ring") {
            Some("") => Some(Chunks::Ring(1)),
            Some(k) => k
                .strip_prefix(':')
                .and_then(|k| k.parse::<usize>().ok())
                .filter(|k| (1..=MAX_RING_PIECES).contains(k))
                .map(Chunks::Ring),
            None => s
                .parse::<usize>()
                .ok()
                .filter(|&n| n >= 1)
                .map(Chunks::Fixed),
        };
        chunks.ok_or_else(|| ChunksParseError {
            text: s.to_string(),
        })
    }
}

/// Text that [`Chunks::parse`] does not take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{text}` is neither a positive number, `ring` nor `ring:K` (K pieces a step, 1 to {MAX_RING_PIECES})"
)]
pub struct ChunksParseError {
    /// The text given.
    pub text: String,
}

/// Turns fusions into executables: the registry and pipeline of passes, parameter values,
/// the device count and the chunk count.
#[derive(Clone, Debug)]
pub struct Compiler {
    registry_pipeline: Option<Pipeline>,
    dump: DumpOptions,
    params: Vec<(String, i64)>,
    devices: Option<usize>,
    chunks: Chunks,
}

impl Default for Compiler {
    fn default() -> Compiler {
        Compiler::new()
    }
}

impl Compiler {
    /// The standard pipeline, the fusion's own parameter values.
    pub fn new() -> Compiler {
        Compiler {
            registry_pipeline: None,
            dump: DumpOptions::default(),
            params: Vec::new(),
            devices: None,
            chunks: Chunks::AsWritten,
        }
    }

    /// Sets parameter `name` (as `--set name=value` does); it wins over the roles.
    pub fn set(mut self, name: &str, value: i64) -> Compiler {
        self.params.retain(|(n, _)| n != name);
        self.params.push((name.to_string(), value));
        self
    }

    /// Sets the fusion's mesh-size parameter (declared `d: mesh`, or the one parameter that
    /// sizes a 1-D mesh) to `n`, unless [`Compiler::set`] gave it a value.
    pub fn devices(mut self, n: usize) -> Compiler {
        self.devices = Some(n);
        self
    }

    /// How the fusion's chunk-count parameter is chosen, unless [`Compiler::set`] gave it a
    /// value.
    pub fn chunks(mut self, chunks: Chunks) -> Compiler {
        self.chunks = chunks;
        self
    }

    /// Runs `pipeline` instead of the standard one (it must end in a host program).
    pub fn pipeline(mut self, pipeline: Pipeline) -> Compiler {
        self.registry_pipeline = Some(pipeline);
        self
    }

    /// Prints or writes the IR between passes as `dump` says.
    pub fn dump(mut self, dump: DumpOptions) -> Compiler {
        self.dump = dump;
        self
    }

    /// Compiles a fusion built in Rust (or loaded). When the compiler's values change its
    /// parameters, it is reloaded from its canonical text with them, so schedules, meshes and
    /// load checks all see them; otherwise it is lowered as it is.
    pub fn compile(&self, fusion: &Fusion) -> Result<Executable, Error> {
        let file = format!("{}.weave", fusion.name);
        let text = std::cell::OnceCell::new();
        let source = || text.get_or_init(|| weave_ir::text::print(fusion)).clone();
        let first = if self
            .params
            .iter()
            .all(|(k, v)| fusion.param_value(k) == Some(*v))
        {
            fusion.clone()
        } else {
            crate::load(&file, &source(), &self.params)?
        };
        self.build(first, &|set| Ok(crate::load(&file, &source(), set)?))
    }

    /// Loads `source` (named `file` in errors) and compiles it. The load already sees the
    /// device count as the mesh size (unless the caller sets that parameter), so that its checks
    /// judge the sizes a run binds, not the source's default mesh size.
    pub fn compile_source(&self, file: &str, source: &str) -> Result<Executable, Error> {
        let first = match self.devices {
            Some(n) => crate::load_on(file, source, &self.params, n)?,
            None => crate::load(file, source, &self.params)?,
        };
        self.build(first, &|set| Ok(crate::load(file, source, set)?))
    }

    /// Sets the role parameters `first` leaves free (reloading it with `reload` when a value
    /// changes), picks the chunk count, and lowers.
    fn build(&self, first: Fusion, reload: &Reload<'_>) -> Result<Executable, Error> {
        let start = Instant::now();
        let mut set = self.params.clone();
        // The parameter playing `role`, with its value, unless the caller set it.
        let free = |role: ParamRole, set: &[(String, i64)]| {
            first
                .role_param(role)
                .filter(|p| !set.iter().any(|(k, _)| *k == p.name))
                .map(|p| (p.name.clone(), p.value))
        };
        let mut changed = false;
        let mut bind = |set: &mut Vec<(String, i64)>, name: String, current, value: usize| {
            let value = i64::try_from(value).unwrap_or(i64::MAX);
            if current != Some(value) {
                changed = true;
            }
            set.push((name, value));
        };
        if let (Some(n), Some((name, current))) = (self.devices, free(ParamRole::MeshSize, &set)) {
            bind(&mut set, name, current, n);
        }
        let mut choice = None;
        let mut serial = false;
        if let Some((name, current)) = free(ParamRole::ChunkCount, &set) {
            // The chunk counts that keep the caller's data (`Fusion::chunk_count_keeps_the_data`),
            // judged with the parameters bound so far (the mesh size among them).
            let mut bound = first.clone();
            for (k, v) in &set {
                bound
                    .set_param(k, *v)
                    .map_err(|d| Error::Program(d.to_string()))?;
            }
            let keeps = |n: usize| {
                i64::try_from(n)
                    .map_err(|_| format!("{n} chunks"))
                    .and_then(|n| {
                        bound
                            .chunk_count_keeps_the_data(&name, n)
                            .map_err(|d| d.message)
                    })
            };
            let value = match &self.chunks {
                Chunks::AsWritten => None,
                Chunks::Ring(_) => {
                    keeps(1).map_err(|e| Error::Program(format!("the ring form: {e}")))?;
                    Some(1)
                }
                Chunks::Fixed(n) => {
                    keeps(*n).map_err(|e| Error::Program(format!("--chunks {n}: {e}")))?;
                    Some(*n)
                }
                Chunks::Auto(_) if keeps(1).is_err() => None,
                Chunks::Auto(cal) => {
                    // Meter the program built with one chunk, then let the model choose.
                    let mut one = set.clone();
                    one.push((name.clone(), 1));
                    let program = self.lower(reload(&one)?)?;
                    let ranks = self.devices.unwrap_or(1).max(1);
                    // A program whose meshes need more devices than the ranks cannot be
                    // metered on them: it keeps its own chunk count, and running it on too
                    // few ranks is refused by `check_ranks` with its message.
                    let fits = program.signature.as_ref().is_none_or(|sig| {
                        sig.all_devices()
                            .iter()
                            .all(|&d| usize::try_from(d).is_ok_and(|d| d < ranks))
                    });
                    if fits {
                        let w = crate::chunks::workload(&program, ranks)?;
                        let candidates: Vec<usize> = crate::chunks::CANDIDATES
                            .iter()
                            .copied()
                            .filter(|&n| keeps(n).is_ok())
                            .collect();
                        let c = crate::chunks::choose(&w, cal, &candidates);
                        let n = c.chunks;
                        choice = Some(c);
                        Some(n)
                    } else {
                        None
                    }
                }
            };
            if let Some(v) = value {
                bind(&mut set, name, current, v);
            }
        } else if let (Chunks::Fixed(n), None) =
            (&self.chunks, first.role_param(ParamRole::ChunkCount))
        {
            // One chunk needs no parameter: the Stream axes run serially (below). A multiple
            // of a ring's chunks cuts its steps into pieces (below). Any other fixed chunk
            // count with nothing to set is refused, never ignored.
            serial = *n == 1;
        }
        let mut fusion = if changed { reload(&set)? } else { first };
        let mut ring_pieces = None;
        let mut rings = None;
        if let Chunks::Ring(pieces) = self.chunks {
            if pieces == 0 {
                return Err(Error::Program(
                    "the ring form takes 1 (each step whole) or more pieces a step, not 0".into(),
                ));
            }
            let form = weave_passes::ring_form::ring_form(&fusion)
                .map_err(|d| Error::Program(d.to_string()))?;
            let file = format!("{}.weave (its ring form)", fusion.name);
            fusion = crate::load(&file, &form.source, &[])?;
            let reduces = form
                .rings
                .iter()
                .any(|r| r.kind != weave_passes::ring_form::RingKind::Allgather);
            if pieces > 1 && !reduces {
                return Err(Error::Program(format!(
                    "ring:{pieces}: the ring form of `{}` has no reduce ring to cut into pieces (its rings: {form}); `ring` runs it with each step whole",
                    fusion.name
                )));
            }
            if pieces > 1 {
                let k = i64::try_from(pieces).unwrap_or(i64::MAX);
                // Refused here in the fusion's own names (lowering would name the ring's
                // internal partial).
                let uneven = form.rings.iter().find(|r| {
                    r.kind != weave_passes::ring_form::RingKind::Allgather
                        && r.extent
                            % i64::try_from(r.devices)
                                .unwrap_or(i64::MAX)
                                .saturating_mul(k)
                            != 0
                });
                if let Some(r) = uneven {
                    return Err(Error::Program(format!(
                        "ring:{pieces}: the {} rows of `{}` (axis {}) do not fall into {} device blocks of {pieces} equal pieces each",
                        r.extent, r.tensor, r.axis, r.devices
                    )));
                }
                ring_pieces = Some(k);
            }
            rings = Some(form);
        } else if serial {
            fusion.serialize_streams();
        } else if let (Chunks::Fixed(n), None) =
            (&self.chunks, fusion.role_param(ParamRole::ChunkCount))
        {
            ring_pieces = pieces_of(&fusion, *n)?;
        }
        let program = match ring_pieces {
            Some(k) => self.lower_with_ring_pieces(fusion, k)?,
            None => self.lower(fusion)?,
        };
        let mut exe = Executable::from_program(program)?;
        exe.compile_time = start.elapsed();
        exe.chunk_choice = choice;
        exe.ring_pieces = match (&self.chunks, ring_pieces, &rings) {
            (Chunks::Fixed(n), Some(k), _) => Some((*n, k)),
            (Chunks::Ring(_), Some(k), Some(form)) => {
                let d = form.rings.first().map_or(1, |r| r.devices);
                Some((
                    d.saturating_mul(usize::try_from(k).unwrap_or(usize::MAX)),
                    k,
                ))
            }
            _ => None,
        };
        exe.ring_form = rings;
        Ok(exe)
    }

    /// Runs the pipeline on a loaded fusion.
    pub fn lower(&self, fusion: Fusion) -> Result<HostProgram, Error> {
        let manager = match &self.registry_pipeline {
            Some(p) => PassManager::new(Registry::standard(), p.clone()),
            None => PassManager::standard(),
        };
        self.run_manager(manager, fusion)
    }

    /// [`Compiler::lower`] with every reduce ring summing in its GEMMs, `pieces` pieces per
    /// step (`lower-to-host{ring-pieces=K}`, keeping the pipeline's other options of that
    /// pass).
    fn lower_with_ring_pieces(&self, fusion: Fusion, pieces: i64) -> Result<HostProgram, Error> {
        let registry = Registry::standard();
        let mut pipeline = self
            .registry_pipeline
            .clone()
            .unwrap_or_else(Pipeline::standard);
        let options = pipeline
            .passes()
            .iter()
            .find(|s| s.name() == "lower-to-host")
            .map(|s| s.pass().options())
            .unwrap_or_default();
        let item = format!("lower-to-host{{{options} ring-pieces={pieces}}}");
        let stage = Pipeline::parse(&item, &registry)
            .map_err(|e| Error::Program(format!("{item}: {e}")))?;
        if let Some(s) = stage.passes().first() {
            pipeline.replace("lower-to-host", s.clone());
        }
        self.run_manager(PassManager::new(registry, pipeline), fusion)
    }

    fn run_manager(&self, manager: PassManager, fusion: Fusion) -> Result<HostProgram, Error> {
        let manager = manager.with_options(self.dump.clone());
        match manager.run(weave_passes::Ir::Fusion(fusion))? {
            weave_passes::Ir::Host(p) => Ok(p),
            other => Err(weave_passes::PipelineError::WrongResult(other.form()).into()),
        }
    }
}

/// The pieces per ring step that `--chunks n` asks of `fusion`, which has no chunk-count
/// parameter: `None` for the chunks as written, `Some(n / e)` for a multiple `n` of the
/// chunks `e` its stream loops run (a ring's steps cut into pieces, which
/// `lower-to-host{ring-pieces=K}` refuses where no ring sums in its GEMMs); any other count is
/// refused, never ignored.
fn pieces_of(fusion: &Fusion, n: usize) -> Result<Option<i64>, Error> {
    let extents = fusion.stream_axis_extents();
    let refused = |why: String| {
        Error::Program(format!(
            "--chunks {n}: `{}` has no chunk-count parameter (declared `s: chunks` or the extent of its Stream axes) to set{why}",
            fusion.name
        ))
    };
    let [e] = extents.as_slice() else {
        return Err(refused(String::new()));
    };
    if *e < 1 {
        return Err(refused(format!("; its stream loops run {e} chunks")));
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    if n == *e {
        return Ok(None);
    }
    if n % e != 0 {
        return Err(refused(format!(
            "; its stream loops run {e} chunks, so it takes 1 (serial), {e} (as written) or a multiple of {e} (a ring's steps in pieces)"
        )));
    }
    Ok(Some(n / e))
}

/// Loads the fusion again with other parameter values.
type Reload<'a> = dyn Fn(&[(String, i64)]) -> Result<Fusion, Error> + 'a;
