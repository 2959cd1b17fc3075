//! The user-facing API: compile once, run on named global tensors of their own dtype, get
//! named global outputs back; parameter roles instead of parameter names; every bad input
//! refused with the tensor it concerns.

use streamweave::half::bf16;
use streamweave::ir::{DType, Fusion, MeshSpec, ParallelType, Scalar, ScheduleOp, ScheduleStep};
use streamweave::{Chunks, Compiler, Error, Executable, RunOptions, Target, Tensor};

/// `y = x + x` with `x` split across the devices of a 1-D mesh (declared roles).
const DOUBLE: &str = "\
fusion double(n = 8, k: mesh = 2) {
  mesh m = devices(k)
  tensor x: f32[n] on m
  y = add(x, x)
  output y
  schedule x { outer_split(0, k) -> DIDx }
}
";

fn cpu(ranks: usize) -> RunOptions {
    RunOptions {
        check: true,
        ..RunOptions::on(Target::Cpu { ranks })
    }
}

#[test]
fn outputs_come_back_global_and_in_the_inputs_dtype() {
    for ranks in [1, 2, 4] {
        let exe = Compiler::new()
            .devices(ranks)
            .compile_source("double.weave", DOUBLE)
            .unwrap();
        assert_eq!(exe.signature().param("k"), Some(ranks as i64));
        let x = Tensor::new(vec![8], (0..8).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
        let report = exe.run(&[("x", &x)], &cpu(ranks)).unwrap();
        assert!(report.passed(), "{:?}", report.checks);
        assert_eq!(report.checks.len(), ranks);
        let y = report.into_outputs().unwrap();
        assert_eq!(
            y.get("y").unwrap().as_f32().unwrap(),
            &[0., 2., 4., 6., 8., 10., 12., 14.]
        );
    }
    // bf16 in, bf16 out.
    let exe = Compiler::new()
        .compile_source("double.weave", &DOUBLE.replace("f32[n]", "bf16[n]"))
        .unwrap();
    let x = Tensor::new(vec![8], vec![bf16::from_f32(1.5); 8]).unwrap();
    let y = exe
        .run(&[("x", &x)], &RunOptions::default())
        .unwrap()
        .into_outputs()
        .unwrap();
    let y = y.get("y").unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(y.as_bf16().unwrap(), &[bf16::from_f32(3.0); 8]);
}

#[test]
fn inputs_that_do_not_fit_the_signature_name_the_tensor() {
    let exe = Compiler::new()
        .compile_source("double.weave", DOUBLE)
        .unwrap();
    let x = Tensor::new(vec![8], vec![0f32; 8]).unwrap();
    let err = |inputs: &[(&str, &Tensor)]| exe.run(inputs, &cpu(2)).unwrap_err().to_string();
    assert_eq!(err(&[]), "input `x`: not given");
    assert_eq!(
        err(&[("x", &x), ("w", &x)]),
        "input `w`: the program has no such input (it has: x)"
    );
    assert_eq!(err(&[("x", &x), ("x", &x)]), "input `x`: given twice");
    let wrong = Tensor::new(vec![8], vec![0f64; 8]).unwrap();
    assert_eq!(
        err(&[("x", &wrong)]),
        "input `x`: is f64 but the program takes f32"
    );
    let short = Tensor::new(vec![2, 3], vec![0f32; 6]).unwrap();
    assert_eq!(
        err(&[("x", &short)]),
        "input `x`: has shape [2, 3] but the program takes [8]"
    );
    assert_eq!(
        Tensor::new(vec![3], vec![0f32; 4]).unwrap_err().to_string(),
        "a tensor of shape [3] holds 3 elements, not 4"
    );
    assert_eq!(
        exe.run(&[("x", &x)], &cpu(3)).unwrap_err().to_string(),
        "3 ranks were asked for but the program's meshes cover 2 device(s): every rank must be \
         a device of a mesh (compile it with k=3)"
    );
}

fn step(op: ScheduleOp) -> ScheduleStep {
    ScheduleStep { op, span: None }
}

/// A row-parallel linear built in Rust, its roles undeclared (derived from use: `width`
/// sizes the mesh, `pieces` is the extent of the Stream axis).
fn built() -> Fusion {
    let mut f = Fusion::new("built");
    for (name, v) in [("t", 12), ("h", 4), ("width", 2), ("pieces", 3)] {
        f.add_param(name, Some(v)).unwrap();
    }
    let m = f
        .add_mesh("m", MeshSpec::Devices(vec![Scalar::named("width")]))
        .unwrap();
    let k = Scalar::named("h").mul(4);
    let inp = f
        .add_input(
            "inp",
            DType::F32,
            vec![Scalar::named("t"), k.clone()],
            Some(m),
        )
        .unwrap();
    let w = f
        .add_input("w", DType::F32, vec![Scalar::named("h"), k], Some(m))
        .unwrap();
    let out = f.linear("out", inp, w, None).unwrap();
    f.add_output(out).unwrap();
    f.tensor_mut(inp).schedule = vec![
        step(ScheduleOp::OuterSplit {
            axis: 0,
            factor: Scalar::named("pieces"),
            parallel: Some(ParallelType::Stream),
        }),
        step(ScheduleOp::OuterSplit {
            axis: 2,
            factor: Scalar::named("width"),
            parallel: Some(ParallelType::DIDx),
        }),
    ];
    f.tensor_mut(w).schedule = vec![step(ScheduleOp::OuterSplit {
        axis: 1,
        factor: Scalar::named("width"),
        parallel: Some(ParallelType::DIDx),
    })];
    streamweave::transform::schedule::apply_schedules(&mut f).unwrap();
    f
}

#[test]
fn fusions_built_in_rust_get_the_mesh_size_and_the_chunk_count_by_role() {
    let exe = Compiler::new()
        .devices(4)
        .chunks(Chunks::Fixed(5))
        .compile(&built())
        .unwrap();
    let sig = exe.signature();
    assert_eq!(sig.param("width"), Some(4));
    assert_eq!(sig.param("pieces"), Some(5));
    let globals = exe.random_inputs(3).unwrap();
    let report = exe.run_dense(&globals, &cpu(4)).unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    // A value given explicitly wins over the role.
    let exe = Compiler::new()
        .devices(4)
        .set("width", 2)
        .compile(&built())
        .unwrap();
    assert_eq!(exe.signature().param("width"), Some(2));
    // The cost model picks the chunk count of a Rust-built fusion too.
    let exe = Compiler::new()
        .devices(2)
        .chunks(Chunks::Auto(streamweave::chunks::Calibration::default()))
        .compile(&built())
        .unwrap();
    let choice = exe.chunk_choice().expect("the model chose");
    assert_eq!(exe.signature().param("pieces"), Some(choice.chunks as i64));
    assert_eq!(
        choice.predicted.len(),
        streamweave::chunks::CANDIDATES.len()
    );
}

#[test]
fn a_two_dimensional_mesh_has_no_mesh_size_role() {
    let source = "\
fusion grid(dy = 2, dx = 2) {
  mesh m = devices(dy, dx)
  tensor x: f32[dy, dx] on m
  y = neg(x)
  output y
  schedule x { parallelize(0, DIDy); parallelize(1, DIDx) }
}
";
    let exe = Compiler::new()
        .devices(8)
        .compile_source("grid.weave", source)
        .unwrap();
    assert_eq!(exe.signature().param("dy"), Some(2));
    assert_eq!(exe.signature().param("dx"), Some(2));
    assert!(exe.signature().roles.is_empty());
    let report = exe
        .run_dense(&exe.random_inputs(1).unwrap(), &cpu(4))
        .unwrap();
    assert!(report.passed(), "{:?}", report.checks);
}

