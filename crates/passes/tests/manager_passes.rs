//! The pass machinery with small test passes: the registry and its unknown-name error,
//! typed pipelines, pipeline text and edits, the `WEAVE_DUMP` syntax, print-before/after/
//! after-change, the dump directory, and failures (a pass error, a verifier failure) with
//! their reproducer files.

use std::path::PathBuf;

use weave_passes::{
    DumpFlags, DumpOptions, Ir, PassError, PassManager, PassSelection, Pipeline, PipelineError,
    PipelineParseError, Registry,
};

mod toy;

use toy::{fusion, fusion_of, CORRUPT, FAIL, NOOP, RENAME};

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(|| NOOP)
        .register(|| RENAME)
        .register(|| CORRUPT)
        .register(|| FAIL);
    r
}

fn manager(pipeline: &str, options: DumpOptions) -> PassManager {
    let registry = registry();
    let pipeline = Pipeline::parse(pipeline, &registry).unwrap();
    PassManager::new(registry, pipeline).with_options(options)
}

/// Runs `pipeline` on the test fusion; returns the result and what was printed.
fn run(pipeline: &str, options: DumpOptions) -> (Result<Ir, PipelineError>, String) {
    let mut out = Vec::new();
    let result = manager(pipeline, options).run_with_output(Ir::Fusion(fusion()), &mut out);
    (result, String::from_utf8(out).unwrap())
}

fn options(spec: &str) -> DumpOptions {
    DumpOptions::parse(spec).unwrap()
}

/// A fresh, empty directory under the system temp dir, unique to this test.
fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weave-pm-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn files_in(dir: &PathBuf) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The header lines of the dumps in `out`.
fn headers(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("// -----//"))
        .collect()
}

// ---- Registry ----

#[test]
fn unknown_pass_lists_the_known_ones() {
    let err = registry().get("nope").err().unwrap();
    assert_eq!(
        err.to_string(),
        "unknown pass `nope` (known passes: noop, rename, corrupt, fail)"
    );
    assert_eq!(
        Registry::new().get("nope").err().unwrap().to_string(),
        "unknown pass `nope` (no passes are registered)"
    );
}

#[test]
fn registry_lists_names_and_summaries_in_registration_order() {
    let r = registry();
    let list: Vec<(&str, &str)> = r.list().iter().map(|i| (i.name, i.summary)).collect();
    assert_eq!(list[0], ("noop", "changes nothing"));
    assert_eq!(r.names(), ["noop", "rename", "corrupt", "fail"]);
    assert_eq!(r.get("rename").unwrap().name(), "rename");
}

#[test]
#[should_panic(expected = "pass `noop` is registered twice")]
fn registering_a_name_twice_panics() {
    let mut r = registry();
    r.register(|| NOOP);
}

// ---- Pipelines ----

#[test]
fn pipeline_prints_and_parses_back() {
    let r = registry();
    let p = Pipeline::parse("noop, rename ,corrupt", &r).unwrap();
    assert_eq!(p.names(), ["noop", "rename", "corrupt"]);
    assert_eq!(p.to_string(), "noop,rename,corrupt");
    assert_eq!(Pipeline::parse(&p.to_string(), &r).unwrap(), p);
    assert!(Pipeline::parse("", &r).unwrap().is_empty());
}

#[test]
fn pipeline_rejects_unknown_and_empty_names() {
    let r = registry();
    assert_eq!(
        Pipeline::parse("noop,nope", &r).unwrap_err().to_string(),
        "unknown pass `nope` (known passes: noop, rename, corrupt, fail)"
    );
    assert!(matches!(
        Pipeline::parse("noop,,rename", &r),
        Err(PipelineParseError::EmptyName { .. })
    ));
    assert!(matches!(
        Pipeline::parse("noop,", &r),
        Err(PipelineParseError::EmptyName { .. })
    ));
    assert!(matches!(
        Pipeline::parse("noop,+rename", &r),
        Err(PipelineParseError::Mixed { .. })
    ));
}

