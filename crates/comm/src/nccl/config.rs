//! NCCL's configuration: the unique id that names a world, the options of a rank's
//! communicators, and the `ncclConfig_t` they become.
#![allow(unsafe_code)]

use std::fmt;
use std::time::Duration;

use cudarc::nccl::sys;

use super::library::{backend, describe, library};
use crate::error::CommError;

/// `NCCL_CONFIG_UNDEF_INT` from `nccl.h`: a configuration field NCCL should choose.
pub const NCCL_CONFIG_UNDEF_INT: i32 = i32::MIN;

/// The magic number `NCCL_CONFIG_INITIALIZER` writes into `ncclConfig_t`.
const NCCL_CONFIG_MAGIC: u32 = 0xcafe_beef;

/// The 128-byte unique id that names one NCCL world: rank 0 makes it, every rank passes it
/// to [`Nccl::init`](super::Nccl::init).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclId([u8; NcclId::BYTES]);

impl NcclId {
    /// The size of an id in bytes.
    pub const BYTES: usize = 128;

    /// A fresh id (`ncclGetUniqueId`). On rank 0 this also starts NCCL's bootstrap listener
    /// (or uses `NCCL_COMM_ID` when it is set).
    pub fn new() -> Result<NcclId, CommError> {
        library()?;
        let mut id = sys::ncclUniqueId {
            internal: [0; NcclId::BYTES],
        };
        // SAFETY: the library is loaded (checked above); `id` is a valid out-pointer to a
        // `ncclUniqueId` on this stack frame.
        let result = unsafe { sys::ncclGetUniqueId(&mut id) };
        if result != sys::ncclResult_t::ncclSuccess {
            return Err(backend("ncclGetUniqueId", describe(result)));
        }
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; NcclId::BYTES] {
        &self.0
    }

    /// An id received from rank 0; fails unless `bytes` has exactly [`NcclId::BYTES`]
    /// bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId, CommError> {
        let array: [u8; NcclId::BYTES] = bytes.try_into().map_err(|_| {
            CommError::Bootstrap(format!(
                "an NCCL id has {} bytes, not {}",
                NcclId::BYTES,
                bytes.len()
            ))
        })?;
        Ok(NcclId(array))
    }

    pub(super) fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}

impl fmt::Debug for NcclId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclId(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// How a rank's communicators are created and how long they wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclOptions {
    /// How long any NCCL call (creation, split, posting, finalisation) may stay in progress
    /// before the rank aborts its communicators and fails with [`CommError::Timeout`].
    pub timeout: Duration,
    /// The most CTAs (thread blocks) one NCCL kernel may use (`maxCTAs`): fewer leave more
    /// of the GPU to concurrent compute. `None` lets NCCL choose.
    pub max_ctas: Option<i32>,
    /// The fewest CTAs one NCCL kernel uses (`minCTAs`); needs `max_ctas` too.
    pub min_ctas: Option<i32>,
    /// Create *blocking* communicators (`ncclConfig_t::blocking = 1`). A non-blocking
    /// communicator (the default) hands every group launch to a new NCCL helper thread and
    /// answers `ncclInProgress`, which costs on the order of 100 µs of host time per
    /// operation (docs/benchmarks.md); a blocking one enqueues in the caller's thread. The
    /// price: init, splits and the first operation between two ranks (NCCL connects lazily)
    /// block inside NCCL, where the timeout cannot reach, so a rank that never arrives hangs
    /// its peers there. Later waits keep their timeouts (the host waits on events and
    /// aborts). For benchmarks and jobs whose ranks are known to start.
    pub blocking: bool,
    /// NCCL's CTA policy for the rank's communicators (`ncclConfig_t::CTAPolicy`, NCCL ≥
    /// 2.27); `None` lets NCCL choose.
    pub cta_policy: Option<CtaPolicy>,
    /// Bytes of a symmetric window in each direction (NCCL ≥ 2.27): `2 × bytes` of NCCL
    /// memory (`ncclMemAlloc`) registered on the world communicator with
    /// `NCCL_WIN_COLL_SYMMETRIC` at init. Allgathers, allreduces and reduce-scatters of the
    /// whole world whose buffers fit are staged through it (copied in, run at the same
    /// offsets on every rank, so NCCL may take its symmetric kernels, copied out); larger
    /// ones, and every other operation, run on the caller's buffers as before. `None`: no
    /// window.
    pub symmetric_window: Option<usize>,
}

/// How many CTAs NCCL's kernels take (`NCCL_CTA_POLICY_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtaPolicy {
    /// `NCCL_CTA_POLICY_DEFAULT`: as many as the best bandwidth needs.
    Default,
    /// `NCCL_CTA_POLICY_EFFICIENCY`: as few as give decent bandwidth, for overlap with
    /// compute (NCCL ≥ 2.27).
    Efficiency,
    /// `NCCL_CTA_POLICY_ZERO`: none wherever NCCL can (copy engines over symmetric
    /// windows), even at some cost in bandwidth (NCCL ≥ 2.28).
    Zero,
}

