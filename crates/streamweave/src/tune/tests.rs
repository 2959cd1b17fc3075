//! The tuner's tests: candidates, knobs, ties, budgets, pruning and the cache, measured by
//! made-up figures (and the CPU backend).

use super::*;
use crate::executable::Chunks;
use crate::run::{NcclCtaPolicy, RunOptions, Target};
use std::cell::RefCell;

/// `options` without the ring forms: the tests of the grid, the knobs and the choice count
/// the rows of chunk counts (the ring forms have tests of their own).
fn without_rings(options: TuneOptions) -> TuneOptions {
    TuneOptions {
        ring_pieces: Vec::new(),
        ..options
    }
}

/// The row-parallel layer (a GEMM and an allreduce per chunk), small.
const ROW_PARALLEL: &str = "fusion row_parallel_linear(t = 48, h = 8, d = 2, s = 4) {
  mesh m = devices(d)
  tensor inp: bf16[t, 4 * h] on m
  tensor w: bf16[h, 4 * h] on m
  out = linear(inp, w)
  output out
  schedule inp { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
}
";

pub(super) fn fusion(set: &[(&str, i64)]) -> Fusion {
    let set: Vec<(String, i64)> = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    crate::load("row_parallel_linear.weave", ROW_PARALLEL, &set).unwrap()
}

fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x * 1e-3)
}

/// GPU options without pruning.
fn unpruned() -> TuneOptions {
    TuneOptions {
        knobs: false,
        ..without_rings(TuneOptions::new(2, true, "Test GPU", None))
    }
}

/// A deterministic measurement from a table of S, K and replay, recording every call.
struct Fake<F: Fn(&Candidate) -> f64> {
    figure: F,
    calls: RefCell<Vec<Candidate>>,
}

impl<F: Fn(&Candidate) -> f64> Fake<F> {
    fn new(figure: F) -> Self {
        Fake {
            figure,
            calls: RefCell::new(Vec::new()),
        }
    }
}

impl<F: Fn(&Candidate) -> f64> Measure for &Fake<F> {
    fn measure(&mut self, exe: &Executable, c: &Candidate) -> Result<Duration, MeasureError> {
        // The program measured is the one of the candidate's chunk count, or its ring form
        // (from the one-chunk form) in the candidate's pieces.
        let s = exe.signature().params.iter().find(|(k, _)| k == "s");
        let s = s.map(|(_, v)| *v as usize);
        match c.ring {
            Some(k) => {
                assert!(exe.ring_form().is_some(), "{c}");
                assert_eq!(s, Some(1), "{c}");
                assert_eq!(
                    exe.ring_pieces().map(|(_, k)| k as usize),
                    (k > 1).then_some(k)
                );
            }
            None => assert_eq!(s, c.chunks, "{c}"),
        }
        self.calls.borrow_mut().push(*c);
        Ok(ms((self.figure)(c)))
    }
}

pub(super) fn candidate(chunks: usize, streams: usize, replay: bool) -> Candidate {
    Candidate::new(Some(chunks), streams, replay)
}