#[test]
fn typed_pipelines_need_no_registry() {
    let mut p = Pipeline::default().then(NOOP).then(RENAME).then(NOOP);
    assert_eq!(p.to_string(), "noop,rename,noop");
    assert_eq!(p, Pipeline::parse("noop,rename,noop", &registry()).unwrap());
    assert!(p.replace("noop", FAIL));
    assert!(!p.replace("corrupt", NOOP));
    assert_eq!(p.names(), ["fail", "rename", "fail"]);

    // A manager runs a typed pipeline whatever its registry holds.
    let pipeline = Pipeline::default().then(RENAME);
    let ir = PassManager::new(Registry::new(), pipeline)
        .run_with_output(Ir::Fusion(fusion()), &mut Vec::new())
        .unwrap();
    assert!(fusion_of(&ir).tensor_by_name("c_renamed").is_some());
}

#[test]
fn the_standard_manager_is_the_standard_pipeline_without_dumps() {
    let manager = PassManager::standard();
    assert_eq!(manager.pipeline, Pipeline::standard());
    assert_eq!(manager.options, DumpOptions::default());
    assert_eq!(
        Pipeline::standard().to_string(),
        "propagate-shardings,decompose-reshardings,reorder-sharded-axis,\
         finalize-multidevice-domains,segment,lower-to-host,merge-kernel-chunks,\
         assign-streams,allocate-and-deallocate,prefetch-communications"
    );
}

#[test]
fn edits_append_and_remove() {
    let r = registry();
    let mut p = Pipeline::parse("noop,rename", &r).unwrap();
    p.apply_edits("+corrupt,-noop,+rename", &r).unwrap();
    assert_eq!(p.to_string(), "rename,corrupt");
    // Removing an absent pass does nothing; a bad edit leaves the pipeline as it was.
    p.apply_edits("-fail", &r).unwrap();
    assert_eq!(p.to_string(), "rename,corrupt");
    let err = p.apply_edits("-rename,+nope", &r).unwrap_err();
    assert!(err.to_string().starts_with("unknown pass `nope`"), "{err}");
    assert_eq!(p.to_string(), "rename,corrupt");
    assert!(matches!(
        p.apply_edits("+noop,rename", &r),
        Err(PipelineParseError::Mixed { .. })
    ));
}

#[test]
fn resolve_reads_a_pipeline_or_edits() {
    let r = registry();
    let base = Pipeline::parse("noop,rename", &r).unwrap();
    let edited = Pipeline::resolve("-noop,+fail", &base, &r).unwrap();
    assert_eq!(edited.to_string(), "rename,fail");
    let replaced = Pipeline::resolve("corrupt", &base, &r).unwrap();
    assert_eq!(replaced.to_string(), "corrupt");
    assert!(Pipeline::resolve("", &base, &r).unwrap().is_empty());
}

// ---- WEAVE_DUMP ----

#[test]
fn weave_dump_syntax() {
    let o = options("before:noop, after:rename,after:corrupt,after-change,dir:/tmp/x");
    assert_eq!(o.before, PassSelection::Only(vec!["noop".into()]));
    assert_eq!(
        o.after,
        PassSelection::Only(vec!["rename".into(), "corrupt".into()])
    );
    assert!(o.after_change);
    assert_eq!(o.dir, Some(PathBuf::from("/tmp/x")));

    let all = options("after:all,after:noop");
    assert_eq!(all.after, PassSelection::All);
    assert_eq!(all.before, PassSelection::None);
    assert_eq!(options(""), DumpOptions::default());

    for bad in ["after", "after:", "during:noop", "dir:", "all"] {
        let err = DumpOptions::parse(bad).unwrap_err();
        assert_eq!(err.item, bad);
        assert!(
            err.to_string()
                .contains("before:PASS|all, after:PASS|all, after-change, dir:PATH"),
            "{err}"
        );
    }
}