impl CtaPolicy {
    /// The `ncclConfig_t::CTAPolicy` value.
    pub fn code(self) -> i32 {
        match self {
            CtaPolicy::Default => 0,
            CtaPolicy::Efficiency => 1,
            CtaPolicy::Zero => 2,
        }
    }

    /// The first NCCL version (`major * 10000 + minor * 100 + patch`) that knows it.
    pub fn since(self) -> i32 {
        match self {
            CtaPolicy::Default | CtaPolicy::Efficiency => 22700,
            CtaPolicy::Zero => 22800,
        }
    }

    /// The policy's name as flags spell it (`default`, `efficiency`, `zero`).
    pub fn name(self) -> &'static str {
        match self {
            CtaPolicy::Default => "default",
            CtaPolicy::Efficiency => "efficiency",
            CtaPolicy::Zero => "zero",
        }
    }
}

impl Default for NcclOptions {
    fn default() -> NcclOptions {
        NcclOptions {
            timeout: Duration::from_secs(60),
            max_ctas: None,
            min_ctas: None,
            blocking: false,
            cta_policy: None,
            symmetric_window: None,
        }
    }
}

/// The `ncclConfig_t` of every communicator of a rank: what `NCCL_CONFIG_INITIALIZER`
/// would give, non-blocking, with the CTA limits of `options`. `version` is the loaded
/// library's (NCCL reads `size` bytes of the struct, so a newer library keeps its defaults
/// for the fields this layout lacks).
pub(super) fn make_config(
    version: i32,
    options: &NcclOptions,
) -> Result<sys::ncclConfig_t, String> {
    for (name, value) in [
        ("max_ctas", options.max_ctas),
        ("min_ctas", options.min_ctas),
    ] {
        if let Some(v) = value {
            if v <= 0 {
                return Err(format!("NcclOptions::{name} is {v}; it must be positive"));
            }
        }
    }
    match (options.min_ctas, options.max_ctas) {
        (Some(_), None) => {
            return Err("NcclOptions::min_ctas needs max_ctas as well".into());
        }
        (Some(min), Some(max)) if min > max => {
            return Err(format!(
                "NcclOptions::min_ctas ({min}) is larger than max_ctas ({max})"
            ));
        }
        _ => {}
    }
    if let Some(policy) = options.cta_policy {
        if version < policy.since() {
            return Err(format!(
                "the NCCL CTA policy `{}` needs NCCL {} or later; the library is {}",
                policy.name(),
                super::library::version_name(policy.since()),
                super::library::version_name(version)
            ));
        }
    }
    if let Some(bytes) = options.symmetric_window {
        if bytes == 0 {
            return Err("NcclOptions::symmetric_window is 0 bytes; it must be positive".into());
        }
        if version < 22700 {
            return Err(format!(
                "a symmetric window needs NCCL 2.27.0 or later; the library is {}",
                super::library::version_name(version)
            ));
        }
    }
    #[cfg(not(any(
        feature = "nccl-02027",
        feature = "nccl-02028",
        feature = "nccl-02029",
        feature = "nccl-02030"
    )))]
    if options.cta_policy.is_some() || options.symmetric_window.is_some() {
        return Err(
            "CTA policies and symmetric windows need streamweave built for NCCL 2.27 \
                    or later (the `nccl-02027` feature or a later one)"
                .into(),
        );
    }
    let undef = NCCL_CONFIG_UNDEF_INT;
    // SAFETY: `ncclConfig_t` holds integers and pointers only, for which all-zero bytes are
    // a valid value (null pointers); every integer field is set below.
    let mut c: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    c.size = size_of::<sys::ncclConfig_t>();
    c.magic = NCCL_CONFIG_MAGIC;
    c.version = u32::try_from(version).unwrap_or(0);
    c.blocking = i32::from(options.blocking);
    c.cgaClusterSize = undef;
    c.minCTAs = options.min_ctas.unwrap_or(undef);
    c.maxCTAs = options.max_ctas.unwrap_or(undef);
    c.splitShare = undef;
    // The fields after `splitShare` follow the NCCL version of the bindings (the `nccl-*`
    // feature), each from the release that added it; `netName` and `commName` stay null.
    #[cfg(any(
        feature = "nccl-02026",
        feature = "nccl-02027",
        feature = "nccl-02028",
        feature = "nccl-02029",
        feature = "nccl-02030"
    ))]
    {
        c.trafficClass = undef;
    }
    #[cfg(any(
        feature = "nccl-02027",
        feature = "nccl-02028",
        feature = "nccl-02029",
        feature = "nccl-02030"
    ))]
    {
        c.collnetEnable = undef;
        c.CTAPolicy = options.cta_policy.map_or(undef, CtaPolicy::code);
        c.shrinkShare = undef;
        c.nvlsCTAs = undef;
    }
    #[cfg(any(feature = "nccl-02028", feature = "nccl-02029", feature = "nccl-02030"))]
    {
        c.nChannelsPerNetPeer = undef;
        c.nvlinkCentricSched = undef;
    }
    #[cfg(any(feature = "nccl-02029", feature = "nccl-02030"))]
    {
        c.graphUsageMode = undef;
        c.numRmaCtx = undef;
    }
    #[cfg(feature = "nccl-02030")]
    {
        c.maxP2pPeers = undef;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::library::version_name;

    #[test]
    fn id_round_trip_and_length_check() {
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 7 % 256) as u8;
        }
        let id = NcclId::from_bytes(&bytes).unwrap();
        assert_eq!(id.as_bytes(), &bytes);
        let raw = id.raw();
        assert_eq!(raw.internal[200 % 128] as u8, bytes[200 % 128]);
        assert_eq!(
            NcclId::from_bytes(&raw.internal.map(|c| c as u8)).unwrap(),
            id
        );
        let short = NcclId::from_bytes(&bytes[..127]).unwrap_err();
        assert_eq!(
            short.to_string(),
            "bootstrap failed: an NCCL id has 128 bytes, not 127"
        );
        assert!(NcclId::from_bytes(&[0u8; 129]).is_err());
        assert_eq!(format!("{id:?}"), "NcclId(00070e151c232a31…)");
    }

    #[test]
    fn config_is_non_blocking_with_undefined_defaults() {
        let config = make_config(22803, &NcclOptions::default()).unwrap();
        assert_eq!(config.size, size_of::<sys::ncclConfig_t>());
        assert_eq!(config.magic, 0xcafebeef);
        assert_eq!(config.version, 22803);
        assert_eq!(config.blocking, 0);
        // The fields of the default bindings (NCCL 2.28).
        #[cfg(feature = "nccl-02028")]
        {
            for field in [
                config.cgaClusterSize,
                config.minCTAs,
                config.maxCTAs,
                config.splitShare,
                config.trafficClass,
                config.collnetEnable,
                config.CTAPolicy,
                config.shrinkShare,
                config.nvlsCTAs,
                config.nChannelsPerNetPeer,
                config.nvlinkCentricSched,
            ] {
                assert_eq!(field, i32::MIN);
            }
            assert!(config.commName.is_null());
        }
        assert!(config.netName.is_null());

        let options = NcclOptions {
            max_ctas: Some(8),
            min_ctas: Some(2),
            ..NcclOptions::default()
        };
        let config = make_config(22803, &options).unwrap();
        assert_eq!((config.minCTAs, config.maxCTAs), (2, 8));
        let blocking = NcclOptions {
            blocking: true,
            ..NcclOptions::default()
        };
        assert_eq!(make_config(22803, &blocking).unwrap().blocking, 1);
        let only_max = NcclOptions {
            max_ctas: Some(4),
            ..NcclOptions::default()
        };
        assert_eq!(make_config(22803, &only_max).unwrap().minCTAs, i32::MIN);

        let err = |min, max| {
            make_config(
                22803,
                &NcclOptions {
                    min_ctas: min,
                    max_ctas: max,
                    ..NcclOptions::default()
                },
            )
            .unwrap_err()
        };
        assert_eq!(
            err(Some(2), None),
            "NcclOptions::min_ctas needs max_ctas as well"
        );
        assert_eq!(
            err(Some(9), Some(8)),
            "NcclOptions::min_ctas (9) is larger than max_ctas (8)"
        );
        assert_eq!(
            err(None, Some(0)),
            "NcclOptions::max_ctas is 0; it must be positive"
        );
        assert_eq!(NcclOptions::default().timeout, Duration::from_secs(60));

        // CTA policies and windows: by version.
        #[cfg(feature = "nccl-02028")]
        {
            let zero = NcclOptions {
                cta_policy: Some(CtaPolicy::Zero),
                ..NcclOptions::default()
            };
            assert_eq!(make_config(22803, &zero).unwrap().CTAPolicy, 2);
            assert_eq!(
                make_config(22705, &zero).unwrap_err(),
                "the NCCL CTA policy `zero` needs NCCL 2.28.0 or later; the library is 2.27.5"
            );
            let efficiency = NcclOptions {
                cta_policy: Some(CtaPolicy::Efficiency),
                ..NcclOptions::default()
            };
            assert_eq!(make_config(22705, &efficiency).unwrap().CTAPolicy, 1);
            let window = |bytes| NcclOptions {
                symmetric_window: Some(bytes),
                ..NcclOptions::default()
            };
            assert!(make_config(22803, &window(1 << 20)).is_ok());
            assert_eq!(
                make_config(22605, &window(1 << 20)).unwrap_err(),
                "a symmetric window needs NCCL 2.27.0 or later; the library is 2.26.5"
            );
            assert_eq!(
                make_config(22803, &window(0)).unwrap_err(),
                "NcclOptions::symmetric_window is 0 bytes; it must be positive"
            );
        }
        assert_eq!(version_name(22803), "2.28.3");
    }
}
