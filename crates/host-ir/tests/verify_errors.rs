//! The verifier's rules, one hand-written program per violation, each with the exact
//! message: the statement as printed, the loops around it, and what is wrong.

use weave_host_ir::{parse, print, verify};

/// `T0_g_f32[8, 4]` and `T1_g_f32[4, 4]` in, `T2_g_f32[8, 4]` (allocated on line 2) out;
/// `body` follows, indented by two spaces per level.
fn program(body: &str) -> String {
    format!(
        "%HostIrContainer {{ (T0_g_f32[8, 4], T1_g_f32[4, 4]) -> (T2_g_f32[8, 4]) :\n  \
         T2 = ALLOCATE(mem_type=global, zero_init=false)\n{body}}} // %HostIrContainer\n"
    )
}

/// Parses `src` (which must parse) and returns the verifier's message (which must exist).
fn violation(src: &str) -> String {
    let p = parse(src).unwrap_or_else(|e| panic!("{}", e.render("test.hir", src)));
    match verify(&p) {
        Ok(()) => panic!("expected a violation in:\n{}", print(&p)),
        Err(e) => {
            assert!(e.span.is_none());
            e.message
        }
    }
}

fn valid(src: &str) {
    let p = parse(src).unwrap_or_else(|e| panic!("{}", e.render("test.hir", src)));
    if let Err(e) = verify(&p) {
        panic!("{}\nin:\n{}", e.message, print(&p));
    }
}

// ----- definitions -------------------------------------------------------------------------

#[test]
fn a_read_needs_a_dominating_write() {
    let src = program(
        "  T3_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)\n  \
         T2 = matmul(T4_g_f32[8, 4], T1)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `T2 = matmul(T4, T1)`: reads T4 before it is written"
    );
}

#[test]
fn a_definition_in_a_loop_body_does_not_reach_past_the_loop() {
    let src = program(
        "  FOR i0 from 0 to 2:\n    \
         T3_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)\n  \
         T2 = linear(T3, T1)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `T2 = linear(T3, T1)`: reads T3, which is defined only inside FOR i0 (a \
         definition in a loop body does not reach past the loop)"
    );
}

#[test]
fn a_read_after_deallocate_and_a_view_of_a_freed_buffer() {
    let src = program(
        "  T3_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)\n  \
         Deallocate(T3)\n  T2 = matmul(T3, T1)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `T2 = matmul(T3, T1)`: reads T3 after it is deallocated"
    );
    let src = program(
        "  T3_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)\n  \
         T4_g_f32[4, 4] = ShardByStream(T3, axis=0, chunks=2, stream_index=1)\n  \
         Deallocate(T3)\n  T2 = matmul(T4, T1)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `T2 = matmul(T4, T1)`: reads T4, a view of T3, after T3 is deallocated"
    );
}

#[test]
fn program_inputs_and_outputs_are_never_deallocated() {
    assert_eq!(
        violation(&program("  Deallocate(T0)\n")),
        "statement `Deallocate(T0)`: deallocates program input T0"
    );
    assert_eq!(
        violation(&program("  Deallocate(T2)\n")),
        "statement `Deallocate(T2)`: deallocates program output T2, which the caller receives"
    );
}

#[test]
fn a_tensor_from_outside_a_loop_is_not_deallocated_inside_it() {
    let src = program(
        "  T3_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)\n  \
         FOR i0 from 0 to 2:\n    Deallocate(T3)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `Deallocate(T3)` in FOR i0: deallocates T3, which is defined outside FOR \
         i0: every iteration would free it again (deallocate it after the loop)"
    );
}

#[test]
fn every_output_is_defined_when_the_program_ends() {
    let src = "%HostIrContainer { (T0_g_f32[4]) -> (T1_g_f32[4]) :\n  \
               FOR i0 from 0 to 2:\n    T1 = ALLOCATE(mem_type=global, zero_init=false)\n\
               } // %HostIrContainer\n";
    assert_eq!(
        violation(src),
        "program output T1 is not defined when the program ends: it is defined only inside \
         FOR i0 (a definition in a loop body does not reach past the loop)"
    );
}

#[test]
fn shard_by_stream_cuts_an_existing_axis() {
    let src = program("  T3_g_f32[8] = ShardByStream(T0, axis=2, chunks=2, stream_index=0)\n");
    assert_eq!(
        violation(&src),
        "statement `T3 = ShardByStream(T0, axis=2, chunks=2, stream_index=0)`: cuts axis 2 of \
         T0, which has 2 axes"
    );
}