/// Times that follow the cost model at a contention of 0.8 (on a machine 1.3 times
/// slower than the calibration) give that contention back, it is cached with the
/// winner, and the cache's median is what later calibrations of that machine take.
#[test]
fn a_gpu_tuning_fits_the_contention_it_measured_and_the_cache_keeps_it() {
    let f = fusion(&[]);
    let one = Compiler::new()
        .chunks(Chunks::Fixed(1))
        .compile(&f)
        .unwrap();
    let w = crate::chunks::workload(one.program(), 2).unwrap();
    let truth = Calibration {
        contention: 0.8,
        ..Calibration::default()
    };
    let fake = Fake::new(|c: &Candidate| {
        let s = c.chunks.unwrap_or(1);
        let knob = if c.overlap == Overlap::default() {
            1.0
        } else {
            1.1
        };
        1.3e3 * crate::chunks::predict(&w, &truth, s) * knob
    });
    let t = tune(&f, &unpruned(), &mut &fake).unwrap();
    let fitted = t.contention.unwrap();
    assert!((fitted - 0.8).abs() < 1e-3, "{fitted}\n{t}");
    assert!(
        t.to_string()
            .contains("contention of overlapped GEMMs and collectives, fitted to these runs: 0.80"),
        "{t}"
    );
    // On the CPU nothing is fitted: its ranks are threads, not a GPU's SMs.
    let cpu = without_rings(TuneOptions::new(2, false, "cpu", None));
    assert_eq!(tune(&f, &cpu, &mut &fake).unwrap().contention, None);
    // Cached with the winner, read back as the machine's contention (the median).
    let dir = std::env::temp_dir().join(format!("weave-contention-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("tune.toml");
    let mut cache = TuneCache::default();
    for (i, c) in [0.2, 0.8, 0.5].into_iter().enumerate() {
        let mut e = t.entry().unwrap();
        e.key = format!("k{i}");
        e.contention = Some(c);
        cache.insert(e);
    }
    let mut other = t.entry().unwrap();
    other.key = "elsewhere".into();
    other.gpu = "Other GPU".into();
    other.contention = Some(2.0);
    cache.insert(other);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&path, cache.render()).unwrap();
    assert_eq!(measured_contention(&path, "Test GPU", 2), Some(0.5));
    assert_eq!(measured_contention(&path, "Test GPU", 4), None);
    assert_eq!(measured_contention(&path, "Other GPU", 2), Some(2.0));
    assert_eq!(
        measured_contention(&dir.join("none.toml"), "Test GPU", 2),
        None
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ring_form_is_tried_whole_and_in_pieces_and_its_winner_is_cached() {
    // The ring form in 2 pieces a step is fastest.
    let fake = Fake::new(|c: &Candidate| match c.ring {
        Some(2) => 4.0,
        Some(_) => 6.0,
        None => 10.0 / c.chunks.unwrap_or(1) as f64 + 3.0,
    });
    let options = TuneOptions {
        knobs: false,
        ..TuneOptions::new(2, true, "Test GPU", None)
    };
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    // 4 chunk counts and 3 ring forms, × 3 pool sizes × replay on/off.
    assert_eq!(t.rows.len(), (4 + 3) * 3 * 2, "{t}");
    for k in RING_FORM_PIECES {
        let ring = Candidate::ring(k, 2 * k, 2, true);
        let row = t.rows.iter().find(|r| r.candidate == ring);
        assert!(
            row.is_some_and(|r| r.outcome.time().is_some()),
            "{ring} not measured\n{t}"
        );
    }
    let (best, time) = t.best().unwrap();
    assert_eq!(
        (best.ring, best.chunks, time),
        (Some(2), Some(4), ms(4.0)),
        "{t}"
    );
    assert!(t.to_string().contains("ring:2 S=4 K=2 replay"), "{t}");
    // Cached, read back and compiled again as that ring form.
    let entry = t.entry().unwrap();
    assert_eq!(entry.ring, Some(2));
    let mut cache = TuneCache::default();
    cache.insert(entry);
    let text = cache.render();
    assert!(text.contains("ring = 2"), "{text}");
    let back = TuneCache::parse(&text).unwrap();
    let entry = &back.entries[0];
    assert_eq!(entry.candidate(), best);
    assert!(matches!(entry.compiler_chunks(), Chunks::Ring(2)));
    let exe = Compiler::new()
        .devices(2)
        .chunks(entry.compiler_chunks())
        .compile(&fusion(&[]))
        .unwrap();
    assert_eq!(exe.ring_pieces(), Some((4, 2)));
    // A ring of no pieces is no entry.
    let zero = text.replace("ring = 2", "ring = 0");
    assert!(TuneCache::parse(&zero).is_err(), "{zero}");
    // With the knobs, each ring form is also measured on copy engines, and in slots that hold
    // a piece whole (its transfers are point-to-point: no sum for GEMMs to write into).
    let knobs = TuneOptions::new(2, true, "Test GPU", None);
    let t = tune(&fusion(&[]), &knobs, &mut &fake).unwrap();
    for k in RING_FORM_PIECES {
        for slots in [0, TUNED_CE_SLOT_MIB] {
            assert!(
                t.rows.iter().any(|r| {
                    let c = &r.candidate;
                    c.ring == Some(k)
                        && c.transport == Transport::CopyEngine
                        && c.overlap.ce_slot_mib == slots
                        && !c.overlap.gemm_into_windows
                        && r.outcome.time().is_some()
                }),
                "ring:{k} on copy engines, slots {slots} MiB, not measured\n{t}"
            );
        }
    }
    // One rank has no ring: none is tried.
    let one = TuneOptions {
        knobs: false,
        ..TuneOptions::new(1, true, "Test GPU", None)
    };
    let t = tune(&fusion(&[("d", 1)]), &one, &mut &fake).unwrap();
    assert!(t.rows.iter().all(|r| r.candidate.ring.is_none()), "{t}");
    // A fusion without a collective has no ring form: its ring rows are refused, saying why.
    let local = crate::load(
        "local.weave",
        "fusion local(t = 8, h = 4, d = 2, s = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  y = relu(x)
  output y
  schedule y { outer_split(0, s) -> Stream }
}
",
        &[],
    )
    .unwrap();
    let t = tune(&local, &options, &mut &fake).unwrap();
    let refused: Vec<&Row> = t
        .rows
        .iter()
        .filter(|r| r.candidate.ring.is_some())
        .collect();
    assert_eq!(refused.len(), 3 * 3 * 2, "{t}");
    for r in refused {
        assert!(
            matches!(&r.outcome, Outcome::Refused(m) if m.contains("`local` has no ring form")),
            "{r:?}"
        );
    }
}

#[test]
fn the_fastest_measured_candidate_wins_and_every_candidate_is_recorded() {
    // S = 4 with two streams and replay is fastest.
    let fake = Fake::new(|c: &Candidate| {
        let s = match c.chunks {
            Some(1) => 10.0,
            Some(2) => 7.0,
            Some(4) => 5.0,
            _ => 6.0,
        };
        let k = if c.streams == 2 { 1.0 } else { 1.2 };
        let r = if c.replay { 1.0 } else { 1.1 };
        s * k * r
    });
    let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
    // 4 chunk counts × 3 pool sizes × replay on/off.
    assert_eq!(t.rows.len(), 24);
    assert_eq!(t.best(), Some((candidate(4, 2, true), ms(5.0))));
    // The winner's figure is the least of the measured ones.
    let least = t.rows.iter().filter_map(|r| r.outcome.time()).min();
    assert_eq!(least, Some(ms(5.0)));
    // K > S runs as K = S: not measured, and said so.
    for r in &t.rows {
        let redundant = matches!(r.outcome, Outcome::Redundant(_));
        assert_eq!(
            redundant,
            r.candidate.streams > r.candidate.chunks.unwrap(),
            "{r:?}"
        );
    }
    // Every measured candidate once, then the final round: the three fastest (S = 4 K = 2
    // replayed and eager, then the first of those at 6.0: S = 4 K = 1 replayed) and the
    // simplest (S = 1 K = 1 replayed), three times each, in turn.
    let finalists = [
        candidate(4, 2, true),
        candidate(4, 2, false),
        candidate(4, 1, true),
        candidate(1, 1, true),
    ];
    let calls = fake.calls.borrow();
    let searched = t.rows.iter().filter(|r| r.outcome.time().is_some()).count();
    assert_eq!(
        calls.len(),
        searched + FINAL_ROUNDS * finalists.len(),
        "{t}"
    );
    let mut sorted_finalists = finalists.to_vec();
    sorted_finalists.sort_by_key(|c| c.to_string());
    for round in calls[searched..].chunks(finalists.len()) {
        let mut round = round.to_vec();
        round.sort_by_key(|c| c.to_string());
        assert_eq!(round, sorted_finalists, "{t}");
    }
    let table = t.to_string();
    assert!(table.contains("* S=4 K=2 replay"), "{table}");
    assert!(
        table.contains("5.000 ms (the median of 5.000, 5.000, 5.000, measured again; first 5.000)"),
        "{table}"
    );
    assert!(
        table.contains("S=1 K=2 replay") && table.contains("the same run as K=1"),
        "{table}"
    );
    let entry = t.entry().unwrap();
    assert_eq!(
        (entry.chunks, entry.streams, entry.replay),
        (Some(4), 2, true)
    );
    assert!((entry.median_ms - 5.0).abs() < 1e-9);
}

/// The first-run tuning on GPUs: S in {1, 2, 4, 8} at K = 2 replayed, then every knob
/// once on the fastest candidate and on the fastest chunked one, then the knobs that
/// helped together; the winner carries them and so does its cache entry.
#[test]
fn knobs_are_tried_on_the_best_candidates_and_the_ones_that_help_are_combined() {
    // S = 2 is fastest; ordered compute saves 10% and high priority 5% there, together
    // 15%; a CTA limit costs 20%; nothing else matters.
    let fake = Fake::new(|c: &Candidate| {
        let mut t = match c.chunks {
            Some(1) => 10.0,
            Some(2) => 8.0,
            _ => 9.0,
        };
        if c.overlap.ordered_compute {
            t -= 0.8;
        }
        if c.overlap.pool_priority_high {
            t -= 0.4;
        }
        if c.overlap.nccl_max_ctas.is_some() {
            t *= 1.2;
        }
        t
    });
    // Copy engines are tried by default.
    let options = without_rings(TuneOptions::first_run(
        2,
        "Test GPU",
        None,
        Duration::from_secs(3600),
    ));
    assert!(options.copy_engines);
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    // Without them (`--copy-engines off`) the same tuning measures every candidate but the
    // copy-engine ones, and chooses the same.
    let plain = Fake::new(&fake.figure);
    let without = tune(
        &fusion(&[]),
        &TuneOptions {
            copy_engines: false,
            ..options.clone()
        },
        &mut &plain,
    )
    .unwrap();
    let copy_engine = |c: &Candidate| {
        c.transport == Transport::CopyEngine
            || c.overlap.ce_slot_mib > 0
            || c.overlap.gemm_into_windows
    };
    // The search's measurements (the final round measures some of them again).
    let searched = |t: &Tuning, calls: &[Candidate]| {
        let n = t.rows.iter().filter(|r| r.outcome.time().is_some()).count();
        calls[..n].to_vec()
    };
    let measured_without: Vec<Candidate> = searched(&without, &plain.calls.borrow());
    let expected: Vec<Candidate> = without
        .rows
        .iter()
        .map(|r| r.candidate)
        .filter(|c| !copy_engine(c))
        .collect();
    assert_eq!(measured_without, expected);
    assert!(!measured_without.iter().any(copy_engine), "{without}");
    assert!(t.rows.iter().any(|r| copy_engine(&r.candidate)));
    assert_eq!(without.best(), t.best());
    let (best, time) = t.best().unwrap();
    assert_eq!(best.chunks, Some(2));
    assert_eq!(best.streams, 2);
    assert!(best.replay);
    assert!(best.overlap.ordered_compute && best.overlap.pool_priority_high);
    assert_eq!(best.overlap.nccl_max_ctas, None);
    assert_eq!(best.overlap.gemm_sm_margin, 0);
    assert!((time.as_secs_f64() * 1e3 - 6.8).abs() < 1e-9);
    // The grid is K = 2 (one stream for one chunk), replayed only.
    let grid: Vec<Candidate> = [(1, 1), (2, 2), (4, 2), (8, 2)]
        .map(|(s, k)| candidate(s, k, true))
        .to_vec();
    assert_eq!(
        t.rows[..4].iter().map(|r| r.candidate).collect::<Vec<_>>(),
        grid
    );
    // Every knob of the base was measured once on S = 2 (the fastest, also the fastest
    // chunked): ordered, pool priority, collectives' priority, CTA limit, SM margin, K = 1,
    // copy engines (the
    // allreduce is a sum), the efficiency CTA policy and a symmetric window (the
    // window with the zero-CTA policy sets two knobs); the copy engines were tried eager
    // as well.
    let on_base: Vec<Candidate> = t.rows[4..]
        .iter()
        .map(|r| r.candidate)
        .filter(|c| c.replay && c.chunks == Some(2) && c.knobs() + usize::from(c.streams != 2) == 1)
        .collect();
    assert_eq!(on_base.len(), 9, "{t}");
    // ... and issued statement by statement (the grid is replayed only).
    let eager_base = Candidate {
        replay: false,
        ..candidate(2, 2, true)
    };
    assert!(t.rows.iter().any(|r| r.candidate == eager_base), "{t}");
    assert_eq!(Knob::FlipReplay.apply(eager_base), candidate(2, 2, true));
    assert!(on_base
        .iter()
        .any(|c| c.overlap.nccl_window_mib == TUNED_NCCL_WINDOW_MIB));
    let copy_engine = on_base
        .iter()
        .filter(|c| c.transport == Transport::CopyEngine);
    assert_eq!(copy_engine.count(), 1);
    // The copy engines were tried at every chunk count, right after the grid, on that
    // count's run, and (the allreduce sums) with GEMMs into 32 MiB window slots, each
    // replayed and eager; no other candidate has larger slots.
    let ce: Vec<Candidate> = t.rows[4..20].iter().map(|r| r.candidate).collect();
    let expected: Vec<Candidate> = [(1, 1), (2, 2), (4, 2), (8, 2)]
        .into_iter()
        .flat_map(|(s, k)| {
            let ce = Knob::CopyEngine.apply(candidate(s, k, true));
            let giw = Knob::CeSlots(TUNED_CE_SLOT_MIB).apply(Knob::GemmIntoWindows.apply(ce));
            let eager = |c: Candidate| Candidate { replay: false, ..c };
            [ce, giw, eager(ce), eager(giw)]
        })
        .collect();
    assert_eq!(ce, expected);
    assert!(t
        .rows
        .iter()
        .filter(|r| r.candidate.overlap.ce_slot_mib > 0)
        .all(|r| r.candidate.overlap.gemm_into_windows));
    // No candidate measured twice before the final round, whose figures are the winner's.
    let calls = searched(&t, &fake.calls.borrow());
    let mut unique = calls.clone();
    unique.sort_by_key(|c| format!("{c}"));
    unique.dedup();
    assert_eq!(unique.len(), calls.len());
    let winner = t.rows.iter().find(|r| r.candidate == best).unwrap();
    assert!(
        matches!(&winner.outcome, Outcome::Confirmed { again, .. } if again.len() == FIRST_RUN_FINAL_ROUNDS),
        "{t}"
    );
    // The winner's knobs go into the cache entry and back out of it, through TOML.
    let entry = t.entry().unwrap();
    let mut cache = TuneCache::default();
    cache.insert(entry.clone());
    let back = TuneCache::parse(&cache.render()).unwrap();
    assert_eq!(back.entries[0].candidate(), best);
    let mut run = RunOptions::default();
    entry.apply(&mut run);
    assert_eq!((run.streams, run.gpu.overlap), (2, best.overlap));
    let table = t.to_string();
    assert!(
        table.contains("* S=2 K=2 replay, ordered compute, pool priority high"),
        "{table}"
    );
}

/// Allgathers and sum reductions move data that copy engines can move: the copy-engine
/// transport is a candidate (replayed: windows need no host wait), and so are pool sizes
/// up to the chunk count; a broadcast is NCCL's alone.
#[test]
fn programs_that_gather_try_copy_engines_and_knob_variants_follow_the_base() {
    let base = candidate(4, 2, true);
    let knobs = knob_variants(&base, &["Allgather".to_string()], 4, base.chunks);
    assert!(knobs.contains(&Knob::CopyEngine));
    assert!(knobs.contains(&Knob::Streams(1)) && knobs.contains(&Knob::Streams(4)));
    let ce = Knob::CopyEngine.apply(base);
    assert_eq!((ce.transport, ce.replay), (Transport::CopyEngine, true));
    // Chunks: collectives may be posted at high priority beside the pool's streams.
    assert!(knobs.contains(&Knob::CommPriorityHigh));
    let high = Knob::CommPriorityHigh.apply(base);
    assert!(high.overlap.comm_priority_high && !high.overlap.pool_priority_high);
    assert_eq!(high.knobs(), 1);
    assert_eq!(high.overlap.describe(), "collectives at high priority");
    // ... on NCCL only: a copy-engine base does not try it, and no tuning measures it there
    // (the run would refuse it).
    assert!(
        !knob_variants(&ce, &["Allgather".to_string()], 4, ce.chunks)
            .contains(&Knob::CommPriorityHigh)
    );
    let both = Knob::CommPriorityHigh.apply(ce);
    assert!(both.overlap.check(both.transport).is_err());
    let options = without_rings(TuneOptions::first_run(
        4,
        "Test GPU",
        None,
        Duration::from_secs(60),
    ));
    assert!(options.allows(&high) && !options.allows(&both));
    // One chunk: nothing to order or to prioritize, no other pool; one rank: no NCCL.
    let one = knob_variants(
        &candidate(1, 2, true),
        &["Allreduce".to_string()],
        2,
        Some(1),
    );
    assert_eq!(
        one,
        vec![
            Knob::NcclMaxCtas(16),
            Knob::GemmSmMargin(16),
            Knob::CopyEngine,
            Knob::NcclCtaPolicy(NcclCtaPolicy::Efficiency),
            Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, false),
            Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, true),
        ]
    );
    assert!(knob_variants(
        &candidate(1, 1, true),
        &["Allreduce".to_string()],
        1,
        Some(1)
    )
    .is_empty());
    let broadcast = knob_variants(
        &candidate(2, 2, true),
        &["Broadcast".to_string()],
        2,
        Some(2),
    );
    assert!(!broadcast.contains(&Knob::CopyEngine));
    // A window stages allgathers, allreduces and reduce-scatters only.
    assert!(!broadcast
        .iter()
        .any(|k| matches!(k, Knob::NcclWindow(..) | Knob::NcclCtaPolicy(_))));
    let zero = Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, true).apply(base);
    assert_eq!(
        (zero.overlap.nccl_window_mib, zero.overlap.nccl_cta_policy),
        (256, Some(NcclCtaPolicy::Zero))
    );
    assert_eq!(zero.knobs(), 2);
    assert_eq!(
        zero.overlap.describe(),
        "NCCL CTA policy zero, NCCL window 256 MiB"
    );
}

