//! Access to the fusion's arenas: tensors, iter domains and their exprs, exprs in program
//! order, uses, and names.

use slotmap::SecondaryMap;

use crate::domain::{IdExpr, IterDomain, IterType, SplitKind};
use crate::expr::Expr;
use crate::ids::{ExprId, IdExprId, IterDomainId, TensorId};
use crate::scalar::Scalar;
use crate::tensor::TensorView;

use super::Fusion;

impl Fusion {
    /// A tensor.
    pub fn tensor(&self, id: TensorId) -> &TensorView {
        &self.tensors[id]
    }

    /// A tensor, mutably.
    pub fn tensor_mut(&mut self, id: TensorId) -> &mut TensorView {
        &mut self.tensors[id]
    }

    /// An iter domain.
    pub fn id(&self, id: IterDomainId) -> &IterDomain {
        &self.ids[id]
    }

    /// An iter domain, mutably.
    pub fn id_mut(&mut self, id: IterDomainId) -> &mut IterDomain {
        &mut self.ids[id]
    }

    /// Adds an iter domain.
    pub fn new_id(&mut self, id: IterDomain) -> IterDomainId {
        self.ids.insert(id)
    }

    /// An id transform.
    pub fn id_expr(&self, id: IdExprId) -> &IdExpr {
        &self.id_exprs[id]
    }

    /// Splits `input`, recording the transform. Extents: outer split by `f` gives
    /// `[f, ceilDiv(e, f)]`, inner split `[ceilDiv(e, f), f]`. Both outputs inherit the
    /// input's iter type and parallel type.
    pub fn split_id(
        &mut self,
        input: IterDomainId,
        factor: Scalar,
        kind: SplitKind,
    ) -> (IterDomainId, IterDomainId) {
        let src = self.ids[input].clone();
        let divided = src.extent.clone().ceil_div(factor.clone());
        let (oe, ie) = match kind {
            SplitKind::Outer => (factor.clone(), divided),
            SplitKind::Inner => (divided, factor.clone()),
        };
        let mk = |extent| IterDomain {
            extent,
            iter_type: src.iter_type,
            parallel: src.parallel,
            rfactor: false,
            swizzle: None,
            definition: None,
        };
        let outer = self.ids.insert(mk(oe));
        let inner = self.ids.insert(mk(ie));
        let e = self.id_exprs.insert(IdExpr::Split {
            input,
            outer,
            inner,
            factor,
            kind,
        });
        self.ids[outer].definition = Some(e);
        self.ids[inner].definition = Some(e);
        (outer, inner)
    }

    /// Merges `outer` and `inner` into one axis of the product extent, recording the
    /// transform. The result takes the outer's parallel type; it is a reduction if either
    /// input is, iteration if either is, broadcast only if both are.
    pub fn merge_ids(&mut self, outer: IterDomainId, inner: IterDomainId) -> IterDomainId {
        let (o, i) = (&self.ids[outer], &self.ids[inner]);
        let iter_type = match (o.iter_type, i.iter_type) {
            (IterType::Reduction, _) | (_, IterType::Reduction) => IterType::Reduction,
            (IterType::Broadcast, IterType::Broadcast) => IterType::Broadcast,
            _ => IterType::Iteration,
        };
        let out = IterDomain {
            extent: o.extent.clone().mul(i.extent.clone()),
            iter_type,
            parallel: o.parallel,
            rfactor: false,
            swizzle: None,
            definition: None,
        };
        let output = self.ids.insert(out);
        let e = self.id_exprs.insert(IdExpr::Merge {
            outer,
            inner,
            output,
        });
        self.ids[output].definition = Some(e);
        output
    }

    /// Every tensor: inputs first, then expr outputs in program order.
    pub fn tensors_in_order(&self) -> Vec<TensorId> {
        let mut v = self.inputs.clone();
        for e in &self.order {
            v.extend(self.exprs[*e].outputs.iter().copied());
        }
        v
    }

    /// Fusion inputs in declaration order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }

    /// Fusion outputs in declaration order.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Exprs in program (topological) order.
    pub fn exprs(&self) -> &[ExprId] {
        &self.order
    }

    /// An expr.
    pub fn expr(&self, id: ExprId) -> &Expr {
        &self.exprs[id]
    }

    /// An expr, mutably.
    pub fn expr_mut(&mut self, id: ExprId) -> &mut Expr {
        self.uses_index = std::sync::OnceLock::new();
        &mut self.exprs[id]
    }

