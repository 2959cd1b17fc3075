//! Statement labels (`HostProgram::statement_labels`): kept while the program stays as it
//! was, derived anew after an edit in place, and always those of the program as printed now.

use std::sync::Arc;

use weave_host_ir::{parse, HostProgram, Stmt, StmtId};

const FIXTURE: &str = include_str!("fixtures/ag_matmul_circular.hir");

fn program() -> HostProgram {
    parse(FIXTURE).unwrap_or_else(|e| panic!("{}", e.render("ag_matmul_circular.hir", FIXTURE)))
}

/// The labels of a fresh copy of `p` (a clone derives its own).
fn fresh_labels(p: &HostProgram) -> Vec<(StmtId, String)> {
    let copy = p.clone();
    let labels = copy.statement_labels();
    let mut out: Vec<_> = labels.iter().map(|(id, l)| (id, l.clone())).collect();
    out.sort();
    out
}

fn labels(p: &HostProgram) -> Vec<(StmtId, String)> {
    let mut out: Vec<_> = p
        .statement_labels()
        .iter()
        .map(|(id, l)| (id, l.clone()))
        .collect();
    out.sort();
    out
}

/// The first collective of the program.
fn first_communication(p: &HostProgram) -> StmtId {
    p.walk()
        .map(|w| w.stmt)
        .find(|&s| matches!(p.stmts[s], Stmt::Communication(_)))
        .expect("the fixture posts a collective")
}

#[test]
fn an_unchanged_program_keeps_its_labels() {
    let p = program();
    let first = p.statement_labels();
    let second = p.statement_labels();
    assert!(
        Arc::ptr_eq(&first, &second),
        "labels derived twice for one program"
    );
    assert_eq!(labels(&p), fresh_labels(&p));
    assert!(!first.is_empty());
}

#[test]
fn a_statement_edited_in_place_is_labelled_as_it_now_prints() {
    let mut p = program();
    let before = labels(&p);
    let comm = first_communication(&p);
    let Stmt::Communication(c) = &mut p.stmts[comm] else {
        unreachable!("first_communication returns a collective");
    };
    c.teams = vec![c.teams[0].iter().rev().copied().collect()];
    let after = labels(&p);
    assert_ne!(before, after, "the edit changed no label");
    assert_eq!(after, fresh_labels(&p));
    let old = &before.iter().find(|(id, _)| *id == comm).unwrap().1;
    let new = &after.iter().find(|(id, _)| *id == comm).unwrap().1;
    assert_ne!(old, new, "the edited statement kept its old label: {old}");
}

#[test]
fn a_statement_removed_from_the_program_loses_its_label() {
    let mut p = program();
    let before = p.statement_labels();
    let last = *p.top_level.last().unwrap();
    assert!(before.contains_key(last));
    p.top_level.pop();
    let after = p.statement_labels();
    assert!(
        !after.contains_key(last),
        "a removed statement kept its label"
    );
    assert_eq!(labels(&p), fresh_labels(&p));
}
