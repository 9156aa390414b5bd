//! A server's continuous batching replayed from a trace of conversations: `width` lanes
//! (`serve --parallel N`'s rows) each decode one conversation after another, and a step
//! decodes one row of every lane that has one — the trace rows reordered into the order a
//! server at full load would route them, with each row's conversation as its stream (the
//! predictive policy keeps one token history per sequence, as the runtime does).
//!
//! Lane `j` takes the conversations of the `j`-th of `width` equal blocks of the trace, in
//! order: a trace is ordered by domain, so lanes decode different kinds of text side by side
//! (as `benchmarks/trace_interleave.py` pairs conversation `i` with `i + n/2`) rather than
//! neighbours of one domain, which share experts and would flatter a batch's union. A lane
//! that starts a conversation first replays its prompt rows one per step, uncounted (prefill
//! warms the cache; `replay::steps`' model); its decode rows then join the batch steps. A step
//! counts only while every lane decodes: the tail, where lanes have run out of conversations,
//! is replayed but is not the load projected. One cache for the whole run (a server never
//! empties it between requests).
use crate::replay::Step;
use crate::trace::{Segment, Trace};

/// A trace reordered into a server's batch steps (see the module docs).
#[derive(Debug, Clone)]
pub struct Served {
    /// The rows in the order served, each with its conversation as its stream.
    pub trace: Trace,
    /// The steps over `trace`'s rows.
    pub steps: Vec<Step>,
}

