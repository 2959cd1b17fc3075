//! The spans a run emits: one `run_rank` span per run (rank, world, the program's statements
//! and, once done, those issued) and one `statement` span per issued statement at trace
//! level, inside it. A subscriber written here records them: the library installs none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use weave_comm::LocalWorld;
use weave_executor::{run_rank, CpuBackend, CpuOptions, RunConfig};
use weave_host_ir::parse;

/// A span as recorded: its name, its fields as printed, and its parent's index.
#[derive(Clone, Debug)]
struct Recorded {
    name: &'static str,
    fields: HashMap<String, String>,
    parent: Option<usize>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

/// Records every span of the calling thread, its parent being the span entered when it was
/// made.
#[derive(Clone, Default)]
struct Recorder {
    spans: Arc<Mutex<Vec<Recorded>>>,
    entered: Arc<Mutex<Vec<usize>>>,
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = self.entered.lock().unwrap().last().copied();
        let mut spans = self.spans.lock().unwrap();
        spans.push(Recorded {
            name: attrs.metadata().name(),
            fields,
            parent,
        });
        Id::from_u64(spans.len() as u64)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut spans = self.spans.lock().unwrap();
        let recorded = &mut spans[span.into_u64() as usize - 1];
        values.record(&mut Fields(&mut recorded.fields));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, span: &Id) {
        self.entered
            .lock()
            .unwrap()
            .push(span.into_u64() as usize - 1);
    }

    fn exit(&self, _: &Id) {
        self.entered.lock().unwrap().pop();
    }
}

#[test]
fn a_run_has_one_span_with_its_rank_and_statements_and_one_span_per_statement_inside() {
    let program = parse(
        "\
%HostIrContainer { () -> () :
  SetCurrentStream(Stream ( 1 ))
  Stream 0 = GetCurrentStream()
  SetCurrentStream(Stream 0)
} // %HostIrContainer
",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let world = LocalWorld::new(1, Duration::from_secs(10));
    let backend = CpuBackend::new(CpuOptions {
        timeout: Duration::from_secs(10),
        trace: false,
        delays: Vec::new(),
    });
    let config = RunConfig {
        params: HashMap::new(),
        number_of_streams: 2,
        check_races: false,
        deadline: None,
    };
    let recorder = Recorder::default();
    let run = tracing::subscriber::with_default(recorder.clone(), || {
        run_rank(&program, &backend, &world.communicator(0), &[], &config)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run.statements, 3);

    let spans = recorder.spans.lock().unwrap().clone();
    let runs: Vec<usize> = (0..spans.len())
        .filter(|&i| spans[i].name == "run_rank")
        .collect();
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let fields = &spans[runs[0]].fields;
    for (name, value) in [
        ("rank", "0"),
        ("world", "1"),
        ("statements", "3"),
        ("issued", "3"),
    ] {
        assert_eq!(
            fields.get(name).map(String::as_str),
            Some(value),
            "{name}: {fields:?}"
        );
    }
    let statements: Vec<&Recorded> = spans.iter().filter(|s| s.name == "statement").collect();
    assert_eq!(statements.len(), 3, "{spans:#?}");
    for s in &statements {
        assert_eq!(s.parent, Some(runs[0]), "inside the run: {s:?}");
    }
    assert!(
        statements[0].fields["label"].contains("SetCurrentStream"),
        "{:?}",
        statements[0]
    );
}