/// The copy engines' best chunk count is not NCCL's: they are measured at every chunk
/// count, and where they win, larger window slots are tried on them.
#[test]
fn copy_engines_are_tried_at_every_chunk_count_and_their_slots_on_a_winner() {
    // NCCL is fastest at S = 2; copy engines lose there but win at S = 4, and their
    // 32 MiB slots save 5% more.
    let fake = Fake::new(|c: &Candidate| {
        let ce = c.transport == Transport::CopyEngine;
        let mut t = match (c.chunks, ce) {
            (Some(1), _) => 10.0,
            (Some(2), false) => 8.0,
            (Some(2), true) => 8.4,
            (Some(4), false) => 8.8,
            (Some(4), true) => 7.0,
            _ => 9.5,
        };
        if ce && c.overlap.ce_slot_mib == TUNED_CE_SLOT_MIB {
            t *= 0.95;
        }
        t
    });
    let options = without_rings(TuneOptions::first_run(
        4,
        "Test GPU",
        None,
        Duration::from_secs(3600),
    ));
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    let (best, time) = t.best().unwrap();
    assert_eq!(
        (best.chunks, best.transport, best.overlap.ce_slot_mib),
        (Some(4), Transport::CopyEngine, TUNED_CE_SLOT_MIB),
        "{t}"
    );
    assert!((time.as_secs_f64() * 1e3 - 6.65).abs() < 1e-9);
    // The slot knob is tried only on copy-engine bases, and survives the cache.
    assert!(t
        .rows
        .iter()
        .filter(|r| r.candidate.overlap.ce_slot_mib > 0)
        .all(|r| r.candidate.transport == Transport::CopyEngine));
    let entry = t.entry().unwrap();
    let mut cache = TuneCache::default();
    cache.insert(entry);
    let back = TuneCache::parse(&cache.render()).unwrap();
    assert_eq!(back.entries[0].candidate(), best);
    assert!(t.to_string().contains("copy-engine slots of 32 MiB"), "{t}");
    assert!(!knob_variants(
        &candidate(4, 2, true),
        &["Allreduce".to_string()],
        4,
        Some(4)
    )
    .contains(&Knob::CeSlots(TUNED_CE_SLOT_MIB)));
    // GEMMs into 32 MiB slots were tried at every chunk count (the winner has them: they
    // cost nothing here, and the slots save 5%).
    for (s, k) in [(1, 1), (2, 2), (4, 2), (8, 2)] {
        let giw = Knob::CeSlots(TUNED_CE_SLOT_MIB)
            .apply(Knob::GemmIntoWindows.apply(Knob::CopyEngine.apply(candidate(s, k, true))));
        assert!(t.rows.iter().any(|r| r.candidate == giw), "S={s}: {t}");
        // And each copy-engine candidate issued eager too.
        for c in [giw, Knob::CopyEngine.apply(candidate(s, k, true))] {
            let eager = Candidate { replay: false, ..c };
            assert!(
                t.rows.iter().any(|r| r.candidate == eager),
                "S={s} eager: {t}"
            );
        }
    }
    assert!(best.overlap.gemm_into_windows);
    // They are a knob of copy-engine bases whose program sums: not of NCCL ones, not of
    // gathers.
    let ce = Knob::CopyEngine.apply(candidate(2, 2, true));
    for (comms, base, offered) in [
        ("ReduceScatter", ce, true),
        ("Allreduce", ce, true),
        ("Allgather", ce, false),
        ("Allreduce", candidate(2, 2, true), false),
    ] {
        assert_eq!(
            knob_variants(&base, &[comms.to_string()], 4, base.chunks)
                .contains(&Knob::GemmIntoWindows),
            offered,
            "{comms} on {base}"
        );
    }
    let on = Knob::GemmIntoWindows.apply(ce);
    assert_eq!(on.overlap.describe(), "GEMMs into windows");
    assert_eq!(on.knobs(), 2);
}

