//! Typed arena keys for every entity of a fusion; never bare `usize`.

slotmap::new_key_type! {
    /// A tensor (value) of a fusion.
    pub struct TensorId;
    /// An iteration domain (axis) of some tensor domain.
    pub struct IterDomainId;
    /// A transform (split or merge) between iter domains.
    pub struct IdExprId;
    /// An operation of the fusion.
    pub struct ExprId;
    /// A named device mesh declaration.
    pub struct MeshId;
}