#[test]
fn dump_flags_add_to_the_weave_dump_value_they_are_given() {
    let flags = DumpFlags {
        print_before: vec!["rename".into()],
        weave_dump: Some("after:all,before:noop,dir:/tmp/weave-env".into()),
        ..DumpFlags::default()
    };
    let o = flags.dump_options().unwrap();
    assert_eq!(
        o.before,
        PassSelection::Only(vec!["noop".into(), "rename".into()])
    );
    assert_eq!(o.after, PassSelection::All);
    assert_eq!(o.dir, Some(PathBuf::from("/tmp/weave-env")));
    assert_eq!(
        DumpFlags::default().dump_options().unwrap(),
        DumpOptions::default()
    );
    let bad = DumpFlags {
        weave_dump: Some("after".into()),
        ..DumpFlags::default()
    };
    assert!(matches!(
        PassManager::from_flags(&bad),
        Err(PipelineError::DumpSpec(_))
    ));
}

#[test]
fn flags_merge_on_top_of_weave_dump() {
    let mut o = options("before:noop,dir:/a");
    o.merge(options("before:rename,after:all,after-change"));
    assert_eq!(
        o.before,
        PassSelection::Only(vec!["noop".into(), "rename".into()])
    );
    assert_eq!(o.after, PassSelection::All);
    assert!(o.after_change);
    assert_eq!(o.dir, Some(PathBuf::from("/a")));
}

// ---- Dumps ----

#[test]
fn print_before_and_after_selected_passes() {
    let (result, out) = run("noop,rename", options("before:rename,after:noop"));
    result.unwrap();
    assert_eq!(
        headers(&out),
        [
            "// -----// IR Dump After noop (fusion) //----- //",
            "// -----// IR Dump Before rename (fusion) //----- //",
        ]
    );
    // Each dump is the seed-style fusion.
    let first = weave_ir::print::fusion_to_string(&fusion());
    assert!(out.contains(&first));
}

#[test]
fn print_after_all_shows_each_result() {
    let (result, out) = run("noop,rename", options("after:all"));
    let ir = result.unwrap();
    assert_eq!(
        headers(&out),
        [
            "// -----// IR Dump After noop (fusion) //----- //",
            "// -----// IR Dump After rename (fusion) //----- //",
        ]
    );
    let last = weave_ir::print::fusion_to_string(fusion_of(&ir));
    assert!(out.ends_with(&last), "{out}");
    assert!(last.contains("T2_l_f32"), "{last}");
}

#[test]
fn print_before_all() {
    let (result, out) = run("rename,noop", options("before:all"));
    result.unwrap();
    assert_eq!(
        headers(&out),
        [
            "// -----// IR Dump Before rename (fusion) //----- //",
            "// -----// IR Dump Before noop (fusion) //----- //",
        ]
    );
}

#[test]
fn print_after_change_skips_passes_that_changed_nothing() {
    let (result, out) = run("noop,rename,noop", options("after-change"));
    result.unwrap();
    assert_eq!(
        headers(&out),
        ["// -----// IR Dump After rename (fusion) //----- //"]
    );
    // With a selection, after-change narrows it.
    let (_, out) = run("noop,rename", options("after:noop,after-change"));
    assert_eq!(out, "");
}

#[test]
fn no_options_print_nothing() {
    let (result, out) = run("noop,rename", DumpOptions::default());
    assert!(fusion_of(&result.unwrap())
        .tensor_by_name("c_renamed")
        .is_some());
    assert_eq!(out, "");
}