#[test]
fn a_program_without_a_signature_is_refused_and_a_printed_one_runs() {
    let exe = Compiler::new()
        .compile_source("double.weave", DOUBLE)
        .unwrap();
    let mut bare = exe.program().clone();
    bare.signature = None;
    assert_eq!(
        Executable::from_program(bare).unwrap_err().to_string(),
        "the host program has no `Signature:` block: it does not say the global shapes and \
         shardings of its inputs and outputs"
    );
    let text = streamweave::host_ir::print(exe.program());
    let again = Executable::from_text("double.hir", &text).unwrap();
    let x = Tensor::new(vec![8], vec![1f32; 8]).unwrap();
    let y = again.run(&[("x", &x)], &cpu(2)).unwrap();
    assert!(y.passed());
    assert!(matches!(
        Executable::from_text("double.hir", "%HostIrContainer {"),
        Err(Error::Program(m)) if m.starts_with("expected `(` to open the list of program inputs")
    ));
}

/// A caller that owns its ranks, backends, communicators and buffers runs each rank on
/// buffers already in place; the outputs stay in its buffers.
#[test]
fn ranks_run_on_buffers_already_in_place() {
    use streamweave::comm::LocalWorld;
    use streamweave::executor::{Backend, CpuBackend, CpuOptions, StreamKey};
    let exe = Compiler::new()
        .devices(2)
        .compile_source("double.weave", DOUBLE)
        .unwrap();
    let x = Tensor::new(vec![8], (0..8).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    let globals = exe.bind(&[("x", &x)]).unwrap();
    let world = LocalWorld::new(2, std::time::Duration::from_secs(10));
    let options = RunOptions::default();
    let shards: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (exe, globals, options) = (&exe, &globals, &options);
                let comm = world.communicator(rank);
                s.spawn(move || {
                    let backend = CpuBackend::new(CpuOptions::default());
                    let buffers: Vec<_> = exe
                        .shard_inputs(globals, rank)
                        .unwrap()
                        .iter()
                        .map(|d| backend.upload(d).unwrap())
                        .collect();
                    let run = exe
                        .run_rank_buffers(&backend, &comm, &buffers, options)
                        .unwrap();
                    let main = backend.stream(StreamKey::Main).unwrap();
                    let out = backend.download(&run.outputs[0], &main).unwrap();
                    backend.synchronize().unwrap();
                    out.data
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(shards[1], vec![8., 10., 12., 14.]);
    let y = exe.outputs()[0].unshard(&shards, f64::NAN).unwrap();
    assert_eq!(y, vec![0., 2., 4., 6., 8., 10., 12., 14.]);
    // The wrong number of buffers is refused before anything is issued.
    let backend = CpuBackend::new(CpuOptions::default());
    let err = exe
        .run_rank_buffers(&backend, &world.communicator(0), &[], &options)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 0: 0 input buffers were given, the program takes 1"
    );
}

/// The timeout bounds the whole run, not only its waits: a loop of many cheap chunks that
/// never waits long stops at the deadline, naming where it was, on every rank. (Each chunk
/// is a GEMM: a loop that only launches kernels on small chunks would run once, over the
/// whole tensor.)
#[test]
fn the_timeout_bounds_the_whole_run() {
    let source = "\
fusion many(n = 60000, s: chunks = 60000) {
  tensor x: f32[n, 1]
  tensor w: f32[1, 1]
  y = matmul(x, w)
  output y
  schedule y { outer_split(0, s) -> Stream }
}
";
    let exe = Compiler::new()
        .compile_source("many.weave", source)
        .unwrap();
    let options = RunOptions {
        timeouts: streamweave::Timeouts::all(std::time::Duration::from_millis(100)),
        check_races: false,
        ..RunOptions::on(Target::Cpu { ranks: 1 })
    };
    let start = std::time::Instant::now();
    let err = exe
        .run_dense(&exe.random_inputs(1).unwrap(), &options)
        .unwrap_err()
        .to_string();
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(
        err.starts_with("rank 0: rank 0: the whole run, at `"),
        "{err}"
    );
    assert!(err.ends_with("timed out after 100 ms"), "{err}");
}

/// Without the `cuda` feature (`cargo test -p streamweave --no-default-features`, which CI
/// runs), a GPU target is refused with a message naming the missing feature, before any rank
/// starts, and the CPU target of the same executable still runs.
#[cfg(not(feature = "cuda"))]
#[test]
fn a_gpu_target_in_a_build_without_cuda_says_so() {
    let exe = Compiler::new()
        .devices(2)
        .compile_source("double.weave", DOUBLE)
        .unwrap();
    let x = Tensor::new(vec![8], vec![1.0f32; 8]).unwrap();
    let err = exe
        .run(&[("x", &x)], &RunOptions::on(Target::Cuda { ranks: 2 }))
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("no CUDA support") && message.contains("`cuda` feature"),
        "{message}"
    );
    let y = exe
        .run(&[("x", &x)], &cpu(2))
        .unwrap()
        .into_outputs()
        .unwrap();
    assert_eq!(y.get("y").unwrap().as_f32().unwrap(), &[2.0f32; 8]);
}

