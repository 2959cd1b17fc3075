//! Small test passes shared by the pass-manager tests: a fusion to run them on, a pass that
//! changes nothing, one that makes a valid change, one that breaks the IR and one that fails.

#![allow(dead_code)]

use weave_ir::{Diagnostic, Fusion, MemoryType};
use weave_passes::{Changed, FusionPass, Ir, Pass, PassError};

pub const SOURCE: &str = "fusion f(n = 4) {
  tensor a: f32[n, 6]
  tensor b: f32[n, 6]
  c = add(a, b)
  d = set(c)
  output d
}
";

pub fn fusion() -> Fusion {
    weave_ir::text::parse(SOURCE, &[]).unwrap()
}

pub fn fusion_of(ir: &Ir) -> &Fusion {
    match ir {
        Ir::Fusion(f) => f,
        other => panic!("expected a fusion, got a {}", other.form()),
    }
}

/// Changes nothing.
pub struct Noop;

impl Pass for Noop {
    fn name(&self) -> &'static str {
        "noop"
    }
    fn summary(&self) -> &'static str {
        "changes nothing"
    }
}

impl FusionPass for Noop {
    fn run(&self, _f: &mut Fusion) -> Result<Changed, PassError> {
        Ok(Changed::No)
    }
}

/// Renames `c` to `c_renamed` (seen in `.weave` text) and makes it local memory (seen in the
/// seed style, which numbers tensors instead of naming them): a valid change.
pub struct Rename;

impl Pass for Rename {
    fn name(&self) -> &'static str {
        "rename"
    }
    fn summary(&self) -> &'static str {
        "renames tensor `c` to `c_renamed` and makes it local"
    }
}

impl FusionPass for Rename {
    fn run(&self, f: &mut Fusion) -> Result<Changed, PassError> {
        match f.tensor_by_name("c") {
            Some(c) => {
                f.tensor_mut(c).name = "c_renamed".to_string();
                f.tensor_mut(c).memory = MemoryType::Local;
                Ok(Changed::Yes)
            }
            None => Ok(Changed::No),
        }
    }
}

/// Renames `d` to `a`, so two tensors share a name: the verifier must reject the result.
pub struct Corrupt;

impl Pass for Corrupt {
    fn name(&self) -> &'static str {
        "corrupt"
    }
    fn summary(&self) -> &'static str {
        "gives two tensors the same name"
    }
}

impl FusionPass for Corrupt {
    fn run(&self, f: &mut Fusion) -> Result<Changed, PassError> {
        let d = f.tensor_by_name("d").unwrap();
        f.tensor_mut(d).name = "a".to_string();
        Ok(Changed::Yes)
    }
}

/// Refuses every input.
pub struct Fail;

impl Pass for Fail {
    fn name(&self) -> &'static str {
        "fail"
    }
    fn summary(&self) -> &'static str {
        "always reports an unsupported input"
    }
}

impl FusionPass for Fail {
    fn run(&self, _f: &mut Fusion) -> Result<Changed, PassError> {
        Err(PassError::Unsupported {
            pass: self.name(),
            diagnostic: Diagnostic::new("tensor `c` is not supported here"),
        })
    }
}
