//! Device meshes: dense n-d arrays of device ids that DID axes index into.

use std::fmt;

/// Why [`DeviceMesh::new`] refuses a shape and device list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// The shape has no axes, or an axis of size 0.
    #[error("a device mesh needs at least one device")]
    Empty,
    /// The shape's element count differs from the number of devices given.
    #[error("mesh shape {shape:?} holds {holds} devices but {given} were given")]
    DeviceCount {
        /// The mesh shape.
        shape: Vec<usize>,
        /// The devices the shape holds.
        holds: usize,
        /// The devices given.
        given: usize,
    },
    /// A device id is given twice.
    #[error("device {0} appears twice in the mesh")]
    DuplicateDevice(i64),
    /// A device id is negative.
    #[error("device ids must be non-negative, found {0}")]
    NegativeDevice(i64),
}

/// A dense, row-major array of unique device ids. `DIDx` indexes the last axis, `DIDy` the one
/// before it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceMesh {
    shape: Vec<usize>,
    devices: Vec<i64>,
}

impl DeviceMesh {
    /// A mesh of `devices` laid out as `shape`. Fails when the sizes disagree, the mesh is
    /// empty, or a device repeats.
    pub fn new(shape: Vec<usize>, devices: Vec<i64>) -> Result<DeviceMesh, MeshError> {
        let n: usize = shape.iter().product();
        if shape.is_empty() || n == 0 {
            return Err(MeshError::Empty);
        }
        if n != devices.len() {
            return Err(MeshError::DeviceCount {
                shape,
                holds: n,
                given: devices.len(),
            });
        }
        let mut sorted = devices.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(MeshError::DuplicateDevice(w[0]));
        }
        if let Some(d) = devices.iter().find(|d| **d < 0) {
            return Err(MeshError::NegativeDevice(*d));
        }
        Ok(DeviceMesh { shape, devices })
    }

    /// Devices `0..n` in one axis.
    pub fn arange(n: usize) -> Result<DeviceMesh, MeshError> {
        DeviceMesh::new(vec![n], (0..n as i64).collect())
    }

    /// The number of devices.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The mesh shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The devices, row-major.
    pub fn devices(&self) -> &[i64] {
        &self.devices
    }

    /// The extent of the mesh axis indexed by `pt`, if the mesh has that axis.
    pub fn size_of(&self, pt: crate::domain::ParallelType) -> Option<usize> {
        let from_end = pt.mesh_axis_from_end()?;
        if from_end >= self.shape.len() {
            return None;
        }
        Some(self.shape[self.shape.len() - 1 - from_end])
    }

    /// True if `device` is in the mesh.
    pub fn has(&self, device: i64) -> bool {
        self.devices.contains(&device)
    }
}

/// `DeviceMesh{0 1 2 3}` for one axis, `DeviceMesh{{0 1}{2 3}}` for two.
impl fmt::Display for DeviceMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeviceMesh")?;
        fn rec(f: &mut fmt::Formatter<'_>, shape: &[usize], devs: &[i64]) -> fmt::Result {
            f.write_str("{")?;
            if shape.len() <= 1 {
                let s: Vec<String> = devs.iter().map(|d| d.to_string()).collect();
                f.write_str(&s.join(" "))?;
            } else {
                let chunk = devs.len() / shape[0];
                for c in devs.chunks(chunk) {
                    rec(f, &shape[1..], c)?;
                }
            }
            f.write_str("}")
        }
        rec(f, &self.shape, &self.devices)
    }
}