// ----- scalars and loop indices --------------------------------------------------------------

#[test]
fn a_loop_index_is_used_only_inside_its_loop() {
    let src = program(
        "  FOR i0 from 0 to 2:\n    \
         T3_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=i0)\n  \
         T4_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=( i0 + 1 ))\n",
    );
    assert_eq!(
        violation(&src),
        "statement `T4 = ShardByStream(T2, axis=0, chunks=2, stream_index=( i0 + 1 ))`: the \
         scalar `( i0 + 1 )` uses loop index i0 outside the FOR that binds it"
    );
}

#[test]
fn the_chunk_a_slot_view_holds_is_in_scope() {
    let src = program(
        "  FOR i0 from 0 to 2:\n    \
         T3_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=i0)\n  \
         T4_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=0, holds=(chunk=i0, chunks=3, extent=7))\n",
    );
    assert_eq!(
        violation(&src),
        "statement `T4 = ShardByStream(T2, axis=0, chunks=2, stream_index=0, holds=(chunk=i0, \
         chunks=3, extent=7))`: the scalar `i0` uses loop index i0 outside the FOR that binds it"
    );
}

#[test]
fn a_loop_index_is_bound_by_one_loop() {
    let src = program("  FOR i0 from 0 to 2:\n  FOR i0 from 0 to 3:\n");
    assert_eq!(
        violation(&src),
        "statement `FOR i0 from 0 to 3:`: binds loop index i0, which another FOR already binds"
    );
}

#[test]
fn allocated_sizes_are_in_scope() {
    let src = program(
        "  FOR i0 from 0 to 2:\n    Synchronize(Stream i0)\n  \
         T3_g_f32[i0] = ALLOCATE(mem_type=global, zero_init=false)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `T3 = ALLOCATE(mem_type=global, zero_init=false)`: the scalar `i0` uses \
         loop index i0 outside the FOR that binds it"
    );
}

// ----- streams -------------------------------------------------------------------------------

#[test]
fn a_captured_stream_needs_a_dominating_get_current_stream() {
    assert_eq!(
        violation(&program("  SetCurrentStream(Stream 0)\n")),
        "statement `SetCurrentStream(Stream 0)`: uses Stream 0 before a dominating \
         `GetCurrentStream` defines it"
    );
    let src = program(
        "  FOR i0 from 0 to 2:\n    Stream 0 = GetCurrentStream()\n  Synchronize(Stream 0)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `Synchronize(Stream 0)`: uses Stream 0 before a dominating \
         `GetCurrentStream` defines it"
    );
}

#[test]
fn an_indexed_stream_needs_its_index_in_scope() {
    let src = program(
        "  FOR i0 from 0 to 2:\n    SetCurrentStream(Stream i0)\n  \
         FOR i1 from 0 to 2:\n    Synchronize(Stream ( i0 % numberOfStreams ))\n",
    );
    assert_eq!(
        violation(&src),
        "statement `Synchronize(Stream ( i0 % numberOfStreams ))` in FOR i1: the scalar \
         `( i0 % numberOfStreams )` uses loop index i0 outside the FOR that binds it"
    );
}

#[test]
fn get_current_stream_defines_a_captured_stream() {
    let src = program("  FOR i0 from 0 to 2:\n    Stream i0 = GetCurrentStream()\n");
    assert_eq!(
        violation(&src),
        "statement `Stream i0 = GetCurrentStream()` in FOR i0: defines Stream i0, a pool \
         stream; `GetCurrentStream` defines a captured stream (`Stream N`)"
    );
}

// ----- communications and waits -------------------------------------------------------------

/// The seed's loop body with `wait_and_free` in place of `Wait` + `Deallocate`.
fn row_parallel(wait_and_free: &str) -> String {
    program(&format!(
        "  FOR i0 from 0 to 2:\n    \
         T3_g_f32[4, 4] = ShardByStream(T0, axis=0, chunks=2, stream_index=i0)\n    \
         T4_g_f32[4, 4] = ALLOCATE(mem_type=global, zero_init=false)\n    \
         T4 = linear(T3, T1)\n    \
         T5_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=i0)\n    \
         Communication 6 (type=Allreduce, team=(0 1), input=T4, output=T5, red_op=sum, \
         backend=NCCL)\n{wait_and_free}"
    ))
}

#[test]
fn the_row_parallel_body_verifies() {
    valid(&row_parallel(
        "    Wait(Communication 6)\n    Deallocate(T4)\n",
    ));
}