/// `trace`'s conversations served `width` at a time (at least 1).
pub fn served(trace: &Trace, width: usize) -> Served {
    let w = width.max(1);
    let segs = &trace.segments;
    let n = segs.len();
    // Lane j's conversations: the j-th block of the trace, in order.
    let mut queues: Vec<std::ops::Range<usize>> =
        (0..w).map(|j| j * n / w..(j + 1) * n / w).collect();
    // Per lane: (conversation, its next decode row).
    let mut current: Vec<Option<(usize, usize)>> = vec![None; w];
    let mut order: Vec<usize> = Vec::with_capacity(trace.rows);
    let mut streams: Vec<u16> = Vec::with_capacity(trace.rows);
    let mut steps = Vec::new();
    let mut first = true;
    // One step of `(row, conversation)`s.
    let mut push = |rows: &[(usize, usize)], counted: bool, turn: bool| {
        let start = order.len();
        for &(row, seg) in rows {
            order.push(row);
            // A server's sequence ids wrap too; only streams decoded together must differ.
            streams.push(seg as u16);
        }
        steps.push(Step {
            rows: start..order.len(),
            counted,
            reset: std::mem::take(&mut first),
            turn,
        });
    };
    loop {
        for (lane, cur) in current.iter_mut().enumerate() {
            while cur.is_none_or(|(s, r)| r >= segs[s].end) {
                let Some(s) = queues[lane].next() else {
                    *cur = None;
                    break;
                };
                let seg: &Segment = &segs[s];
                let decode = (seg.start + seg.warmup).min(seg.end);
                for (i, r) in (seg.start..decode).enumerate() {
                    push(&[(r, s)], false, i == 0);
                }
                *cur = Some((s, decode));
            }
        }
        let rows: Vec<(usize, usize)> = current
            .iter_mut()
            .flatten()
            .map(|(s, r)| {
                *r += 1;
                (*r - 1, *s)
            })
            .collect();
        if rows.is_empty() {
            break;
        }
        let full = rows.len() == w;
        push(&rows, full, false);
    }
    let per_row = trace.layers.len() * trace.top_k;
    let ids = order
        .iter()
        .flat_map(|&r| trace.ids[r * per_row..(r + 1) * per_row].iter().copied())
        .collect();
    let tokens = trace
        .tokens
        .as_ref()
        .map(|t| order.iter().map(|&r| t[r]).collect());
    let rows = order.len();
    Served {
        trace: Trace {
            rows,
            ids,
            tokens,
            streams: Some(streams),
            segments: vec![Segment {
                start: 0,
                end: rows,
                warmup: 0,
                domain: format!("{} served {w} at a time", trace.kind),
            }],
            reset_per_segment: false,
            ..trace.clone()
        },
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A trace of one layer, top-1, whose row r routes to expert r (so rows are traceable)
    /// and carries token r; segments as given (start, end, warmup).
    fn trace(segs: &[(usize, usize, usize)]) -> Trace {
        let rows = segs.iter().map(|s| s.1).max().unwrap_or(0);
        Trace {
            kind: "decode".into(),
            path: PathBuf::new(),
            layers: vec![1],
            experts_per_layer: 1000,
            top_k: 1,
            rows,
            ids: (0..rows as i32).collect(),
            tokens: Some((0..rows as u16).collect()),
            streams: None,
            segments: segs
                .iter()
                .map(|&(start, end, warmup)| Segment {
                    start,
                    end,
                    warmup,
                    domain: String::new(),
                })
                .collect(),
            reset_per_segment: true,
            num_hidden_layers: None,
        }
    }

    /// The original rows of a step.
    fn rows(s: &Served, st: &Step) -> Vec<i32> {
        st.rows.clone().map(|r| s.trace.ids[r]).collect()
    }

    #[test]
    fn one_lane_serves_the_conversations_in_order_without_resets() {
        let t = trace(&[(0, 4, 2), (4, 7, 1)]);
        let s = served(&t, 1);
        let got: Vec<(Vec<i32>, bool, bool, bool)> = s
            .steps
            .iter()
            .map(|st| (rows(&s, st), st.counted, st.reset, st.turn))
            .collect();
        assert_eq!(
            got,
            [
                (vec![0], false, true, true),
                (vec![1], false, false, false),
                (vec![2], true, false, false),
                (vec![3], true, false, false),
                (vec![4], false, false, true),
                (vec![5], true, false, false),
                (vec![6], true, false, false),
            ]
        );
        assert_eq!(s.trace.streams.as_deref(), Some(&[0, 0, 0, 0, 1, 1, 1][..]));
        assert_eq!(s.trace.tokens.as_deref(), Some(&[0, 1, 2, 3, 4, 5, 6][..]));
        assert!(!s.trace.reset_per_segment);
    }

    #[test]
    fn lanes_decode_side_by_side_and_a_joining_prompt_runs_before_its_rows() {
        // Four conversations, two lanes: lane 0 serves #0 then #1, lane 1 #2 then #3.
        let t = trace(&[(0, 3, 1), (3, 5, 1), (5, 9, 2), (9, 12, 1)]);
        let s = served(&t, 2);
        let got: Vec<(Vec<i32>, bool)> = s
            .steps
            .iter()
            .map(|st| (rows(&s, st), st.counted))
            .collect();
        assert_eq!(
            got,
            [
                (vec![0], false), // #0's prompt
                (vec![5], false), // #2's prompt
                (vec![6], false),
                (vec![1, 7], true), // both lanes decode
                (vec![2, 8], true),
                (vec![3], false), // #0 and #2 ended: #1's prompt, then #3's
                (vec![9], false),
                (vec![4, 10], true),
                (vec![11], false), // lane 0 is out of conversations: the tail is not counted
            ]
        );
        // Every row served exactly once, each with its conversation as its stream.
        let mut all: Vec<i32> = s.trace.ids.clone();
        all.sort();
        assert_eq!(all, (0..12).collect::<Vec<_>>());
        let seg_of = |r: i32| {
            t.segments
                .iter()
                .position(|g| (g.start..g.end).contains(&(r as usize)))
                .unwrap()
        };
        for (i, &r) in s.trace.ids.iter().enumerate() {
            assert_eq!(s.trace.streams.as_ref().unwrap()[i] as usize, seg_of(r));
        }
        assert_eq!(s.steps.iter().filter(|st| st.reset).count(), 1);
    }

    /// One lane is the trace's own order (given one stream per conversation and no resets):
    /// the same requests and hits as `replay::steps`' one-row replay. Two lanes on route256
    /// (24 conversations, GLM-5.2's expert shape) ask for nearly twice the experts a step —
    /// two rows of different texts share few — and hit less at the same slots.
    #[test]
    fn route256_served_one_at_a_time_is_the_plain_replay_and_two_share_few_experts() {
        use crate::replay::{replay_policy, steps};
        use crate::Admission;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/traces/route256");
        let mut t = Trace::load(&dir, "decode").unwrap();
        t.reset_per_segment = false;
        let mut streams = vec![0u16; t.rows];
        for (i, g) in t.segments.iter().enumerate() {
            streams[g.start..g.end].fill(i as u16);
        }
        t.streams = Some(streams);
        let layers = t.main_layers(t.hidden_layers());
        let adm = Admission::PREDICTIVE;
        let sum = |c: Vec<crate::replay::Count>| {
            c.iter()
                .fold((0, 0), |a, x| (a.0 + x.hits, a.1 + x.requests))
        };
        let plain = sum(replay_policy(&t, &steps(&t, 1), &layers, 13, adm));
        let one = served(&t, 1);
        assert_eq!(
            sum(replay_policy(&one.trace, &one.steps, &layers, 13, adm)),
            plain
        );
        let two = served(&t, 2);
        let (hits, requests) = sum(replay_policy(&two.trace, &two.steps, &layers, 13, adm));
        let counted = |s: &Served| s.steps.iter().filter(|x| x.counted).count() as f64;
        let per_step = |r: u64, s: &Served| r as f64 / counted(s) / layers.len() as f64;
        let (u1, u2) = (per_step(plain.1, &one), per_step(requests, &two));
        assert!(
            u2 > 1.8 * u1 && u2 <= 2.0 * u1,
            "unique experts a step: {u1} one, {u2} two"
        );
        let rate = |(h, r): (u64, u64)| h as f64 / r as f64;
        assert!(
            rate((hits, requests)) < rate(plain),
            "{plain:?} {hits} {requests}"
        );
        // Every decode row served once; counted steps hold both lanes' rows.
        assert!(two
            .steps
            .iter()
            .filter(|x| x.counted)
            .all(|x| x.rows.len() == 2));
        assert_eq!(
            two.trace.rows,
            t.segments.iter().map(|g| g.end - g.start).sum::<usize>()
        );
    }
}