/// Where copy engines issued eager beat every replayed candidate, the first run's tuning
/// finds them and keeps them eager; NCCL is never tried eager there (its grid is replayed).
#[test]
fn copy_engines_issued_eager_win_where_they_are_fastest() {
    let fake = Fake::new(|c: &Candidate| {
        let ce = c.transport == Transport::CopyEngine;
        let base = match c.chunks {
            Some(1) => 10.0,
            Some(2) => 9.0,
            _ => 9.5,
        };
        match (ce, c.replay) {
            (true, false) => base * 0.8,
            (true, true) => base * 1.1,
            _ => base,
        }
    });
    let options = without_rings(TuneOptions::first_run(
        4,
        "Test GPU",
        None,
        Duration::from_secs(3600),
    ));
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    let (best, _) = t.best().unwrap();
    assert_eq!(
        (best.chunks, best.transport, best.replay),
        (Some(2), Transport::CopyEngine, false),
        "{t}"
    );
    assert!(t
        .rows
        .iter()
        .filter(|r| !r.candidate.replay)
        .all(|r| r.candidate.transport == Transport::CopyEngine));
    // `weave tune`'s grid has eager runs too: where NCCL runs fastest eager, the copy
    // engines are tried eager on that base and replayed as well.
    let eager_nccl = Fake::new(|c: &Candidate| {
        let t = if c.replay { 10.0 } else { 9.0 };
        if c.transport == Transport::CopyEngine {
            t * 1.1
        } else {
            t
        }
    });
    let full = without_rings(TuneOptions::new(4, true, "Test GPU", None));
    let t = tune(&fusion(&[]), &full, &mut &eager_nccl).unwrap();
    let ce: Vec<Candidate> = t
        .rows
        .iter()
        .map(|r| r.candidate)
        .filter(|c| c.transport == Transport::CopyEngine && c.knobs() == 1)
        .collect();
    assert!(ce.iter().any(|c| !c.replay), "{t}");
    for c in &ce {
        let twin = Candidate {
            replay: !c.replay,
            ..*c
        };
        assert!(ce.contains(&twin), "{c} without {twin}: {t}");
    }
}