#[test]
fn a_wait_counts_as_a_use_so_no_deallocate_before_it() {
    assert_eq!(
        violation(&row_parallel(
            "    Deallocate(T4)\n    Wait(Communication 6)\n"
        )),
        "statement `Deallocate(T4)` in FOR i0: deallocates T4 while `Communication 6 \
         (type=Allreduce, team=(0 1), input=T4, output=T5, red_op=sum, backend=NCCL)` is in \
         flight on it; `Wait(Communication 6)` must come first"
    );
}

#[test]
fn every_communication_is_waited_for_before_its_scope_ends() {
    assert_eq!(
        violation(&row_parallel("")),
        "statement `Communication 6 (type=Allreduce, team=(0 1), input=T4, output=T5, \
         red_op=sum, backend=NCCL)` in FOR i0: is never waited for: `Wait(Communication 6)` \
         must follow it in the same loop body, before the iteration ends"
    );
    let src = program(
        "  P2PCommunication 1 (type=send, buffer=T0, peer=( ( rank + 1 ) % 2 ), backend=NCCL)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `P2PCommunication 1 (type=send, buffer=T0, peer=( ( rank + 1 ) % 2 ), \
         backend=NCCL)`: is never waited for: `Wait(P2PCommunication 1)` must follow it before \
         the program ends"
    );
}

#[test]
fn no_buffer_is_read_or_reused_before_the_wait() {
    // Reading the output of the collective through the tensor it is a view of.
    assert_eq!(
        violation(&row_parallel(
            "    T2 = matmul(T0, T1)\n    Wait(Communication 6)\n"
        )),
        "statement `T2 = matmul(T0, T1)` in FOR i0: writes T2 while `Communication 6 \
         (type=Allreduce, team=(0 1), input=T4, output=T5, red_op=sum, backend=NCCL)` is in \
         flight on T5, which shares memory with T2; `Wait(Communication 6)` must come first"
    );
    // Reallocating the input.
    assert_eq!(
        violation(&row_parallel(
            "    T4 = ALLOCATE(mem_type=global, zero_init=false)\n    Wait(Communication 6)\n"
        )),
        "statement `T4 = ALLOCATE(mem_type=global, zero_init=false)` in FOR i0: reallocates \
         T4 while `Communication 6 (type=Allreduce, team=(0 1), input=T4, output=T5, \
         red_op=sum, backend=NCCL)` is in flight on it; `Wait(Communication 6)` must come first"
    );
}

#[test]
fn a_wait_follows_its_communication_in_the_same_scope_once() {
    let src = program(
        "  Communication 1 (type=Allgather, team=(0 1), input=T0, output=T2, backend=NCCL)\n  \
         FOR i0 from 0 to 2:\n    Wait(Communication 1)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `Wait(Communication 1)` in FOR i0: waits for `Communication 1 \
         (type=Allgather, team=(0 1), input=T0, output=T2, backend=NCCL)`, which was posted \
         outside this loop body; a `Wait` must follow its communication in the same scope"
    );
    let src = program(
        "  Communication 1 (type=Allgather, team=(0 1), input=T0, output=T2, backend=NCCL)\n  \
         Wait(Communication 1)\n  Wait(Communication 1)\n",
    );
    assert_eq!(
        violation(&src),
        "statement `Wait(Communication 1)`: waits for `Communication 1 (type=Allgather, \
         team=(0 1), input=T0, output=T2, backend=NCCL)`, which is not in flight here (it is \
         already waited for, comes later, or sits in another scope)"
    );
}

#[test]
fn a_wait_names_a_communication() {
    assert_eq!(
        violation(&program("  Wait(Statement 0)\n")),
        "statement `Wait(Statement 0)`: waits for `T2 = ALLOCATE(mem_type=global, \
         zero_init=false)`, which is not a communication"
    );
}

#[test]
fn collectives_have_roots_and_reductions_as_their_type_says() {
    let comm = |fields: &str| {
        program(&format!(
            "  Communication 1 ({fields}, input=T0, output=T2, backend=NCCL)\n  \
             Wait(Communication 1)\n"
        ))
    };
    for (src, expected) in [
        (
            "type=Broadcast, team=(0 1)",
            "statement `Communication 1 (type=Broadcast, team=(0 1), input=T0, output=T2, \
             backend=NCCL)`: `type=Broadcast` needs a `root=`",
        ),
        (
            "type=Allreduce, team=(0 1), root=0",
            "statement `Communication 1 (type=Allreduce, team=(0 1), root=0, input=T0, output=T2, \
             backend=NCCL)`: `type=Allreduce` takes no `root=`",
        ),
        (
            "type=Allreduce, team=(0 1)",
            "statement `Communication 1 (type=Allreduce, team=(0 1), input=T0, output=T2, \
             backend=NCCL)`: `type=Allreduce` needs a `red_op=`",
        ),
    ] {
        assert_eq!(violation(&comm(src)), expected, "{src:?}");
    }
    assert_eq!(
        violation(
            &comm("type=Allgather, team=(0 1)").replace("output=T2", "output=T2, red_op=sum")
        ),
        "statement `Communication 1 (type=Allgather, team=(0 1), input=T0, output=T2, \
         red_op=sum, backend=NCCL)`: `type=Allgather` takes no `red_op=` (it does not reduce)"
    );
}

