//! The exact id graph of a fusion: iter domains that index the same elements, grouped into
//! equivalence classes (nvFuser's `IdMappingMode::EXACT`, simplified).
//!
//! Built in two steps over every iter domain reachable from any tensor's root, logical,
//! loop and allocation domains (including the split/merge intermediates between them):
//!
//! 1. for every expr and every operand, the pairs of [`crate::logical_map::pairwise_map`]
//!    are unioned: pointwise axes, reduction axes with their inputs, matmul/linear operand
//!    axes with the output's `m`, `n`, batch and contraction axes, reshape inputs with the
//!    output's root; broadcasts are not mapped to real axes;
//! 2. transforms are followed to a fixed point: two splits of mapped inputs with the same
//!    kind and an equal factor map their outer outputs and their inner outputs; two merges
//!    whose outer inputs and inner inputs are mapped map their outputs. This carries the
//!    mapping from a reshape's root to its logical axes and from logical axes to identically
//!    scheduled loop axes.
//!
//! The graph is a snapshot: ids created after [`IdGraph::build`] are unknown to it and are
//! mapped only to themselves.

use std::collections::{HashMap, HashSet};

use slotmap::SparseSecondaryMap;
use weave_ir::{ExprId, Fusion, IdExpr, IdExprId, IterDomainId, Scalar, SplitKind, TensorId};

use crate::logical_map::pairwise_map;

/// An equivalence class of the graph, named by its representative (the first member in
/// the graph's traversal order). Equal classes mean mapped ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdClass(IterDomainId);

impl IdClass {
    /// The representative iter domain of the class.
    pub fn representative(self) -> IterDomainId {
        self.0
    }
}

/// Exact mapping between the iter domains of a fusion.
#[derive(Clone, Debug, Default)]
pub struct IdGraph {
    /// Position of each known id in `ids`. Sparse: a graph of one expr knows a few ids of a
    /// large fusion, and sharding propagation keeps one such graph per expr.
    index: SparseSecondaryMap<IterDomainId, usize>,
    /// Known ids in traversal order.
    ids: Vec<IterDomainId>,
    /// Class number of each known id (by position).
    class: Vec<usize>,
    /// Members of each class, in traversal order; classes ordered by first member.
    classes: Vec<Vec<IterDomainId>>,
}

/// A split factor for bucketing: its value when it evaluates, else its structure. Two
/// factors get the same key exactly when `Fusion::same_extent` holds.
#[derive(Clone, PartialEq, Eq, Hash)]
enum FactorKey {
    Value(i64),
    Symbolic(Scalar),
}

struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    /// Unions the classes of `a` and `b`; true if they were distinct.
    fn union(&mut self, a: usize, b: usize) -> bool {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb {
            return false;
        }
        // The smaller position stays the root, so representatives follow traversal order.
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        self.parent[hi] = lo;
        true
    }
}

impl IdGraph {
    /// Builds the exact graph of `f` (see the module doc).
    pub fn build(f: &Fusion) -> IdGraph {
        IdGraph::build_over(f, &f.tensors_in_order(), f.exprs())
    }

    /// The exact graph of some exprs: their operands' and outputs' iter domains, mapped by
    /// those exprs alone (and the identical transforms that follow). Unlike
    /// [`IdGraph::build`], the graph of one expr never maps two axes of one tensor together
    /// through a chain of other exprs: in `scores = matmul(q, k)` with `q` and `k` both
    /// computed from the token axis of one tensor, the whole fusion's graph puts the query
    /// and key axes of `scores` in one class, the expr's graph keeps them apart. Sharding
    /// propagation, which replays between an expr's operands and outputs only, and lowering,
    /// which chunks a segment's operands like its outputs, use it.
    pub fn build_for_exprs(f: &Fusion, exprs: &[ExprId]) -> IdGraph {
        let mut tensors: Vec<TensorId> = Vec::new();
        for e in exprs {
            let e = f.expr(*e);
            for t in e.inputs.iter().chain(&e.outputs) {
                if !tensors.contains(t) {
                    tensors.push(*t);
                }
            }
        }
        IdGraph::build_over(f, &tensors, exprs)
    }