/// A session's tuning measures only what a session can switch to between calls (eager,
/// NCCL, the backend's own knobs), even where the others would be faster, caches its winner
/// under a key of its own, and refuses to try replay.
#[test]
fn a_session_tuning_measures_only_what_a_session_can_switch_to() {
    // Copy engines, CTA limits and windows would win by far; ordered compute helps a little.
    let fake = Fake::new(|c: &Candidate| {
        let o = &c.overlap;
        if c.transport == Transport::CopyEngine || o.needs_own_communicators() || c.replay {
            return 1.0;
        }
        let t = match c.chunks {
            Some(1) => 10.0,
            Some(2) => 8.0,
            _ => 9.0,
        };
        if o.ordered_compute {
            t * 0.9
        } else {
            t
        }
    });
    let options = without_rings(TuneOptions::first_run(
        4,
        "Test GPU",
        None,
        Duration::from_secs(3600),
    ))
    .in_session();
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    let measured = fake.calls.borrow().clone();
    assert!(!measured.is_empty());
    for c in &measured {
        assert!(Scope::Session.admits(c), "{c} was measured: {t}");
    }
    // The full tuning of the same program measures all of them.
    let any = Fake::new(|_: &Candidate| 5.0);
    tune(
        &fusion(&[]),
        &without_rings(TuneOptions::first_run(
            4,
            "Test GPU",
            None,
            Duration::from_secs(3600),
        )),
        &mut &any,
    )
    .unwrap();
    assert!(any.calls.borrow().iter().any(|c| !Scope::Session.admits(c)));
    let (best, time) = t.best().unwrap();
    assert_eq!(
        (
            best.chunks,
            best.replay,
            best.transport,
            best.overlap.ordered_compute
        ),
        (Some(2), false, Transport::Nccl, true),
        "{t}"
    );
    assert!((time.as_secs_f64() * 1e3 - 7.2).abs() < 1e-9);
    assert_eq!(t.key.backend, "cuda-session");
    let run_key = TuneKey::of(&fusion(&[]), 4, "cuda", "Test GPU");
    assert_ne!(t.key.id, run_key.id);
    for c in [
        candidate(2, 2, true),
        Knob::CopyEngine.apply(candidate(2, 2, false)),
        Knob::NcclMaxCtas(16).apply(candidate(2, 2, false)),
        Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, false).apply(candidate(2, 2, false)),
        Knob::CeSlots(TUNED_CE_SLOT_MIB).apply(candidate(2, 2, false)),
    ] {
        assert!(!Scope::Session.admits(&c), "{c}");
        assert!(Scope::Any.admits(&c), "{c}");
    }
    let replaying = TuneOptions {
        replays: vec![true, false],
        ..options
    };
    let e = tune(&fusion(&[]), &replaying, &mut &fake).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a session issues statement by statement: its tuning cannot try graph replay"
    );
}

/// A spent budget stops the measuring: S = 1 is always measured first (the budget
/// counts from before compiling, and a tuning needs one figure), and everything left is
/// recorded as over the budget, never silently dropped.
#[test]
fn a_spent_budget_leaves_the_remaining_candidates_unmeasured_and_says_so() {
    let fake = Fake::new(|_: &Candidate| {
        std::thread::sleep(Duration::from_millis(30));
        5.0
    });
    let options = without_rings(TuneOptions::first_run(
        2,
        "Test GPU",
        None,
        Duration::from_millis(1),
    ));
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    let measured = t.rows.iter().filter(|r| r.outcome.time().is_some()).count();
    assert_eq!(measured, 1, "{t}");
    assert_eq!(t.rows[0].candidate, candidate(1, 1, true));
    assert!(t.rows[0].outcome.time().is_some());
    let over = t
        .rows
        .iter()
        .filter(|r| r.outcome == Outcome::OverBudget)
        .count();
    assert_eq!(over + measured, t.rows.len(), "{t}");
    assert!(t.to_string().contains("skipped: over the tuning budget"));
}

/// A stream loop that only launches kernels on small chunks runs once whatever S asks:
/// every chunk count compiles to the one-chunk program, which has no loop, so one pool size and both
/// replay modes of S = 1 are all that is measured.
#[test]
fn chunk_counts_with_the_same_host_program_and_pools_without_a_loop_are_measured_once() {
    let source = "fusion add(t = 64, h = 8, s = 1) {
  tensor a: f32[t, h]
  tensor b: f32[t, h]
  out = add(a, b)
  output out
  schedule out { outer_split(0, s) -> Stream }
}
";
    let fusion = crate::load("add.weave", source, &[]).unwrap();
    let fake = Fake::new(|_: &Candidate| 1.0);
    let options = without_rings(TuneOptions::new(1, true, "Test GPU", None));
    let t = tune(&fusion, &options, &mut &fake).unwrap();
    // Both measured, then both again in each round of the final (the two fastest).
    let both = [candidate(1, 1, true), candidate(1, 1, false)];
    assert_eq!(*fake.calls.borrow(), both.repeat(1 + FINAL_ROUNDS), "{t}");
    for row in &t.rows {
        let Outcome::Redundant(why) = &row.outcome else {
            assert_eq!(row.candidate.chunks, Some(1), "{t}");
            assert_eq!(row.candidate.streams, 1, "{t}");
            continue;
        };
        let expected = if row.candidate.chunks == Some(1) {
            "no stream loop: the pool is never used, the same run as K=1"
        } else {
            "the same host program as S=1: the same run"
        };
        assert_eq!(why, expected, "{}", row.candidate);
    }
    assert_eq!(t.best(), Some((candidate(1, 1, true), ms(1.0))));
}