#[test]
fn teams_are_disjoint() {
    let comm = |team: &str| {
        program(&format!(
            "  Communication 1 (type=Allreduce, team={team}, input=T0, output=T2, red_op=sum, \
             backend=NCCL)\n  Wait(Communication 1)\n"
        ))
    };
    assert_eq!(
        violation(&comm("(0 1 | 1 2)")),
        "statement `Communication 1 (type=Allreduce, team=(0 1 | 1 2), input=T0, output=T2, \
         red_op=sum, backend=NCCL)`: lists device 1 twice in its teams (teams are disjoint)"
    );
    assert_eq!(
        violation(&comm("(0 0)")),
        "statement `Communication 1 (type=Allreduce, team=(0 0), input=T0, output=T2, \
         red_op=sum, backend=NCCL)`: lists device 0 twice in its teams (teams are disjoint)"
    );
    let fine = comm("(0 1 | 2 3)");
    valid(&fine);
    assert_eq!(print(&parse(&fine).unwrap()), fine);
}

// ----- coalescing groups -----------------------------------------------------------------------

/// A send/recv pair in a group, with `between` after the group's P2Ps and `after` after its end.
fn coalesced(between: &str, after: &str) -> String {
    program(&format!(
        "  T3_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)\n  \
         StartCoalescing\n  \
         P2PCommunication 3 (type=send, buffer=T0, peer=( ( rank + 1 ) % 2 ), backend=NCCL)\n  \
         P2PCommunication 4 (type=recv, buffer=T3, peer=( ( rank + 1 ) % 2 ), backend=NCCL)\n\
         {between}  EndCoalescing 5\n{after}"
    ))
}

/// The violation of [`coalesced`] with `stmt` right after the group's end, before its wait.
fn touched_in_flight(stmt: &str) -> String {
    violation(&coalesced(
        "",
        &format!("  {stmt}\n  Wait(EndCoalescing 5)\n"),
    ))
}

#[test]
fn a_coalescing_group_verifies_with_a_wait_on_its_end() {
    valid(&coalesced(
        "",
        "  Wait(EndCoalescing 5)\n  Deallocate(T3)\n",
    ));
}

#[test]
fn coalescing_groups_hold_only_point_to_points_and_are_balanced() {
    assert_eq!(
        violation(&coalesced(
            "  T2 = matmul(T0, T1)\n",
            "  Wait(EndCoalescing 5)\n"
        )),
        "statement `T2 = matmul(T0, T1)`: sits inside the coalescing group opened by \
         `StartCoalescing` (Statement 2), which may hold only P2PCommunication statements"
    );
    assert_eq!(
        violation(&program("  EndCoalescing 1\n")),
        "statement `EndCoalescing 1`: closes no coalescing group: no `StartCoalescing` before \
         it in this scope"
    );
    assert_eq!(
        violation(&program(
            "  FOR i0 from 0 to 2:\n    StartCoalescing\n  EndCoalescing 3\n"
        )),
        "statement `StartCoalescing` in FOR i0: opens a coalescing group that no \
         `EndCoalescing` closes in the same scope"
    );
}

#[test]
fn a_point_to_point_in_a_group_is_waited_for_through_the_group() {
    assert_eq!(
        violation(&coalesced("", "  Wait(P2PCommunication 4)\n")),
        "statement `Wait(P2PCommunication 4)`: waits for `P2PCommunication 4 (type=recv, \
         buffer=T3, peer=( ( rank + 1 ) % 2 ), backend=NCCL)`, which is inside a coalescing \
         group; wait for the group's `EndCoalescing` instead"
    );
    assert_eq!(
        touched_in_flight("Deallocate(T3)"),
        "statement `Deallocate(T3)`: deallocates T3 while `EndCoalescing 5` is in flight on \
         it; `Wait(EndCoalescing 5)` must come first"
    );
}

