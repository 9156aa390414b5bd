//! `nectar logits`: the model's raw outputs for a prompt, as JSON shaped like the fixtures.
use crate::args::LogitsArgs;
use crate::demo::model_dir;
use anyhow::{Context, Result};
use nectar_model::{Glm5, MtpStep, NoObserver, Observer, SeqStep};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Write;

/// Per MoE layer: expert ids and combine weights, one entry per position.
type RouterLog = BTreeMap<usize, (Vec<Vec<u32>>, Vec<Vec<f32>>)>;

#[derive(Default)]
struct Capture {
    router: RouterLog,
    indexer: BTreeMap<usize, Option<Vec<u32>>>,
    last_row: usize,
}

impl Observer for Capture {
    fn router(&mut self, layer: usize, _row: usize, ids: &[u32], weights: &[f32]) {
        let e = self.router.entry(layer).or_default();
        e.0.push(ids.to_vec());
        e.1.push(weights.to_vec());
    }
    fn indexer(&mut self, layer: usize, row: usize, full: bool, selected: Option<&[u32]>) {
        if full && row == self.last_row {
            self.indexer.insert(layer, selected.map(<[u32]>::to_vec));
        }
    }
}

pub fn run(a: LogitsArgs) -> Result<()> {
    let dir = model_dir(a.model)?;
    let model = Glm5::load(&dir).with_context(|| format!("loading {}", dir.display()))?;
    anyhow::ensure!(!a.prompt_ids.is_empty(), "--prompt-ids is empty");
    let ids = &a.prompt_ids;
    let n = ids.len();
    let mut cache = model.new_cache();
    let mut cap = Capture {
        last_row: n - 1,
        ..Default::default()
    };
    let hidden = model.forward(
        &mut [SeqStep {
            cache: &mut cache,
            tokens: ids,
        }],
        &mut cap,
    )?;
    let logits = model.logits(&hidden)?;
    let v = model.vocab_size();
    let mut out = Map::new();
    out.insert(
        "logits".into(),
        json!(logits.chunks_exact(v).collect::<Vec<_>>()),
    );
    if a.mtp && n > 1 {
        anyhow::ensure!(
            model.has_mtp(),
            "{}: the model has no MTP layer",
            dir.display()
        );
        let hd = model.hidden_size();
        let step = MtpStep {
            cache: &mut cache,
            hidden: &hidden[..(n - 1) * hd],
            next_tokens: &ids[1..],
        };
        let hm = model.mtp_forward(&mut [step], &mut NoObserver)?;
        let d = model.mtp_logits(&hm)?;
        out.insert(
            "mtp_logits".into(),
            json!(d.chunks_exact(v).collect::<Vec<_>>()),
        );
    }
    if a.router {
        let r: Map<String, Value> = cap
            .router
            .iter()
            .map(|(l, (ids, w))| (l.to_string(), json!({"ids": ids, "weights": w})))
            .collect();
        out.insert("router".into(), Value::Object(r));
    }
    if a.indexer {
        let all: Vec<u32> = (0..n as u32).collect();
        let r: Map<String, Value> = cap
            .indexer
            .iter()
            .map(|(l, s)| (l.to_string(), json!(s.as_ref().unwrap_or(&all))))
            .collect();
        out.insert("indexer".into(), Value::Object(r));
    }
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &Value::Object(out))?;
    writeln!(stdout)?;
    Ok(())
}