/// Every element type has its accessor on [`Tensor`], and only the tensor's own one answers;
/// outputs of each come back through it.
#[test]
fn every_dtype_has_its_accessor_and_only_its_own_answers() {
    use streamweave::half::f16;
    let tensors = [
        Tensor::new(vec![2], vec![1.5f32, -2.0]).unwrap(),
        Tensor::new(vec![2], vec![1.5f64, -2.0]).unwrap(),
        Tensor::new(vec![2], vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]).unwrap(),
        Tensor::new(vec![2], vec![f16::from_f32(1.5), f16::from_f32(-2.0)]).unwrap(),
        Tensor::new(vec![2], vec![3i64, -4]).unwrap(),
        Tensor::new(vec![2], vec![true, false]).unwrap(),
    ];
    for (k, t) in tensors.iter().enumerate() {
        let answers = [
            t.as_f32().is_some(),
            t.as_f64().is_some(),
            t.as_bf16().is_some(),
            t.as_f16().is_some(),
            t.as_i64().is_some(),
            t.as_bool().is_some(),
        ];
        let mut only = [false; 6];
        only[k] = true;
        assert_eq!(answers, only, "{}", t.dtype());
        assert_eq!(t.shape(), &[2]);
        // The earlier name answers the same until it goes.
        #[allow(deprecated)]
        let sizes = t.sizes();
        assert_eq!(t.shape(), sizes);
    }
    assert_eq!(tensors[3].as_f16().unwrap()[0].to_f32(), 1.5);
    assert_eq!(tensors[4].as_i64().unwrap(), &[3, -4]);
    assert_eq!(tensors[5].as_bool().unwrap(), &[true, false]);

    // i64 and f16 outputs, through their accessors.
    let run = |dtype: &str, x: &Tensor| {
        Compiler::new()
            .compile_source(
                "double.weave",
                &DOUBLE.replace("f32[n]", &format!("{dtype}[n]")),
            )
            .unwrap()
            .run(&[("x", x)], &cpu(2))
            .unwrap()
            .into_outputs()
            .unwrap()
    };
    let x = Tensor::new(vec![8], (0..8).map(|i| i - 4).collect::<Vec<i64>>()).unwrap();
    let y = run("i64", &x);
    assert_eq!(
        y.get("y").unwrap().as_i64().unwrap(),
        &[-8, -6, -4, -2, 0, 2, 4, 6]
    );
    let x = Tensor::new(vec![8], vec![f16::from_f32(0.75); 8]).unwrap();
    let y = run("f16", &x);
    assert_eq!(
        y.get("y").unwrap().as_f16().unwrap(),
        &[f16::from_f32(1.5); 8]
    );
}

