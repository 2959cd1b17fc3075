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

/// Puts the ranks' spans on one clock. A backend times each rank from an origin of its own
/// (GPU clocks are not comparable across ranks; the runs of `streamweave` start a CUDA
/// rank's trace behind a one-element allgather of the world, so their origins already
/// coincide to microseconds, but an origin taken anywhere else does not), so ranks that began a run apart are drawn shifted against each other, and the
/// first collective of the ranks that came early looks as long as the skew. Every member
/// leaves a collective at the same moment: when every rank's first communication is the same
/// statement and its team (`team=(…)` in the label, as the host program prints it) is one
/// group of exactly the traced ranks, each rank is shifted so that those communications end
/// together, at the latest end. Returns the moment, on that clock, from which every rank had
/// begun (the latest first span), or `None` when there is nothing to align on (fewer than
/// two ranks, a rank without a communication, first communications that differ, or one of
/// several teams — the rows of a 2-D mesh, which do not meet each other), leaving the spans
/// as they were.
pub fn align_ranks(ranks: &mut [RankSpans]) -> Option<f64> {
    if ranks.len() < 2 {
        return None;
    }
    let firsts: Vec<&Span> = ranks
        .iter()
        .map(|r| {
            r.spans
                .iter()
                .filter(|s| category(&s.label) == "comm")
                .min_by(|a, b| a.start_us.total_cmp(&b.start_us))
        })
        .collect::<Option<Vec<_>>>()?;
    if firsts.iter().any(|f| f.label != firsts[0].label) {
        return None;
    }
    let mut members = one_team(&firsts[0].label)?;
    let mut traced: Vec<usize> = ranks.iter().map(|r| r.rank).collect();
    members.sort_unstable();
    traced.sort_unstable();
    if members != traced {
        return None;
    }
    let ends: Vec<f64> = firsts.iter().map(|f| f.start_us + f.dur_us).collect();
    let end = ends.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut begun = f64::NEG_INFINITY;
    for (r, e) in ranks.iter_mut().zip(ends) {
        let shift = end - e;
        for s in &mut r.spans {
            s.start_us += shift;
        }
        let first = r
            .spans
            .iter()
            .map(|s| s.start_us)
            .fold(f64::INFINITY, f64::min);
        begun = begun.max(first);
    }
    Some(begun)
}

/// A run's Chrome trace and SVG picture, the ranks first put on one clock
/// ([`align_ranks`]): the trace with every span, the picture from when every rank had begun
/// ([`svg_from`]; with nothing to align on, from the latest rank's first span, and the
/// whole of it for one rank).
pub fn trace_and_picture(mut ranks: Vec<RankSpans>) -> (String, String) {
    let begun = align_ranks(&mut ranks).or_else(|| latest_first_span(&ranks));
    let picture = match begun {
        Some(t) => svg_from(&ranks, t),
        None => svg(&ranks),
    };
    (chrome_trace(&ranks), picture)
}

/// When the last of several ranks began: its first span's start (`None` for fewer than two
/// ranks with spans). On clocks the ranks share (a CUDA world's traces start together), the
/// picture of a program that [`align_ranks`] cannot align (point-to-point rings) starts
/// there, without the early ranks' wait for the host of the last.
fn latest_first_span(ranks: &[RankSpans]) -> Option<f64> {
    let firsts: Vec<f64> = ranks
        .iter()
        .filter_map(|r| r.spans.iter().map(|s| s.start_us).reduce(f64::min))
        .collect();
    (firsts.len() >= 2).then(|| firsts.into_iter().fold(f64::NEG_INFINITY, f64::max))
}

/// The members of a communication's team when it is one group (`team=(0 1 2)` in its
/// printed label); `None` for several groups (`team=(0 1 | 2 3)`) or no team.
fn one_team(label: &str) -> Option<Vec<usize>> {
    let rest = &label[label.find("team=(")? + "team=(".len()..];
    let team = &rest[..rest.find(')')?];
    if team.contains('|') {
        return None;
    }
    team.split_whitespace().map(|m| m.parse().ok()).collect()
}

/// An SVG picture: one lane per (rank, stream), spans as boxes coloured by category, time
/// running left to right. Spans shorter than a pixel still show as a hairline.
pub fn svg(ranks: &[RankSpans]) -> String {
    draw(ranks, None)
}

/// [`svg`] from `from_us` on: what ended before is left out and what began before is drawn
/// from there (its tooltip keeps its whole duration) — with [`align_ranks`]'s moment, the
/// picture starts when every rank had begun, without the early ranks' wait for the last.
pub fn svg_from(ranks: &[RankSpans], from_us: f64) -> String {
    draw(ranks, Some(from_us))
}

