//! Kernel launches and views checked against their buffers at load: a `.hir` whose kernel
//! block is given a buffer of another element type, or whose view its tensor cannot hold, is
//! refused, naming the buffer, the kernel's tensor and both types or sizes.

use weave_host_ir::{parse, verify};

/// A launch of `K0` (an add of two `f32[x, y]`, x = 12, y = 4) on the given buffers and
/// sizes.
fn launch(t2: &str, body: &str) -> String {
    format!(
        "%HostIrContainer {{ (T0_g_f32[12, 4], T1_g_f32[12, 4]) -> ({t2}) :\n{body}}} // %HostIrContainer\n\
         K0: fusion k(x = 12, y = 4) {{\n  tensor tv0: f32[x, y]\n  tensor tv1: f32[x, y]\n  tv2 = add(tv0, tv1)\n  output tv2\n}}\n"
    )
}

/// The load error of `src`: from the parser, or from the verifier that loading runs.
fn error(src: &str) -> String {
    match parse(src).map(|p| verify(&p).map(|()| p)) {
        Ok(Ok(p)) => panic!("expected an error, loaded:\n{p}"),
        Ok(Err(e)) | Err(e) => e.to_string(),
    }
}

fn loads(src: &str) -> bool {
    parse(src).is_ok_and(|p| verify(&p).is_ok())
}

#[test]
fn a_kernel_buffer_of_another_type_or_count_is_refused_at_load() {
    let body = "  T2 = ALLOCATE(mem_type=global, zero_init=false)\n  LaunchKernel(kernel=K0, inputs=(T0, T1), outputs=(T2))\n";
    // The right buffer loads.
    assert!(loads(&launch("T2_g_f32[12, 4]", body)));
    // Another element type.
    let e = error(&launch("T2_g_bf16[12, 4]", body));
    assert!(
        e.contains("passes T2 (bf16) as `tv2` of K0, which is f32"),
        "{e}"
    );
    // Another element count is the kernel's business: a loop launches a block that states
    // the whole tensor on each chunk's view.
    assert!(loads(&launch("T2_g_f32[6, 4]", body)));
}

#[test]
fn a_view_that_its_tensor_cannot_hold_is_refused_at_load() {
    let view = |sizes: &str| {
        format!(
            "%HostIrContainer {{ (T0_g_f32[12, 4]) -> () :\n  FOR i0 from 0 to 3:\n    T1_g_f32[{sizes}] = ShardByStream(T0, axis=0, chunks=3, stream_index=i0)\n}} // %HostIrContainer\n"
        )
    };
    assert!(loads(&view("4, 4")), "{}", error(&view("4, 4")));
    let e = error(&view("4, 5"));
    assert!(e.contains("has 5 elements along axis 1"), "{e}");
    let e = error(&view("13, 4"));
    assert!(e.contains("has 13 elements along axis 0"), "{e}");
    let e = error(&view("4"));
    assert!(e.contains("has 1 axes"), "{e}");
}