/// The facade's one error type: what a fusion, a compilation and a run refuse all convert
/// into it, and `main` returning it prints the message (its `Debug` is its `Display`).
#[test]
fn the_facade_error_reads_as_its_message_in_debug() {
    let err = Compiler::new()
        .compile_source("bad.weave", "fusion f() {\n  tensor x: f99[4]\n}")
        .unwrap_err();
    assert!(matches!(err, Error::Load(_)), "{err:#?}");
    assert_eq!(format!("{err:?}"), err.to_string());
    assert!(format!("{err:#?}").starts_with("Load("), "{err:#?}");

    let exe = Compiler::new()
        .devices(2)
        .compile_source("double.weave", DOUBLE)
        .unwrap();
    let x = Tensor::new(vec![8], vec![1i64; 8]).unwrap();
    let err: Error = exe.run(&[("x", &x)], &cpu(2)).unwrap_err();
    assert_eq!(format!("{err:?}"), err.to_string());
    assert!(err.to_string().contains("`x`"), "{err}");

    let mut fusion = streamweave::load("double.weave", DOUBLE, &[]).unwrap();
    let diagnostic = fusion.set_param("no_such_parameter", 3).unwrap_err();
    let err = Error::from(diagnostic.clone());
    assert_eq!(err.to_string(), diagnostic.message);
}
