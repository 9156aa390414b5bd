//! `nectar run`: generate text from a prompt (greedy), streamed to stdout.
use crate::args::RunArgs;
use crate::demo::model_dir;
use anyhow::{Context, Result};
use nectar_engine::{generate_greedy, ModelBundle, StreamDecoder};
use serde_json::json;
use std::io::Write;

/// The prompt used when none is given.
const DEFAULT_PROMPT: &str = "And God said,";

pub fn run(a: RunArgs) -> Result<()> {
    let dir = model_dir(a.model)?;
    let bundle = ModelBundle::open(&dir).with_context(|| format!("loading {}", dir.display()))?;
    let prompt_ids = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, p) => {
            let text = p.as_deref().unwrap_or(DEFAULT_PROMPT);
            if a.chat {
                bundle.encode_chat(text)?
            } else {
                bundle.encode_text(text)?
            }
        }
    };
    let tok = bundle.tokenizer.as_ref();
    let mut dec = StreamDecoder::with_context(true, &prompt_ids);
    let mut stdout = std::io::stdout().lock();
    if !a.json {
        if let (Some(t), None) = (tok, &a.prompt_ids) {
            if !a.chat {
                write!(stdout, "{}", t.decode(&prompt_ids, true)?)?;
                stdout.flush()?;
            }
        }
    }
    let stops = bundle.stop_ids.clone();
    let gen = generate_greedy(&bundle.model, &prompt_ids, a.max_tokens, &stops, |id| {
        if a.json || stops.contains(&id) {
            return Ok(true);
        }
        let piece = match tok {
            Some(t) => dec.push(t, id)?,
            None => format!("{id} "),
        };
        // A closed stdout stops generation instead of failing it.
        Ok(write!(stdout, "{piece}")
            .and_then(|_| stdout.flush())
            .is_ok())
    })?;
    let text_tokens: Vec<u32> = gen
        .tokens
        .iter()
        .copied()
        .filter(|t| !stops.contains(t))
        .collect();
    if a.json {
        let text = match tok {
            Some(t) => t.decode(&text_tokens, true)?,
            None => String::new(),
        };
        let out = json!({
            "prompt_ids": prompt_ids,
            "tokens": gen.tokens,
            "text": text,
            "finish_reason": gen.finish.as_str(),
            "stats": {
                "prompt_tokens": gen.prompt_tokens,
                "generated_tokens": gen.tokens.len(),
                "prefill_tok_s": gen.prefill_tok_s(),
                "decode_tok_s": gen.decode_tok_s(),
                "threads": rayon::current_num_threads(),
                "isa": nectar_kernels::isa(),
            }
        });
        writeln!(stdout, "{out}")?;
    } else {
        if let Some(t) = tok {
            write!(stdout, "{}", dec.finish(t)?)?;
        }
        writeln!(stdout)?;
        eprintln!(
            "[{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, finish: {}, {} threads, {}]",
            gen.prompt_tokens,
            gen.prefill_tok_s(),
            gen.tokens.len(),
            gen.decode_tok_s(),
            gen.finish.as_str(),
            rayon::current_num_threads(),
            nectar_kernels::isa()
        );
    }
    Ok(())
}