#[test]
fn ties_within_two_percent_go_to_fewer_chunks_then_fewer_streams_then_replay() {
    // S = 4 is 1.5% faster than S = 2: a tie, the fewer chunks win.
    let fake = Fake::new(|c: &Candidate| match c.chunks {
        Some(2) => 5.0,
        Some(4) => 4.925,
        _ => 9.0,
    });
    let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
    assert_eq!(t.best(), Some((candidate(2, 1, true), ms(5.0))));
    // 3% faster is no tie.
    let fake = Fake::new(|c: &Candidate| match c.chunks {
        Some(2) => 5.0,
        Some(4) => 4.85,
        _ => 9.0,
    });
    let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
    assert_eq!(t.best().unwrap().0.chunks, Some(4));
    // Among equal chunk counts, fewer streams; then replay over eager.
    let fake = Fake::new(|c: &Candidate| match (c.chunks, c.streams, c.replay) {
        (Some(4), 4, false) => 3.0,
        (Some(4), 2, false) => 3.05,
        (Some(4), 2, true) => 3.05,
        _ => 9.0,
    });
    let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
    assert_eq!(t.best(), Some((candidate(4, 2, true), ms(3.05))));
}

#[test]
fn the_cost_model_prunes_chunk_counts_it_predicts_much_slower_and_never_one() {
    // At t = 48, h = 8 every collective's fixed cost dominates: the model predicts every
    // chunked schedule at least 1.5x one chunk.
    let options = TuneOptions {
        calibration: Some(Calibration::default()),
        ..unpruned()
    };
    let fake = Fake::new(|c: &Candidate| c.chunks.unwrap() as f64);
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    for r in &t.rows {
        match r.candidate.chunks {
            Some(1) => assert!(
                r.outcome.time().is_some() || matches!(r.outcome, Outcome::Redundant(_)),
                "{r:?}"
            ),
            _ => match &r.outcome {
                Outcome::Pruned { ratio, best } => {
                    assert!(*ratio >= 1.5, "{r:?}");
                    assert_eq!(*best, 1);
                }
                other => panic!("{}: {other:?}", r.candidate),
            },
        }
    }
    assert!(fake.calls.borrow().iter().all(|c| c.chunks == Some(1)));
    assert!(
        t.to_string().contains("skipped: the cost model predicts"),
        "{t}"
    );
    // A factor no prediction reaches prunes nothing.
    let options = TuneOptions {
        prune_factor: 1e9,
        ..options
    };
    let t = tune(&fusion(&[]), &options, &mut &Fake::new(|_: &Candidate| 1.0)).unwrap();
    assert!(!t
        .rows
        .iter()
        .any(|r| matches!(r.outcome, Outcome::Pruned { .. })));
}

#[test]
fn refused_and_failed_candidates_are_recorded_with_their_message() {
    // More chunks than a stream loop may run: the compiler refuses.
    let options = TuneOptions {
        chunk_counts: vec![1, 2, 1 << 17],
        stream_counts: vec![1],
        ..unpruned()
    };
    let t = tune(
        &fusion(&[]),
        &options,
        &mut |_: &Executable, c: &Candidate| {
            if c.replay {
                Err("out of memory".to_string())
            } else {
                Ok(ms(c.chunks.unwrap() as f64))
            }
        },
    )
    .unwrap();
    let refused: Vec<&Row> = t
        .rows
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Refused(_)))
        .collect();
    assert_eq!(refused.len(), 2, "{t}");
    for r in refused {
        assert_eq!(r.candidate.chunks, Some(1 << 17));
        assert!(r.outcome.to_string().contains("stream chunks"), "{r:?}");
    }
    let failed = t
        .rows
        .iter()
        .filter(|r| r.outcome == Outcome::Failed("out of memory".into()))
        .count();
    assert_eq!(failed, 2, "{t}");
    assert_eq!(t.best(), Some((candidate(1, 1, false), ms(1.0))));
    // Nothing measured: no winner, nothing to cache.
    let t = tune(&fusion(&[]), &options, &mut |_: &Executable,
                                               _: &Candidate|
     -> Result<
        Duration,
        String,
    > { Err("no GPU".into()) })
    .unwrap();
    assert_eq!(t.winner, None);
    assert_eq!(t.entry(), None);
    // A rank count the program's meshes cannot take is refused for every candidate.
    let t = tune(
        &fusion(&[("d", 2)]),
        &without_rings(TuneOptions::new(3, false, "cpu", None)),
        &mut |_: &Executable, _: &Candidate| Ok(ms(1.0)),
    )
    .unwrap();
    assert!(t
        .rows
        .iter()
        .all(|r| matches!(r.outcome, Outcome::Refused(_))));
}

#[test]
fn the_cache_round_trips_keeps_other_entries_and_replaces_its_own() {
    let dir = std::env::temp_dir().join(format!("weave-tune-{}", std::process::id()));
    let path = dir.join("sub/tune.toml");
    let _ = std::fs::remove_dir_all(&dir);
    let fake = Fake::new(|c: &Candidate| c.chunks.unwrap() as f64 + c.streams as f64);
    let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
    assert_eq!(lookup(&path, &t.key).unwrap(), None);
    let stored = store(&path, &t).unwrap().unwrap();
    assert_eq!(lookup(&path, &t.key).unwrap(), Some(stored.clone()));
    assert_eq!(stored.candidate(), candidate(1, 1, true));
    let mut options = RunOptions {
        streams: 4,
        ..RunOptions::default()
    };
    stored.apply(&mut options);
    assert_eq!((options.streams, options.gpu.replay), (1, true));
    let eager = Entry {
        replay: false,
        ..stored.clone()
    };
    eager.apply(&mut options);
    assert!(!options.gpu.replay);
    // Collectives at high priority are kept, applied, and written only when on.
    let high = Entry {
        comm_priority_high: true,
        ..stored.clone()
    };
    high.apply(&mut options);
    assert!(options.gpu.overlap.comm_priority_high);
    let one = |e: &Entry| TuneCache {
        entries: vec![e.clone()],
    };
    assert!(one(&high).render().contains("comm_priority_high = true"));
    assert!(!one(&stored).render().contains("comm_priority_high"));
    assert_eq!(TuneCache::parse(&one(&high).render()).unwrap(), one(&high));
    // Another program's entry joins it; tuning the first again replaces its entry.
    let other = tune(&fusion(&[("t", 96)]), &unpruned(), &mut &fake).unwrap();
    store(&path, &other).unwrap();
    let fake = Fake::new(|c: &Candidate| 10.0 - c.chunks.unwrap() as f64);
    let again = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
    store(&path, &again).unwrap();
    let cache = TuneCache::load(&path).unwrap();
    assert_eq!(cache.entries.len(), 2, "{}", cache.render());
    assert_eq!(cache.get(&t.key).unwrap().chunks, Some(8));
    assert_eq!(cache.get(&other.key).unwrap().chunks, Some(1));
    assert_eq!(TuneCache::parse(&cache.render()).unwrap(), cache);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("tune.toml")]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runs_on_cpu_ranks_measure_and_choose() {
    let options = TuneOptions {
        chunk_counts: vec![1, 2],
        stream_counts: vec![1, 2],
        ..without_rings(TuneOptions::new(2, false, "cpu", None))
    };
    let mut measure = RunMeasure::new(Target::Cpu { ranks: 2 }, 1, 2, Duration::from_secs(30));
    let t = tune(&fusion(&[]), &options, &mut measure).unwrap();
    // S ∈ {1, 2} × K ∈ {1, 2}, eager only; K = 2 for one chunk is redundant. (The fastest
    // may have been measured twice: its figure is then the mean.)
    assert_eq!(t.rows.len(), 4, "{t}");
    assert_eq!(
        t.rows.iter().filter(|r| r.outcome.time().is_some()).count(),
        3,
        "{t}"
    );
    assert!(t.rows.iter().all(|r| !r.candidate.replay));
    let (_, best) = t.best().unwrap();
    let least = t
        .rows
        .iter()
        .filter_map(|r| r.outcome.time())
        .min()
        .unwrap();
    assert!(best.as_secs_f64() <= least.as_secs_f64() * (1.0 + TIE_MARGIN));
}

