//! The fusion's device meshes: declaring them and looking them up.

use crate::diag::{Diagnostic, IrResult};
use crate::ids::{MeshId, TensorId};
use crate::mesh::DeviceMesh;

use super::{Fusion, MeshDecl, MeshSpec};

impl Fusion {
    /// Declares a mesh, evaluating `spec` with the current parameter values.
    pub fn add_mesh(&mut self, name: &str, spec: MeshSpec) -> IrResult<MeshId> {
        if self.mesh_by_name(name).is_some() {
            return Err(Diagnostic::new(format!("duplicate mesh `{name}`")));
        }
        let mesh = match &spec {
            MeshSpec::Devices(dims) => {
                let mut shape = Vec::new();
                for d in dims {
                    self.check_symbols(d)?;
                    let v = self.eval(d).ok_or_else(|| {
                        Diagnostic::new(format!(
                            "mesh `{name}`: `{}` has no value (give the parameter a default or --set it)",
                            d.to_source()
                        ))
                    })?;
                    if v <= 0 {
                        return Err(Diagnostic::new(format!(
                            "mesh `{name}`: size `{}` = {v} must be positive",
                            d.to_source()
                        )));
                    }
                    shape.push(v as usize);
                }
                let n: usize = shape.iter().product();
                DeviceMesh::new(shape, (0..n as i64).collect())
            }
            MeshSpec::Explicit { shape, devices } => DeviceMesh::new(shape.clone(), devices.clone()),
        }
        .map_err(|e| Diagnostic::new(format!("mesh `{name}`: {e}")))?;
        let id = self.meshes.insert(MeshDecl {
            name: name.to_string(),
            spec,
            mesh,
            span: None,
        });
        self.mesh_order.push(id);
        Ok(id)
    }

    /// Meshes in declaration order.
    pub fn meshes(&self) -> &[MeshId] {
        &self.mesh_order
    }

    /// A mesh declaration.
    pub fn mesh(&self, id: MeshId) -> &MeshDecl {
        &self.meshes[id]
    }

    /// A mesh declaration, mutably (to record its span).
    pub fn mesh_mut(&mut self, id: MeshId) -> &mut MeshDecl {
        &mut self.meshes[id]
    }

    /// Looks a mesh up by name.
    pub fn mesh_by_name(&self, name: &str) -> Option<MeshId> {
        self.mesh_order
            .iter()
            .copied()
            .find(|m| self.meshes[*m].name == name)
    }

    /// The mesh of a tensor, if it has one.
    pub fn mesh_of(&self, t: TensorId) -> Option<&DeviceMesh> {
        self.tensors[t].mesh.map(|m| &self.meshes[m].mesh)
    }
}
