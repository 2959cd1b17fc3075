//! The host passes on hand-written host programs in text form: parse, run one pass, compare
//! the printed result exactly, and check it still verifies.

use weave_host_ir::{parse, print, verify};
use weave_passes::allocate_and_deallocate::AllocateAndDeallocate;
use weave_passes::assign_streams::{AssignStreams, SyncVariant};
use weave_passes::Changed;

fn run_assign(src: &str, variant: SyncVariant) -> String {
    let mut p = parse(src).unwrap();
    assert_eq!(AssignStreams::new(variant).run_on(&mut p), Changed::Yes);
    verify(&p).unwrap();
    // Idempotent: a second run changes nothing.
    assert_eq!(AssignStreams::new(variant).run_on(&mut p), Changed::No);
    print(&p)
}

const BARE_LOOP: &str = "\
%HostIrContainer { (T0_g_f32[8, 4]) -> (T1_g_f32[8, 4]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to 4:
    T2_g_f32[2, 4] = ShardByStream(T0, axis=0, chunks=4, stream_index=i0)
    T3_g_f32[2, 4] = ShardByStream(T1, axis=0, chunks=4, stream_index=i0)
    T3 = matmul(T2, T2)
} // %HostIrContainer
";

/// What both sync variants print first: the captured main stream, then a loop whose
/// iterations switch to their worker stream and wait for main.
macro_rules! worker_entry {
    () => {
        "\
%HostIrContainer { (T0_g_f32[8, 4]) -> (T1_g_f32[8, 4]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  Stream 0 = GetCurrentStream()
  FOR i0 from 0 to 4:
    SetCurrentStream(Stream ( i0 % numberOfStreams ))
    Synchronize(Stream 0)
"
    };
}

/// Both sync variants on [`BARE_LOOP`]: what each prints after the shared worker entry.
#[test]
fn assign_streams_on_a_bare_loop_in_both_variants() {
    let rows: [(&str, SyncVariant, &str); 2] = [
        (
            "inline: the entry wait opens each iteration",
            SyncVariant::Inline,
            "    T2_g_f32[2, 4] = ShardByStream(T0, axis=0, chunks=4, stream_index=i0)
    T3_g_f32[2, 4] = ShardByStream(T1, axis=0, chunks=4, stream_index=i0)
    T3 = matmul(T2, T2)
  SetCurrentStream(Stream 0)
  FOR i1 from 0 to 4:
    Synchronize(Stream ( i1 % numberOfStreams ))
} // %HostIrContainer
",
        ),
        (
            "separate entry loop",
            SyncVariant::SeparateLoop,
            "  FOR i1 from 0 to 4:
    SetCurrentStream(Stream ( i1 % numberOfStreams ))
    T2_g_f32[2, 4] = ShardByStream(T0, axis=0, chunks=4, stream_index=i1)
    T3_g_f32[2, 4] = ShardByStream(T1, axis=0, chunks=4, stream_index=i1)
    T3 = matmul(T2, T2)
  SetCurrentStream(Stream 0)
  FOR i2 from 0 to 4:
    Synchronize(Stream ( i2 % numberOfStreams ))
} // %HostIrContainer
",
        ),
    ];
    for (label, variant, tail) in rows {
        assert_eq!(
            run_assign(BARE_LOOP, variant),
            format!("{}{tail}", worker_entry!()),
            "{label}"
        );
    }
}

#[test]
fn allocate_and_deallocate_around_a_communication_and_its_wait() {
    let src = "\
%HostIrContainer { (T0_g_f32[8, 4]) -> (T1_g_f32[8, 4]) :
  T2_g_f32[8, 4] = matmul(T0, T0)
  Communication 1 (type=Allreduce, team=(0 1), input=T2, output=T1, red_op=sum, backend=NCCL)
  Wait(Communication 1)
} // %HostIrContainer
";
    let mut p = parse(src).unwrap();
    assert_eq!(AllocateAndDeallocate.run_on(&mut p), Changed::Yes);
    verify(&p).unwrap();
    assert_eq!(
        print(&p),
        "\
%HostIrContainer { (T0_g_f32[8, 4]) -> (T1_g_f32[8, 4]) :
  T2_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)
  T2 = matmul(T0, T0)
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  Communication 3 (type=Allreduce, team=(0 1), input=T2, output=T1, red_op=sum, backend=NCCL)
  Wait(Communication 3)
  Deallocate(T2)
} // %HostIrContainer
"
    );
    assert_eq!(AllocateAndDeallocate.run_on(&mut p), Changed::No);
}