    /// Moves `e` to just before `anchor` in program order. Passes that insert an op between
    /// existing ones build it with [`Fusion::add_op`] (which appends) and then move it; they
    /// keep the order topological (the verifier checks it). Does nothing when `e` or `anchor`
    /// is not in the program, or when they are the same expr.
    pub fn move_expr_before(&mut self, e: ExprId, anchor: ExprId) {
        if e == anchor || !self.order.contains(&anchor) {
            return;
        }
        let Some(from) = self.order.iter().position(|x| *x == e) else {
            return;
        };
        self.uses_index = std::sync::OnceLock::new();
        self.order.remove(from);
        let to = self
            .order
            .iter()
            .position(|x| *x == anchor)
            .expect("anchor is in the order");
        self.order.insert(to, e);
    }

    /// Takes `e` out of the program order (a pass that folds one op into another). Its
    /// outputs stay in the arena but no longer have a place in the program: the caller makes
    /// sure nothing reads them. Does nothing when `e` is not in the program.
    pub fn remove_expr(&mut self, e: ExprId) {
        if let Some(at) = self.order.iter().position(|x| *x == e) {
            self.uses_index = std::sync::OnceLock::new();
            self.order.remove(at);
        }
    }

    /// True for fusion inputs.
    pub fn is_input(&self, t: TensorId) -> bool {
        self.inputs.contains(&t)
    }

    /// True for fusion outputs.
    pub fn is_output(&self, t: TensorId) -> bool {
        self.outputs.contains(&t)
    }

    /// The exprs that read `t`, in program order.
    pub fn uses(&self, t: TensorId) -> Vec<ExprId> {
        let index = self.uses_index.get_or_init(|| {
            let mut index: SecondaryMap<TensorId, Vec<ExprId>> = SecondaryMap::new();
            for &e in &self.order {
                let mut seen: Vec<TensorId> = Vec::new();
                for &i in &self.exprs[e].inputs {
                    // An expr reading a tensor twice is one use.
                    if !seen.contains(&i) {
                        seen.push(i);
                        match index.get_mut(i) {
                            Some(uses) => uses.push(e),
                            None => {
                                index.insert(i, vec![e]);
                            }
                        }
                    }
                }
            }
            index
        });
        index.get(t).cloned().unwrap_or_default()
    }

    /// Looks a tensor up by its user name.
    pub fn tensor_by_name(&self, name: &str) -> Option<TensorId> {
        // The index of the names the builder gave, checked against the tensor (a name is a
        // public field, so a pass or test may have renamed it since); a miss scans.
        if let Some(&t) = self.names.get(name) {
            if self.tensors.get(t).is_some_and(|tv| tv.name == name) && self.is_placed(t) {
                return Some(t);
            }
        }
        self.tensors_in_order()
            .into_iter()
            .find(|t| self.tensors[*t].name == name)
    }

    /// Whether the builder gave a tensor of the fusion the name `name` (an index lookup:
    /// what the builder's duplicate-name check asks; a tensor renamed through
    /// [`Fusion::tensor_mut`] is judged by the verifier's unique-name rule instead).
    pub fn has_builder_name(&self, name: &str) -> bool {
        self.names
            .get(name)
            .is_some_and(|t| self.tensors.get(*t).is_some_and(|tv| tv.name == name))
    }

    /// True for a fusion input or a tensor some expr of the program outputs (every expr of
    /// the arena is in the program order: exprs are appended and moved, never dropped).
    fn is_placed(&self, t: TensorId) -> bool {
        self.is_input(t)
            || self.tensors[t]
                .definition
                .is_some_and(|e| self.exprs.get(e).is_some_and(|ex| ex.outputs.contains(&t)))
    }

    /// A name not used by any tensor, built from `base` (`base`, `base_1`, ...).
    pub fn fresh_name(&self, base: &str) -> String {
        if self.tensor_by_name(base).is_none() {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| self.tensor_by_name(n).is_none())
            .unwrap_or_default()
    }

    /// The logical axes of `t` that are materialized (reductions excluded): the axes users
    /// count when they write `sum(x, [1])`.
    pub fn visible_axes(&self, t: TensorId) -> Vec<IterDomainId> {
        self.tensors[t]
            .logical
            .iter()
            .copied()
            .filter(|i| self.ids[*i].iter_type != IterType::Reduction)
            .collect()
    }
}
