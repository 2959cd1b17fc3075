//! `attach-definition`: the step that closes lowering — the user's fusion becomes the
//! definition of the host program it was lowered to.
//!
//! Contract
//! * Input: the host program a pipeline's lowering stage (`lower-to-host`) has just left, and
//!   the fusion the pipeline was given. Output: the same program, whose signature (when it
//!   has one and no definition yet) holds that fusion as its definition, what a reference
//!   run evaluates and what the printer shows after `Definition:`, and the parameter roles
//!   of that fusion (passes add stream axes of their own, so the roles are the user's).
//! * The pass manager runs it right after the lowering stage, inside that stage's span,
//!   before the verifier and the dump: every host program a pipeline prints or verifies
//!   carries its definition. It is not a stage of its own, so pipelines, `--list-passes` and
//!   dump headers do not show it, and a host-program pipeline (given a host program, not a
//!   fusion) never runs it.
//! * Idempotent: a signature that already has a definition is left alone.

use weave_host_ir::HostProgram;
use weave_ir::{Fusion, ParamRole};

/// The `attach-definition` step (module docs), holding the fusion a pipeline was given.
#[derive(Clone, Copy, Debug)]
pub struct AttachDefinition<'a> {
    /// The pipeline's input.
    pub definition: &'a Fusion,
}

impl AttachDefinition<'_> {
    /// The step's name, for the code that runs it and its docs.
    pub const NAME: &'static str = "attach-definition";

    /// Stamps the definition and its roles onto `program`'s signature.
    pub fn run(&self, program: &mut HostProgram) {
        let Some(sig) = program.signature.as_mut() else {
            return;
        };
        if sig.definition.is_some() {
            return;
        }
        let def = self.definition;
        sig.roles = ParamRole::ALL
            .into_iter()
            .filter_map(|r| def.role_param(r).map(|p| (r, p.name.clone())))
            .collect();
        sig.definition = Some(def.clone());
    }
}
