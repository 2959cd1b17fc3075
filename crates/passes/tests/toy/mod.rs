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

/// A test pass: a name, a summary and what it does to a fusion.
pub struct Toy {
    name: &'static str,
    summary: &'static str,
    run: fn(&mut Fusion) -> Result<Changed, PassError>,
}

impl Pass for Toy {
    fn name(&self) -> &'static str {
        self.name
    }
    fn summary(&self) -> &'static str {
        self.summary
    }
}

impl FusionPass for Toy {
    fn run(&self, f: &mut Fusion) -> Result<Changed, PassError> {
        (self.run)(f)
    }
}

/// Changes nothing.
pub const NOOP: Toy = Toy {
    name: "noop",
    summary: "changes nothing",
    run: |_f| Ok(Changed::No),
};

/// Renames `c` to `c_renamed` (seen in `.weave` text) and makes it local memory (seen in the
/// seed style, which numbers tensors instead of naming them): a valid change.
pub const RENAME: Toy = Toy {
    name: "rename",
    summary: "renames tensor `c` to `c_renamed` and makes it local",
    run: |f| match f.tensor_by_name("c") {
        Some(c) => {
            f.tensor_mut(c).name = "c_renamed".to_string();
            f.tensor_mut(c).memory = MemoryType::Local;
            Ok(Changed::Yes)
        }
        None => Ok(Changed::No),
    },
};

/// Renames `d` to `a`, so two tensors share a name: the verifier must reject the result.
pub const CORRUPT: Toy = Toy {
    name: "corrupt",
    summary: "gives two tensors the same name",
    run: |f| {
        let d = f.tensor_by_name("d").unwrap();
        f.tensor_mut(d).name = "a".to_string();
        Ok(Changed::Yes)
    },
};

/// Refuses every input.
pub const FAIL: Toy = Toy {
    name: "fail",
    summary: "always reports an unsupported input",
    run: |_f| {
        Err(PassError::Unsupported {
            pass: "fail",
            diagnostic: Diagnostic::new("tensor `c` is not supported here"),
        })
    },
};