/// The final round measures the three fastest candidates, the one the search would choose and
/// the simplest again, in turn, and chooses among them by these fresh figures alone: a lucky
/// first figure loses to a steady one, a candidate that measured faster than S = 1 once and
/// slower in every fresh run loses to S = 1 (the winner's curse of a search over many noisy
/// figures), a candidate that fails when measured again cannot win, and without final rounds
/// the search's figures choose.
#[test]
fn the_final_round_chooses_by_fresh_figures_alone() {
    use std::cell::Cell;
    use std::collections::HashMap;
    let options = unpruned();
    // S = 2 K = 2 replayed measures 0.90 ms first and 1.20 after; every S = 4 candidate
    // 0.93 each time; the rest far behind.
    let lucky = Cell::new(0usize);
    let fake = Fake::new(|c: &Candidate| match (c.chunks, c.streams, c.replay) {
        (Some(2), 2, true) => {
            lucky.set(lucky.get() + 1);
            if lucky.get() == 1 {
                0.90
            } else {
                1.20
            }
        }
        (Some(4), _, _) => 0.93,
        _ => 3.0,
    });
    let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
    let (best, time) = t.best().unwrap();
    // The S = 4 candidates tie; the simplest wins, by its fresh figures.
    assert_eq!(best, candidate(4, 1, true), "{t}");
    assert_eq!(time, ms(0.93), "{t}");
    let confirmed: Vec<Candidate> = t
        .rows
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Confirmed { .. }))
        .map(|r| r.candidate)
        .collect();
    assert_eq!(
        confirmed,
        [
            candidate(1, 1, true),
            candidate(2, 2, true),
            candidate(4, 1, true),
            candidate(4, 1, false)
        ],
        "{t}"
    );
    // The lucky one ranks by 1.20 (its three fresh figures), not by its first 0.90.
    let lucky_row = t.rows.iter().find(|r| r.candidate == candidate(2, 2, true));
    assert_eq!(lucky_row.unwrap().outcome.time(), Some(ms(1.2)), "{t}");
    assert!(
        t.to_string()
            .contains("1.200 ms (the median of 1.200, 1.200, 1.200, measured again; first 0.900)"),
        "{t}"
    );

    // The winner's curse: each candidate's figures wander by up to ±4% around its truth,
    // S = 1 at 1.00 ms, the copy engines at 1.03, every chunked count at 1.10. The search
    // meets the copy engines at their luckiest (0.99, 4% below S = 1's first 1.03); fresh
    // figures put them back behind S = 1, which wins.
    let seen: RefCell<HashMap<String, usize>> = RefCell::new(HashMap::new());
    let wander = Fake::new(|c: &Candidate| {
        let mut seen = seen.borrow_mut();
        let n = seen.entry(c.to_string()).or_insert(0);
        *n += 1;
        let (truth, first) = match (c.chunks, c.transport) {
            (Some(1), Transport::CopyEngine) => (1.03, 0.99),
            (Some(1), _) => (1.00, 1.03),
            _ => (1.10, 1.10),
        };
        let wobble = [0.0, 0.01, -0.01][*n % 3];
        if *n == 1 {
            first
        } else {
            truth + wobble
        }
    });
    let first_run = without_rings(TuneOptions::first_run(
        2,
        "Test GPU",
        None,
        Duration::from_secs(3600),
    ));
    let knobs = TuneOptions {
        final_rounds_up_to: FINAL_ROUNDS,
        ..first_run.clone()
    };
    let t = tune(&fusion(&[]), &knobs, &mut &wander).unwrap();
    assert_eq!(t.best().unwrap().0, candidate(1, 1, true), "{t}");
    assert_eq!(t.best().unwrap().1, ms(1.0), "{t}");
    // A first run's final round goes on while less than half its budget is spent: here, far
    // less, so every finalist is measured again the most times.
    seen.borrow_mut().clear();
    let t = tune(&fusion(&[]), &first_run, &mut &wander).unwrap();
    assert_eq!(t.best().unwrap().0, candidate(1, 1, true), "{t}");
    let again: Vec<usize> = t
        .rows
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Confirmed { again, .. } => Some(again.len()),
            _ => None,
        })
        .collect();
    assert!(again.len() >= 2, "{t}");
    assert!(again.iter().all(|&n| n == FIRST_RUN_FINAL_ROUNDS), "{t}");
    // Without a budget (`weave tune`), the final round stays at its rounds.
    assert_eq!(
        TuneOptions::new(2, true, "Test GPU", None).final_rounds_up_to,
        FINAL_ROUNDS
    );
    seen.borrow_mut().clear();
    tune(&fusion(&[]), &knobs, &mut &wander).unwrap();
    // Without the final round, the search's lucky figure would have won.
    let seen_before = seen.borrow().len();
    seen.borrow_mut().clear();
    let no_final = TuneOptions {
        final_rounds: 0,
        ..knobs
    };
    let t = tune(&fusion(&[]), &no_final, &mut &wander).unwrap();
    assert_eq!(t.best().unwrap().0.transport, Transport::CopyEngine, "{t}");
    assert!(t
        .rows
        .iter()
        .all(|r| !matches!(r.outcome, Outcome::Confirmed { .. })));
    assert_eq!(seen.borrow().len(), seen_before, "{t}");

    // A fastest candidate that fails when measured again is recorded so and cannot win.
    let runs = Cell::new(0usize);
    let mut flaky = |_: &Executable, c: &Candidate| -> Result<Duration, String> {
        match (c.chunks, c.streams, c.replay) {
            (Some(2), 2, true) if runs.replace(runs.get() + 1) >= 1 => {
                Err("an illegal memory access".into())
            }
            (Some(2), 2, true) => Ok(ms(0.90)),
            (Some(4), _, _) => Ok(ms(0.93)),
            _ => Ok(ms(3.0)),
        }
    };
    let t = tune(&fusion(&[]), &options, &mut flaky).unwrap();
    assert_eq!(t.best().unwrap().0, candidate(4, 1, true), "{t}");
    assert!(
        t.rows.iter().any(|r| matches!(&r.outcome,
            Outcome::Failed(m) if m == "measured at 0.900 ms, then failed when measured again: an illegal memory access")),
        "{t}"
    );
}