    /// The graph over the iter domains of `tensors`, mapped by the operand/output pairs of
    /// `exprs` (whose tensors must be among `tensors`) and the identical transforms.
    fn build_over(f: &Fusion, tensors: &[TensorId], exprs: &[ExprId]) -> IdGraph {
        let mut ids: Vec<IterDomainId> = Vec::new();
        let mut index: SparseSecondaryMap<IterDomainId, usize> = SparseSecondaryMap::new();
        let mut id_exprs: Vec<IdExprId> = Vec::new();
        let mut seen_exprs: HashSet<IdExprId> = HashSet::new();

        // Collect ids: every domain, then everything their definitions reach (inputs and
        // sibling outputs), depth first.
        let mut stack: Vec<IterDomainId> = Vec::new();
        for &t in tensors {
            let tv = f.tensor(t);
            let mut doms: Vec<&[IterDomainId]> = Vec::new();
            if let Some(r) = &tv.root {
                doms.push(r);
            }
            doms.push(&tv.logical);
            doms.push(&tv.loop_domain);
            if let Some(a) = &tv.allocation {
                doms.push(a);
            }
            for d in doms {
                stack.extend(d.iter().rev().copied());
                while let Some(id) = stack.pop() {
                    if index.contains_key(id) {
                        continue;
                    }
                    index.insert(id, ids.len());
                    ids.push(id);
                    if let Some(e) = f.id(id).definition {
                        if seen_exprs.insert(e) {
                            id_exprs.push(e);
                        }
                        let ex = f.id_expr(e);
                        let mut next = ex.inputs();
                        next.extend(ex.outputs());
                        stack.extend(next.into_iter().rev());
                    }
                }
            }
        }

        let mut uf = UnionFind {
            parent: (0..ids.len()).collect(),
        };
        for e in exprs {
            let mut done = HashSet::new();
            for &p in &f.expr(*e).inputs {
                if !done.insert(p) {
                    continue;
                }
                for (a, b) in pairwise_map(f, *e, p) {
                    if let (Some(&ia), Some(&ib)) = (index.get(a), index.get(b)) {
                        uf.union(ia, ib);
                    }
                }
            }
        }

        // Follow identical transforms to a fixed point.
        loop {
            let mut changed = false;
            let mut splits: HashMap<(usize, bool, FactorKey), (usize, usize)> = HashMap::new();
            let mut merges: HashMap<(usize, usize), usize> = HashMap::new();
            for e in &id_exprs {
                match f.id_expr(*e) {
                    IdExpr::Split {
                        input,
                        outer,
                        inner,
                        factor,
                        kind,
                    } => {
                        let key = (
                            uf.find(index[*input]),
                            *kind == SplitKind::Outer,
                            match f.eval(factor) {
                                Some(v) => FactorKey::Value(v),
                                None => FactorKey::Symbolic(factor.clone()),
                            },
                        );
                        let (o, i) = (index[*outer], index[*inner]);
                        match splits.get(&key) {
                            Some(&(o2, i2)) => {
                                changed |= uf.union(o, o2);
                                changed |= uf.union(i, i2);
                            }
                            None => {
                                splits.insert(key, (o, i));
                            }
                        }
                    }
                    IdExpr::Merge {
                        outer,
                        inner,
                        output,
                    } => {
                        let key = (uf.find(index[*outer]), uf.find(index[*inner]));
                        let out = index[*output];
                        match merges.get(&key) {
                            Some(&o2) => changed |= uf.union(out, o2),
                            None => {
                                merges.insert(key, out);
                            }
                        }
                    }
                }
            }
            if !changed {
                break;
            }
        }

        let mut class = vec![usize::MAX; ids.len()];
        let mut classes: Vec<Vec<IterDomainId>> = Vec::new();
        let mut class_of_root: HashMap<usize, usize> = HashMap::new();
        for (k, id) in ids.iter().enumerate() {
            let r = uf.find(k);
            let c = *class_of_root.entry(r).or_insert_with(|| {
                classes.push(Vec::new());
                classes.len() - 1
            });
            class[k] = c;
            classes[c].push(*id);
        }
        IdGraph {
            index,
            ids,
            class,
            classes,
        }
    }

    /// True when `a` and `b` index the same elements (always true for `a == b`).
    pub fn are_mapped(&self, a: IterDomainId, b: IterDomainId) -> bool {
        self.class_of(a) == self.class_of(b)
    }

    /// The class of `id`; an id the graph does not know is its own class.
    pub fn class_of(&self, id: IterDomainId) -> IdClass {
        match self.index.get(id) {
            Some(&k) => IdClass(self.classes[self.class[k]][0]),
            None => IdClass(id),
        }
    }

    /// The members of `id`'s class, in traversal order (`[id]` for an unknown id).
    pub fn members(&self, id: IterDomainId) -> Vec<IterDomainId> {
        match self.index.get(id) {
            Some(&k) => self.classes[self.class[k]].clone(),
            None => vec![id],
        }
    }

    /// Every class, each in traversal order, ordered by first member.
    pub fn classes(&self) -> Vec<Vec<IterDomainId>> {
        self.classes.clone()
    }

    /// Every id the graph knows, in traversal order.
    pub fn ids(&self) -> &[IterDomainId] {
        &self.ids
    }

