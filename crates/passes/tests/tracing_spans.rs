//! The `tracing` spans of a pipeline run, seen by a recording subscriber: one `pipeline`
//! span, one `pass` span per pass with its name, position, IR forms and whether it changed
//! the IR, and a `verify` span per verification. Alone in its test binary, so that no other
//! test's callsites race with the subscriber installed here.

use weave_passes::{Ir, PassManager, Pipeline, Registry};

mod toy;

use toy::{fusion, FAIL, NOOP, RENAME};

/// One span as a subscriber saw it: its name and every field recorded, as text.
#[derive(Clone, Debug, Default)]
struct SeenSpan {
    name: &'static str,
    parent: Option<u64>,
    fields: Vec<(String, String)>,
}

impl SeenSpan {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl tracing::field::Visit for SeenSpan {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.fields
            .push((field.name().to_string(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.fields
            .push((field.name().to_string(), value.to_string()));
    }
}

/// A subscriber that keeps every span, for the test below.
#[derive(Default)]
struct Recorder {
    spans: std::sync::Mutex<Vec<SeenSpan>>,
    stack: std::sync::Mutex<Vec<u64>>,
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut span = SeenSpan {
            name: attrs.metadata().name(),
            parent: self.stack.lock().unwrap().last().copied(),
            ..SeenSpan::default()
        };
        attrs.record(&mut span);
        let mut spans = self.spans.lock().unwrap();
        spans.push(span);
        tracing::span::Id::from_u64(spans.len() as u64)
    }
    fn record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut spans = self.spans.lock().unwrap();
        values.record(&mut spans[id.into_u64() as usize - 1]);
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, id: &tracing::span::Id) {
        self.stack.lock().unwrap().push(id.into_u64());
    }
    fn exit(&self, _: &tracing::span::Id) {
        self.stack.lock().unwrap().pop();
    }
}

#[test]
fn every_pass_and_verification_runs_in_a_span() {
    let recorder = std::sync::Arc::new(Recorder::default());
    let dispatch = tracing::Dispatch::from(std::sync::Arc::clone(&recorder));
    let result = tracing::dispatcher::with_default(&dispatch, || {
        let pipeline = Pipeline::default().then(NOOP).then(RENAME).then(FAIL);
        PassManager::new(Registry::new(), pipeline)
            .run_with_output(Ir::Fusion(fusion()), &mut Vec::new())
    });
    assert_eq!(result.unwrap_err().pass(), Some("fail"));
    let spans = recorder.spans.lock().unwrap().clone();

    let pipeline: Vec<_> = spans.iter().filter(|s| s.name == "pipeline").collect();
    assert_eq!(pipeline.len(), 1);
    assert_eq!(pipeline[0].field("pipeline"), Some("noop,rename,fail"));
    let pipeline_id = spans.iter().position(|s| s.name == "pipeline").unwrap() as u64 + 1;

    let passes: Vec<_> = spans.iter().filter(|s| s.name == "pass").collect();
    let seen: Vec<_> = passes
        .iter()
        .map(|s| {
            (
                s.field("pass").unwrap(),
                s.field("index").unwrap(),
                s.field("before").unwrap(),
                s.field("after"),
                s.field("changed"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("noop", "0", "fusion", Some("fusion"), Some("false")),
            ("rename", "1", "fusion", Some("fusion"), Some("true")),
            // A failing pass leaves no result to describe.
            ("fail", "2", "fusion", None, None),
        ]
    );
    assert!(passes.iter().all(|s| s.parent == Some(pipeline_id)));

    // The input, then the output of each pass that succeeded.
    let verify: Vec<_> = spans.iter().filter(|s| s.name == "verify").collect();
    assert_eq!(verify.len(), 3);
    for span in &verify {
        assert_eq!(span.field("form"), Some("fusion"));
        assert_eq!(span.field("valid"), Some("true"));
    }
    assert_eq!(verify[0].parent, Some(pipeline_id));
    assert!(verify[1..].iter().all(|s| s.parent != Some(pipeline_id)));
}