#[test]
fn dump_dir_alone_writes_after_every_pass() {
    let dir = scratch_dir("dir-alone");
    let o = DumpOptions {
        dir: Some(dir.clone()),
        ..DumpOptions::default()
    };
    let (result, out) = run("noop,rename", o);
    result.unwrap();
    assert_eq!(out, "", "with a dump dir nothing goes to the output");
    assert_eq!(
        files_in(&dir),
        ["000-noop.after.txt", "001-rename.after.txt"]
    );
    let text = std::fs::read_to_string(dir.join("001-rename.after.txt")).unwrap();
    assert!(text.starts_with("Fusion f(n = 4)"), "{text}");
    assert!(text.contains("T2_l_f32"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dump_dir_with_selection_writes_the_selected_files() {
    let dir = scratch_dir("dir-selected");
    let mut o = options("before:rename,after:rename");
    o.dir = Some(dir.clone());
    let (result, _) = run("noop,rename", o);
    result.unwrap();
    assert_eq!(
        files_in(&dir),
        ["001-rename.after.txt", "001-rename.before.txt"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dump_selection_of_an_unknown_pass_is_an_error() {
    let (result, _) = run("noop", options("after:nope"));
    let err = result.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("unknown pass `nope` (known passes:"),
        "{err}"
    );
}

// ---- Failures ----

#[test]
fn verifier_failure_names_the_pass_and_leaves_a_reproducer() {
    let dir = scratch_dir("verify-fail");
    let mut o = options("after:corrupt");
    o.dir = Some(dir.clone());
    let (result, _) = run("rename,corrupt,noop", o);
    let err = result.unwrap_err();
    assert_eq!(err.pass(), Some("corrupt"));
    let PipelineError::Pass(failure) = &err else {
        panic!("expected a pass failure, got {err:?}");
    };
    assert_eq!(failure.index, 1);
    assert!(matches!(
        failure.error,
        PassError::Verify {
            pass: "corrupt",
            ..
        }
    ));
    let repro = dir.join("weave-repro-corrupt.txt");
    assert_eq!(err.reproducer(), Some(repro.as_path()));
    assert_eq!(
        err.to_string(),
        format!(
            "IR invalid after pass `corrupt`: duplicate tensor name `a` \
             (pass 2 of 3 in pipeline `rename,corrupt,noop`; reproducer: {})",
            repro.display()
        )
    );

    // The invalid output is still dumped, so the pass author can see it.
    assert_eq!(
        files_in(&dir),
        ["001-corrupt.after.txt", "weave-repro-corrupt.txt"]
    );

    // The reproducer: what failed, the pipeline, and the input to `corrupt` (the output of
    // `rename`) as `.weave` text that loads back.
    let text = std::fs::read_to_string(&repro).unwrap();
    assert!(text.starts_with(
        "// weave reproducer: pass `corrupt` (2 of 3) failed\n\
         // error: IR invalid after pass `corrupt`: duplicate tensor name `a`\n\
         // pipeline: rename,corrupt,noop\n\
         // failing pass: corrupt\n"
    ));
    let reparsed = weave_ir::text::parse(&text, &[]).unwrap();
    assert!(reparsed.tensor_by_name("c_renamed").is_some());
    assert!(reparsed.tensor_by_name("d").is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn invalid_output_is_still_printed_after_the_pass() {
    let (result, out) = run("corrupt", options("after:all"));
    let err = result.unwrap_err();
    assert_eq!(err.pass(), Some("corrupt"));
    assert_eq!(
        headers(&out),
        ["// -----// IR Dump After corrupt (fusion, verifier failed) //----- //"]
    );
    // Without a dump directory no reproducer is written, and the error says how to get one.
    assert_eq!(err.reproducer(), None);
    assert!(
        err.to_string().ends_with(
            "(pass 1 of 1 in pipeline `corrupt`; no reproducer: set a dump directory (--dump-dir DIR) to write one)"
        ),
        "{err}"
    );
}

#[test]
fn a_second_failure_never_overwrites_the_first_reproducer() {
    let dir = scratch_dir("repro-unique");
    let with_dir = || DumpOptions {
        dir: Some(dir.clone()),
        ..DumpOptions::default()
    };
    let first = run("fail", with_dir()).0.unwrap_err();
    let second = run("fail", with_dir()).0.unwrap_err();
    assert_eq!(
        first.reproducer(),
        Some(dir.join("weave-repro-fail.txt").as_path())
    );
    assert_eq!(
        second.reproducer(),
        Some(dir.join("weave-repro-fail.2.txt").as_path())
    );
    assert_eq!(
        files_in(&dir),
        ["weave-repro-fail.2.txt", "weave-repro-fail.txt"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pass_error_names_the_pass_and_leaves_a_reproducer() {
    let dir = scratch_dir("pass-error");
    let o = DumpOptions {
        dir: Some(dir.clone()),
        ..DumpOptions::default()
    };
    let (result, _) = run("fail", o);
    let err = result.unwrap_err();
    assert_eq!(err.pass(), Some("fail"));
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "pass `fail`: tensor `c` is not supported here (pass 1 of 1 in pipeline `fail`; \
             reproducer: "
        ),
        "{msg}"
    );
    let text = std::fs::read_to_string(dir.join("weave-repro-fail.txt")).unwrap();
    assert!(text.contains("// pipeline: fail\n"));
    assert!(text.contains("the pipeline's input"));
    assert_eq!(
        weave_ir::text::print(&weave_ir::text::parse(&text, &[]).unwrap()),
        weave_ir::text::print(&fusion())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The pipeline's stages are chained when it is parsed; the manager checks only that its
/// input is the form the first stage runs on, before any pass runs (so no reproducer).
#[test]
fn wrong_input_form_is_refused_before_any_pass_runs() {
    let registry = registry();
    let pipeline = Pipeline::parse("noop", &registry).unwrap();
    let program = weave_host_ir::HostProgram::default();
    let dir = scratch_dir("wrong-form");
    let o = DumpOptions {
        dir: Some(dir.clone()),
        ..DumpOptions::default()
    };
    let err = PassManager::new(registry, pipeline)
        .with_options(o)
        .run(Ir::Host(program))
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("pass `noop` expects a fusion, got a host program"),
        "{err}"
    );
    assert!(matches!(err, PipelineError::WrongInput { .. }), "{err}");
    assert!(!dir.exists(), "nothing ran, so nothing is dumped");
}

#[test]
fn invalid_input_is_reported_before_any_pass_runs() {
    let mut f = fusion();
    let d = f.tensor_by_name("d").unwrap();
    f.tensor_mut(d).name = "a".to_string();
    let mut out = Vec::new();
    let err = manager("rename", options("before:all"))
        .run_with_output(Ir::Fusion(f), &mut out)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "input to pipeline `rename` is invalid: duplicate tensor name `a`"
    );
    assert!(out.is_empty());
}

// ---- The standard registry on a host program ----

/// A host program as `lower-to-host` leaves it: a stream loop without stream assignment.
const HOST: &str = "%HostIrContainer { (T0_g_bf16[6, 2, 4], T1_g_bf16[2, 4]) -> (T2_g_bf16[6, 2]) :
  T2 = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to 3:
    T3_g_bf16[2, 2, 4] = ShardByStream(T0, axis=0, chunks=3, stream_index=i0)
    T4_g_bf16[2, 2] = ALLOCATE(mem_type=global, zero_init=false)
    T4 = linear(T3, T1)
    T5_g_bf16[2, 2] = ShardByStream(T2, axis=0, chunks=3, stream_index=i0)
    Communication 9 (type=Allreduce, team=(0 1), input=T4, output=T5, red_op=sum, backend=NCCL)
    Wait(Communication 9)
} // %HostIrContainer
";

#[test]
fn standard_host_passes_run_verified_and_print_as_host_ir() {
    let registry = Registry::standard();
    let pipeline = Pipeline::parse("assign-streams,allocate-and-deallocate", &registry).unwrap();
    let program = weave_host_ir::parse(HOST).unwrap();
    let mut out = Vec::new();
    let ir = PassManager::new(registry, pipeline)
        .with_options(options("after:all"))
        .run_with_output(Ir::Host(program), &mut out)
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert_eq!(
        headers(&out),
        [
            "// -----// IR Dump After assign-streams (host program) //----- //",
            "// -----// IR Dump After allocate-and-deallocate (host program) //----- //",
        ]
    );
    let Ir::Host(program) = &ir else {
        panic!("expected a host program, got a {}", ir.form());
    };
    let printed = weave_host_ir::print(program);
    assert!(printed.contains("SetCurrentStream"), "{printed}");
    assert!(out.ends_with(&printed), "{out}");
}