    /// True if the graph knows `id`.
    pub fn contains(&self, id: IterDomainId) -> bool {
        self.index.contains_key(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{f32_input, loop_split, n, outer, reshape, row_parallel_unscheduled};
    use weave_ir::{ExprKind, ParallelType};

    #[test]
    fn row_parallel_linear_maps_tokens_and_contraction() {
        let (mut f, inp, w, out) = row_parallel_unscheduled();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), Some(ParallelType::Stream)),
            outer(2, n("d"), Some(ParallelType::DIDx)),
        ];
        f.tensor_mut(w).schedule = vec![outer(1, n("d"), Some(ParallelType::DIDx))];
        f.tensor_mut(out).schedule = vec![outer(0, n("s"), Some(ParallelType::Stream))];
        crate::schedule::apply_schedules(&mut f).unwrap();
        let g = IdGraph::build(&f);
        let (il, wl, ol) = (
            f.tensor(inp).logical.clone(),
            f.tensor(w).logical.clone(),
            f.tensor(out).logical.clone(),
        );
        // Tokens, and the contraction axis with the output's reduction axis.
        assert!(g.are_mapped(il[0], ol[0]));
        assert!(g.are_mapped(il[1], ol[2]));
        assert!(g.are_mapped(wl[1], ol[2]));
        assert!(g.are_mapped(il[1], wl[1]));
        assert!(g.are_mapped(wl[0], ol[1]));
        assert!(!g.are_mapped(il[0], ol[1]));
        assert!(!g.are_mapped(il[1], wl[0]));
        // Identical stream splits of mapped axes map their outputs.
        let (ilp, olp) = (
            f.tensor(inp).loop_domain.clone(),
            f.tensor(out).loop_domain.clone(),
        );
        assert!(g.are_mapped(ilp[0], olp[0]));
        assert!(g.are_mapped(ilp[1], olp[1]));
        assert!(!g.are_mapped(ilp[0], ilp[1]));
        // Identical DIDx splits of inp's and w's k axes map too.
        let wlp = f.tensor(w).loop_domain.clone();
        assert!(g.are_mapped(ilp[2], wlp[1]));
        assert!(g.are_mapped(ilp[3], wlp[2]));
        assert_eq!(g.class_of(il[0]), g.class_of(ol[0]));
        assert!(g.members(il[1]).contains(&ol[2]));
    }

    #[test]
    fn different_factors_or_kinds_do_not_map() {
        let mut f = Fusion::new("f");
        let a = f32_input(&mut f, "a", vec![Scalar::c(12)], None);
        let b = f.set("b", a).unwrap();
        let c = f.set("c", a).unwrap();
        let (ao, _) = loop_split(&mut f, a, 0, Scalar::c(3), SplitKind::Outer);
        let (bo, _) = loop_split(&mut f, b, 0, Scalar::c(4), SplitKind::Outer);
        let (co, _) = loop_split(&mut f, c, 0, Scalar::c(3), SplitKind::Inner);
        let g = IdGraph::build(&f);
        assert!(g.are_mapped(f.tensor(a).logical[0], f.tensor(c).logical[0]));
        assert!(!g.are_mapped(ao, bo));
        assert!(!g.are_mapped(ao, co));
    }

    #[test]
    fn reshape_root_maps_and_identical_splits_reach_its_logical() {
        let mut f = Fusion::new("reshape");
        f.add_param("h", Some(8)).unwrap();
        let a = f32_input(&mut f, "a", vec![Scalar::c(3), n("h").mul(2)], None);
        let r = reshape(&mut f, "r", a, vec![Scalar::c(3), Scalar::c(2), n("h")]);
        // Schedule a's second axis exactly like the reshape splits it.
        let (o, i) = loop_split(&mut f, a, 1, Scalar::c(2), SplitKind::Outer);
        let g = IdGraph::build(&f);
        let rl = f.tensor(r).logical.clone();
        let root = f.tensor(r).root.clone().unwrap();
        assert!(g.are_mapped(f.tensor(a).logical[1], root[1]));
        assert!(g.are_mapped(o, rl[1]));
        assert!(g.are_mapped(i, rl[2]));
        assert!(g.are_mapped(f.tensor(a).logical[0], rl[0]));
    }

    #[test]
    fn broadcast_axes_stay_apart_and_unknown_ids_are_alone() {
        let mut f = Fusion::new("bc");
        let a = f32_input(&mut f, "a", vec![Scalar::c(4)], None);
        let b = f
            .add_op("b", ExprKind::Broadcast { axes: vec![0] }, &[a])
            .unwrap();
        let full = f32_input(&mut f, "full", vec![Scalar::c(5), Scalar::c(4)], None);
        let s = f.binary("s", weave_ir::BinaryOp::Add, b, full).unwrap();
        let g = IdGraph::build(&f);
        let (bl, fl, sl) = (
            f.tensor(b).logical.clone(),
            f.tensor(full).logical.clone(),
            f.tensor(s).logical.clone(),
        );
        assert!(!g.are_mapped(bl[0], sl[0]));
        assert!(g.are_mapped(fl[0], sl[0]));
        assert!(g.are_mapped(f.tensor(a).logical[0], fl[1]));
        let fresh = f.new_id(weave_ir::IterDomain::new(
            Scalar::c(1),
            weave_ir::IterType::Iteration,
        ));
        assert!(!g.contains(fresh));
        assert!(g.are_mapped(fresh, fresh));
        assert!(!g.are_mapped(fresh, bl[0]));
        assert_eq!(g.class_of(fresh).representative(), fresh);
        let total: usize = g.classes().iter().map(Vec::len).sum();
        assert_eq!(total, g.ids().len());
    }
}