#[test]
fn a_sent_buffer_may_be_read_in_flight_but_not_written_and_a_received_one_not_read() {
    // The ring pattern computes on the chunk it forwards.
    valid(&coalesced(
        "",
        "  T2 = matmul(T0, T1)\n  Wait(EndCoalescing 5)\n  Deallocate(T3)\n",
    ));
    assert_eq!(
        touched_in_flight("T2 = matmul(T3, T1)"),
        "statement `T2 = matmul(T3, T1)`: reads T3 while `EndCoalescing 5` is in flight on it; \
         `Wait(EndCoalescing 5)` must come first"
    );
    assert_eq!(
        touched_in_flight("T0 = matmul(T2, T1)"),
        "statement `T0 = matmul(T2, T1)`: writes T0 while `EndCoalescing 5` is in flight on it; \
         `Wait(EndCoalescing 5)` must come first"
    );
    // A collective's input may be read too; its output may not.
    let allreduce = |read: &str| {
        program(&format!(
            "  T3_g_f32[8, 4] = ALLOCATE(mem_type=global, zero_init=false)\n  \
             Communication 2 (type=Allreduce, team=(0 1), input=T0, output=T3, red_op=sum, \
             backend=NCCL)\n  T2 = matmul({read}, T1)\n  Wait(Communication 2)\n"
        ))
    };
    valid(&allreduce("T0"));
    assert_eq!(
        violation(&allreduce("T3")),
        "statement `T2 = matmul(T3, T1)`: reads T3 while `Communication 2 (type=Allreduce, \
         team=(0 1), input=T0, output=T3, red_op=sum, backend=NCCL)` is in flight on it; \
         `Wait(Communication 2)` must come first"
    );
}

#[test]
fn sibling_chunks_cut_alike_with_different_indices_are_disjoint() {
    // The ring pattern: receive one chunk of T2 while sending another.
    valid(&program(
        "  FOR i0 from 1 to 2:\n    \
         T3_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=( ( rank + i0 ) % 2 ))\n    \
         T4_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=rank)\n    \
         StartCoalescing\n    \
         P2PCommunication 4 (type=recv, buffer=T3, peer=( ( rank + 1 ) % 2 ), backend=NCCL)\n    \
         P2PCommunication 5 (type=send, buffer=T4, peer=( ( rank + 1 ) % 2 ), backend=NCCL)\n    \
         EndCoalescing 6\n    Wait(EndCoalescing 6)\n",
    ));
    // The same chunk twice is one buffer.
    assert_eq!(
        violation(&program(
            "  T3_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=rank)\n  \
             T4_g_f32[4, 4] = ShardByStream(T2, axis=0, chunks=2, stream_index=rank)\n  \
             P2PCommunication 3 (type=recv, buffer=T3, peer=0, backend=NCCL)\n  \
             P2PCommunication 4 (type=send, buffer=T4, peer=1, backend=NCCL)\n  \
             Wait(P2PCommunication 3)\n  Wait(P2PCommunication 4)\n"
        )),
        "statement `P2PCommunication 4 (type=send, buffer=T4, peer=1, backend=NCCL)`: reads T4 \
         while `P2PCommunication 3 (type=recv, buffer=T3, peer=0, backend=NCCL)` is in flight \
         on T3, which shares memory with T4; `Wait(P2PCommunication 3)` must come first"
    );
}

// ----- kernels ---------------------------------------------------------------------------------

/// §10 #21's PostOnStream negative case: a kernel (nvFuser's PostOnStream) whose output is
/// stream-parallel is refused.
#[test]
fn a_kernel_with_a_stream_parallel_output_is_refused() {
    let src = program("  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))\n")
        + "K0: fusion copy() {\n  tensor a: f32[8, 4]\n  b = set(a)\n  output b\n  \
         schedule b { outer_split(0, 2) -> Stream }\n}\n";
    assert_eq!(
        violation(&src),
        "statement `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))`: launches K0, whose \
         fusion makes `b` Stream-parallel; a kernel computes the whole buffers it is given \
         (stream chunks and device shards are views that the host program cuts)"
    );
}

#[test]
fn a_kernel_launch_matches_its_fusion() {
    let src = program("  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))\n")
        + "K0: fusion add_self(m = 8, n = 4) {\n  tensor a: f32[m, n]\n  tensor b: f32[m, n]\n  \
         c = add(a, b)\n  output c\n}\n";
    assert_eq!(
        violation(&src),
        "statement `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))`: passes 1 inputs and 1 \
         outputs to K0, whose fusion has 2 inputs and 1 outputs"
    );
}