/// A fusion without a chunk-count parameter whose loops have chunks as written (the MLP block
/// as two P2P rings, one chunk per device): `loop_chunks` reads them from the program, and the
/// knobs of a chunked base follow (ordered compute, priorities, the other replay setting,
/// pool sizes up to that count); a program without a stream loop has none.
#[test]
fn a_ring_programs_loops_give_its_knobs_their_chunk_count() {
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/sequence_parallel_mlp_ring.weave"
    ))
    .unwrap();
    let ov = [("d".to_string(), 4), ("t".to_string(), 48)];
    let f = crate::load("ring.weave", &source, &ov).unwrap();
    let exe = Compiler::new().compile(&f).unwrap();
    assert_eq!(loop_chunks(exe.program()), Some(4));
    let base = Candidate::new(None, 2, true);
    let comms = ["P2P".to_string()];
    let knobs = knob_variants(&base, &comms, 4, loop_chunks(exe.program()));
    for k in [
        Knob::OrderedCompute,
        Knob::PoolPriorityHigh,
        Knob::CommPriorityHigh,
        Knob::FlipReplay,
        Knob::Streams(1),
        Knob::Streams(4),
        Knob::CopyEngine,
    ] {
        assert!(knobs.contains(&k), "{k:?} not in {knobs:?}");
    }
    let unchunked = knob_variants(&base, &comms, 4, None);
    assert!(!unchunked.contains(&Knob::OrderedCompute) && !unchunked.contains(&Knob::Streams(1)));
    // No stream loop: no chunks as written.
    let plain = crate::load(
        "plain.weave",
        "fusion plain(n = 8) {\n  tensor a: f32[n, n]\n  b = relu(a)\n  output b\n}\n",
        &[],
    )
    .unwrap();
    let exe = Compiler::new().compile(&plain).unwrap();
    assert_eq!(loop_chunks(exe.program()), None);
}

/// The tuning tries only chunk counts that keep the caller's data: the weight gradients of
/// `s` micro-batches (`x: f32[s, n, h]`, each a stream chunk) have one chunk count, their
/// own, where a runner choosing `s` would run other data; rows that chunks only regroup
/// (`a: f32[s, t / s, h]`) get every chunk count that divides them.
#[test]
fn only_chunk_counts_that_keep_the_data_are_tried() {
    let grads = crate::load(
        "mlp_backward_weight_grads.weave",
        include_str!("../../../../tests/scenarios/mlp_backward_weight_grads.weave"),
        &[],
    )
    .unwrap();
    let fake = Fake::new(|_: &Candidate| 1.0);
    let t = tune(&grads, &unpruned(), &mut &fake).unwrap();
    let chunks: std::collections::BTreeSet<Option<usize>> =
        t.rows.iter().map(|r| r.candidate.chunks).collect();
    assert_eq!(chunks, [Some(2)].into(), "{t}");
    let regrouped = "fusion rows(t = 24, h = 8, s = 2) {
  tensor a: f32[s, t / s, h]
  out = neg(a)
  output out
  schedule out { parallelize(0, Stream) }
}
";
    let fusion = crate::load("rows.weave", regrouped, &[]).unwrap();
    let fake = Fake::new(|_: &Candidate| 1.0);
    let t = tune(&fusion, &unpruned(), &mut &fake).unwrap();
    let chunks: std::collections::BTreeSet<Option<usize>> =
        t.rows.iter().map(|r| r.candidate.chunks).collect();
    // 24 rows: the candidates that divide them (8 chunks of 3 rows), not those that would
    // drop rows (16 chunks of 1 row: 16 of the 24).
    let expected: std::collections::BTreeSet<Option<usize>> = unpruned()
        .chunk_counts
        .iter()
        .chain(&[1])
        .filter(|&&n| 24 % n == 0)
        .map(|&n| Some(n))
        .collect();
    assert!(expected.len() >= 3, "{expected:?}");
    assert_eq!(chunks, expected, "{t}");
}

/// A fusion without a chunk-count parameter whose Stream axes carry a ring
/// (`matmul_rs_ring`): the tuning measures its S = 1 first (the Stream axes run serially: one
/// GEMM and a ReduceScatter) and then the ring as written, tries the knobs on the ring, and
/// runs whichever is faster.
#[test]
fn a_ring_program_is_also_measured_as_its_collective_and_runs_it_where_faster() {
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/matmul_rs_ring.weave"
    ))
    .unwrap();
    let ov = [
        ("d".to_string(), 2),
        ("t".to_string(), 16),
        ("h".to_string(), 8),
    ];
    let f = crate::load("ring.weave", &source, &ov).unwrap();
    let options = without_rings(TuneOptions::first_run(
        2,
        "Test GPU",
        None,
        Duration::from_secs(3600),
    ));
    for (serial_ms, ring_ms) in [(1.0, 1.1), (1.1, 1.0)] {
        let mut measure = |exe: &Executable, c: &Candidate| -> Result<Duration, String> {
            let serial = loop_chunks(exe.program()).is_none();
            assert_eq!(serial, c.chunks == Some(1), "{c}");
            if serial {
                assert!(!weave_host_ir::print(exe.program()).contains("P2PCommunication"));
            }
            Ok(ms(if serial { serial_ms } else { ring_ms }))
        };
        let t = tune(&f, &options, &mut measure).unwrap();
        assert_eq!(t.rows[0].candidate, Candidate::new(Some(1), 1, true), "{t}");
        assert_eq!(t.rows[1].candidate, Candidate::new(None, 2, true), "{t}");
        assert!(
            t.rows
                .iter()
                .any(|r| r.candidate.chunks.is_none() && r.candidate.overlap.ordered_compute),
            "{t}"
        );
        let best = t.best().unwrap().0;
        assert_eq!(best.chunks == Some(1), serial_ms < ring_ms, "{t}");
        // The cached winner compiles back to the program it measured.
        let exe = Compiler::new()
            .devices(2)
            .chunks(t.entry().unwrap().compiler_chunks())
            .compile(&f)
            .unwrap();
        assert_eq!(loop_chunks(exe.program()).is_none(), serial_ms < ring_ms);
    }
}

/// A first run's tuning bounds a candidate's waits by the timeout and half the budget (5 s at
/// least), and its runs by the budget (twice the wait at least).
#[test]
fn candidate_bounds_follow_the_budget_and_the_timeout() {
    let s = Duration::from_secs;
    for (budget, timeout, wait, limit) in [
        (60, 60, 30, 60),
        (60, 10, 10, 60),
        (4, 60, 5, 10),
        (600, 60, 60, 600),
        (1, 1, 1, 2),
    ] {
        assert_eq!(
            candidate_bounds(s(budget), s(timeout)),
            (s(wait), s(limit)),
            "budget {budget} s, timeout {timeout} s"
        );
    }
    assert_eq!(
        candidate_bounds(Duration::MAX, Duration::MAX),
        (Duration::MAX / 2, Duration::MAX)
    );
}
