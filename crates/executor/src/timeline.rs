//! The timeline: per-rank, per-stream spans written in Chrome trace format (open it in
//! Perfetto or `chrome://tracing`) and as an SVG lane picture for a quick look.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::backend::{Span, StreamKey};

/// The spans of one rank.
#[derive(Clone, Debug)]
pub struct RankSpans {
    /// The rank.
    pub rank: usize,
    /// Its device spans.
    pub spans: Vec<Span>,
}

fn tid(stream: StreamKey) -> usize {
    match stream {
        StreamKey::Main => 0,
        StreamKey::Pool(n) => n + 1,
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The Chrome trace (JSON array format): one process per rank, one thread per stream, one
/// complete (`"ph": "X"`) event per span.
pub fn chrome_trace(ranks: &[RankSpans]) -> String {
    use serde_json::json;
    let mut events: Vec<String> = Vec::new();
    for r in ranks {
        events.push(
            json!({"name": "process_name", "ph": "M", "pid": r.rank,
                   "args": {"name": format!("rank {}", r.rank)}})
            .to_string(),
        );
        let streams: BTreeSet<StreamKey> = r.spans.iter().map(|s| s.stream).collect();
        for s in streams {
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": r.rank, "tid": tid(s),
                       "args": {"name": s.to_string()}})
                .to_string(),
            );
        }
        for s in &r.spans {
            // Microseconds with nanosecond resolution, as the trace format reads them.
            let us = |v: f64| (v * 1e3).round() / 1e3;
            events.push(
                json!({"name": s.label, "cat": category(&s.label), "ph": "X", "pid": r.rank,
                       "tid": tid(s.stream), "ts": us(s.start_us), "dur": us(s.dur_us)})
                .to_string(),
            );
        }
    }
    format!("[\n{}\n]\n", events.join(",\n"))
}

/// `comm`, `compute`, `sync` or `memory`: the colour class of a span.
pub fn category(label: &str) -> &'static str {
    if label.starts_with("Communication")
        || label.starts_with("P2PCommunication")
        || label.starts_with("EndCoalescing")
    {
        "comm"
    } else if label.starts_with("Synchronize") || label.starts_with("Wait") {
        "sync"
    } else if label.contains("ALLOCATE") || label == "free" || label == "zero fill" {
        "memory"
    } else {
        "compute"
    }
}

/// An SVG picture: one lane per (rank, stream), spans as boxes coloured by category, time
/// running left to right. Spans shorter than a pixel still show as a hairline.
pub fn svg(ranks: &[RankSpans]) -> String {
    let lanes: Vec<(usize, StreamKey)> = ranks
        .iter()
        .flat_map(|r| {
            let s: BTreeSet<StreamKey> = r.spans.iter().map(|s| s.stream).collect();
            s.into_iter().map(move |k| (r.rank, k))
        })
        .collect();
    let t0 = ranks
        .iter()
        .flat_map(|r| r.spans.iter().map(|s| s.start_us))
        .fold(f64::INFINITY, f64::min);
    let t1 = ranks
        .iter()
        .flat_map(|r| r.spans.iter().map(|s| s.start_us + s.dur_us))
        .fold(f64::NEG_INFINITY, f64::max);
    let (t0, span) = if t0.is_finite() && t1 > t0 {
        (t0, t1 - t0)
    } else {
        (0.0, 1.0)
    };
    let (left, width, lane_h) = (150.0, 1000.0, 22.0);
    let height = 40.0 + lane_h * lanes.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="monospace" font-size="11">"#,
        left + width + 20.0,
        height
    );
    let _ = writeln!(
        out,
        r#"<text x="4" y="14">time 0 .. {:.1} us (blue: compute, orange: communication, grey: synchronization)</text>"#,
        span
    );
    for (k, (rank, stream)) in lanes.iter().enumerate() {
        let y = 24.0 + lane_h * k as f64;
        let _ = writeln!(
            out,
            r#"<text x="4" y="{:.1}">rank {rank} {}</text>"#,
            y + 14.0,
            xml(&stream.to_string())
        );
        let _ = writeln!(
            out,
            r##"<rect x="{left}" y="{y:.1}" width="{width}" height="{:.1}" fill="#f4f4f4"/>"##,
            lane_h - 4.0
        );
        let spans = ranks
            .iter()
            .filter(|r| r.rank == *rank)
            .flat_map(|r| r.spans.iter())
            .filter(|s| s.stream == *stream);
        for s in spans {
            let x = left + (s.start_us - t0) / span * width;
            let w = (s.dur_us / span * width).max(0.5);
            let fill = match category(&s.label) {
                "comm" => "#f28e2b",
                "sync" => "#bab0ac",
                "memory" => "#59a14f",
                _ => "#4e79a7",
            };
            let _ = writeln!(
                out,
                r#"<rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{:.1}" fill="{fill}"><title>{} ({:.1} us)</title></rect>"#,
                lane_h - 4.0,
                xml(&s.label),
                s.dur_us
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans() -> Vec<RankSpans> {
        vec![RankSpans {
            rank: 1,
            spans: vec![
                Span {
                    stream: StreamKey::Pool(0),
                    label: "T5 = linear(T4, T1)".into(),
                    start_us: 10.0,
                    dur_us: 5.0,
                },
                Span {
                    stream: StreamKey::Pool(1),
                    label: "Communication 10 (type=Allreduce, \"x\")\t\n".into(),
                    start_us: 12.0,
                    dur_us: 4.0,
                },
            ],
        }]
    }

    #[test]
    fn chrome_trace_is_json_with_one_event_per_span() {
        let text = chrome_trace(&spans());
        let events: Vec<serde_json::Value> = serde_json::from_str(&text).expect("valid JSON");
        let span = events
            .iter()
            .find(|e| e["name"] == "T5 = linear(T4, T1)")
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(span["cat"], "compute");
        assert_eq!(span["ph"], "X");
        assert_eq!(
            (span["pid"].as_u64(), span["tid"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(
            (span["ts"].as_f64(), span["dur"].as_f64()),
            (Some(10.0), Some(5.0))
        );
        assert!(events.iter().any(|e| e["args"]["name"] == "pool stream 1"));
        // Quotes, tabs and newlines in labels survive as data.
        assert!(events
            .iter()
            .any(|e| e["name"] == "Communication 10 (type=Allreduce, \"x\")\t\n"));
    }

    #[test]
    fn svg_draws_a_lane_per_stream() {
        let text = svg(&spans());
        assert_eq!(text.matches("<title>").count(), 2);
        assert!(text.contains("rank 1 pool stream 0") && text.contains("rank 1 pool stream 1"));
        assert!(text.contains("&quot;x&quot;"));
    }
}