fn draw(ranks: &[RankSpans], from: Option<f64>) -> String {
    let lanes: Vec<(usize, StreamKey)> = ranks
        .iter()
        .flat_map(|r| {
            let s: BTreeSet<StreamKey> = r.spans.iter().map(|s| s.stream).collect();
            s.into_iter().map(move |k| (r.rank, k))
        })
        .collect();
    let t0 = from.unwrap_or_else(|| {
        ranks
            .iter()
            .flat_map(|r| r.spans.iter().map(|s| s.start_us))
            .fold(f64::INFINITY, f64::min)
    });
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
    let since = match from {
        Some(_) => ", from when every rank had begun, the ranks on one clock",
        None => "",
    };
    let _ = writeln!(
        out,
        r#"<text x="4" y="14">time 0 .. {:.1} us{since} (blue: compute, orange: communication, grey: synchronization)</text>"#,
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
        for s in spans.filter(|s| s.start_us + s.dur_us >= t0) {
            let start = s.start_us.max(t0);
            let x = left + (start - t0) / span * width;
            let w = ((s.start_us + s.dur_us - start) / span * width).max(0.5);
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

    fn span(label: &str, start_us: f64, dur_us: f64) -> Span {
        Span {
            stream: StreamKey::Pool(0),
            label: label.into(),
            start_us,
            dur_us,
        }
    }

    const AG: &str = "Communication 11 (type=Allgather, team=(0 1))";

    /// Two ranks, each a first communication `first` (start, duration) then a GEMM of
    /// 100 us starting at the third figure.
    fn two_ranks(first: &str, r0: [f64; 3], r1: [f64; 3]) -> Vec<RankSpans> {
        [r0, r1]
            .into_iter()
            .enumerate()
            .map(|(rank, [start, dur, gemm])| RankSpans {
                rank,
                spans: vec![
                    span(first, start, dur),
                    span("T10 = linear(T9, T1)", gemm, 100.0),
                ],
            })
            .collect()
    }

    /// Two ranks on clocks of their own: rank 0 began 900 us before rank 1, so its first
    /// allgather waited 900 us longer; aligned, both allgathers end together and what
    /// follows lines up, and the picture from when both had begun draws rank 0's allgather
    /// from there.
    #[test]
    fn ranks_are_aligned_at_the_end_of_their_first_communication() {
        let mut ranks = two_ranks(AG, [0.0, 1000.0, 1000.0], [0.0, 100.0, 100.0]);
        assert_eq!(align_ranks(&mut ranks), Some(900.0));
        let starts = |r: &RankSpans| r.spans.iter().map(|s| s.start_us).collect::<Vec<_>>();
        assert_eq!(starts(&ranks[0]), vec![0.0, 1000.0]);
        assert_eq!(starts(&ranks[1]), vec![900.0, 1000.0]);
        let text = svg_from(&ranks, 900.0);
        assert!(
            text.contains("time 0 .. 200.0 us, from when every rank had begun"),
            "{text}"
        );
        // Both allgathers drawn from the left edge over half the picture (100 of 200 us),
        // rank 0's tooltip keeping its 1000 us.
        assert_eq!(
            text.matches(r#"x="150.00" y="24.0" width="500.00""#)
                .count(),
            1,
            "{text}"
        );
        assert_eq!(
            text.matches(r#"x="150.00" y="46.0" width="500.00""#)
                .count(),
            1,
            "{text}"
        );
        assert!(text.contains("(1000.0 us)</title>"), "{text}");
        // Nothing to align on: one rank, a rank without a communication, different first
        // communications; the spans stay as they were.
        let mut one = ranks[..1].to_vec();
        assert_eq!(align_ranks(&mut one), None);
        let mut differ = ranks.clone();
        differ[1].spans[0].label = "Communication 12 (type=Allgather, team=(0 1))".into();
        differ[1].spans[0].start_us = 0.0;
        assert_eq!(align_ranks(&mut differ), None);
        assert_eq!(differ[1].spans[0].start_us, 0.0);
        let mut silent = ranks.clone();
        silent[1].spans.remove(0);
        assert_eq!(align_ranks(&mut silent), None);
        // The rows of a 2-D mesh: one statement, two teams that never meet; and a team that
        // is not the traced ranks.
        for team in ["(0 | 1)", "(0 1 2)"] {
            let mut rows = ranks.clone();
            for r in &mut rows {
                r.spans[0].label = format!("Communication 3 (type=Allreduce, team={team})");
                r.spans[0].start_us = 0.0;
            }
            assert_eq!(align_ranks(&mut rows), None, "{team}");
            assert_eq!(rows[1].spans[0].start_us, 0.0);
        }
    }

    /// A ring of point-to-point exchanges has no collective to align on; on a clock the
    /// ranks share, its picture starts when the last rank began (rank 1, 700 us in), rank
    /// 0's first exchange — waiting for rank 1 — drawn from there.
    #[test]
    fn a_ring_is_pictured_from_when_the_last_rank_began() {
        let ranks = two_ranks(
            "EndCoalescing 11",
            [0.0, 800.0, 800.0],
            [700.0, 100.0, 800.0],
        );
        assert_eq!(align_ranks(&mut ranks.clone()), None);
        assert_eq!(latest_first_span(&ranks), Some(700.0));
        assert_eq!(latest_first_span(&ranks[..1]), None);
        let (trace, picture) = trace_and_picture(ranks);
        assert!(
            picture.contains("time 0 .. 200.0 us, from when every rank had begun"),
            "{picture}"
        );
        // The trace keeps every span where it was.
        assert!(
            trace.contains(r#""ts":0.0"#) && trace.contains(r#""ts":700.0"#),
            "{trace}"
        );
    }

    #[test]
    fn svg_draws_a_lane_per_stream() {
        let text = svg(&spans());
        assert_eq!(text.matches("<title>").count(), 2);
        assert!(text.contains("rank 1 pool stream 0") && text.contains("rank 1 pool stream 1"));
        assert!(text.contains("&quot;x&quot;"));
    }
}
