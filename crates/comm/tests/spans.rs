//! The spans a communicator emits: one per posted communication (rank, type, label, team)
//! and one per host wait, recorded by a subscriber written here (the library installs none).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use weave_comm::{
    Collective, CommError, CommOp, Communicator, DataType, HostView, LocalWorld, RedOp, Task,
    TaskQueue,
};

/// A span's name and fields as printed.
type Recorded = (&'static str, HashMap<String, String>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Recorded>>>);

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push((attrs.metadata().name(), fields));
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// A stream that runs each task at once, on the posting thread.
#[derive(Default)]
struct Inline(Mutex<Vec<Result<(), CommError>>>);

impl TaskQueue for Inline {
    fn enqueue(&self, _: String, task: Task) {
        let result = task();
        self.0.lock().unwrap().push(result);
    }
}

#[test]
fn every_post_and_every_wait_has_a_span_naming_its_rank_type_and_team() {
    let world = LocalWorld::new(2, Duration::from_secs(20));
    let recorder = Recorder::default();
    thread::scope(|s| {
        for rank in 0..2 {
            let (world, recorder) = (&world, recorder.clone());
            s.spawn(move || {
                tracing::subscriber::with_default(recorder, || {
                    let comm = world.communicator(rank);
                    let stream = Inline::default();
                    let input = HostView::from_values(DataType::F32, &[2], &[1.0, 2.0]).unwrap();
                    let output = HostView::allocate(DataType::F32, &[2], false);
                    comm.post(
                        Collective {
                            label: "sum".into(),
                            team: vec![0, 1],
                            op: CommOp::Allreduce {
                                input,
                                output: output.clone(),
                                op: RedOp::Sum,
                            },
                        },
                        &stream,
                    )
                    .unwrap();
                    assert_eq!(stream.0.lock().unwrap().as_slice(), &[Ok(())]);
                    assert_eq!(output.read(), vec![2.0, 4.0]);
                });
            });
        }
    });
    let spans = recorder.0.lock().unwrap().clone();
    let named = |name: &str| -> Vec<&HashMap<String, String>> {
        spans.iter().filter(|s| s.0 == name).map(|s| &s.1).collect()
    };
    let posts = named("local_post");
    assert_eq!(posts.len(), 2, "{spans:?}");
    let mut ranks: Vec<&str> = posts.iter().map(|f| f["rank"].as_str()).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, ["0", "1"]);
    for fields in posts {
        assert_eq!(fields["op"], "\"allreduce\"");
        assert_eq!(fields["label"], "sum");
        assert_eq!(fields["team"], "[0, 1]");
    }
    let waits = named("local_wait");
    assert!(
        waits.len() >= 2,
        "every rank waits for the other: {spans:?}"
    );
}
