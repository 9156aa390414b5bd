//! The stop set: which generated ids end the assistant's turn.

use serde_json::Value;

/// The ids that end generation: the union, sorted and deduplicated, of
/// `eos_token_id` in `config.json` (also under `text_config`, where
/// multimodal configs keep it) and in `generation_config.json`. Each may be
/// an integer, a list of integers, or absent/null.
///
/// The set is never filtered down. GLM ends an assistant turn by emitting
/// the *next* turn's role token — `<|user|>`, or `<|observation|>` after a
/// tool call — and lists those as eos ids beside `<|endoftext|>`; dropping
/// them makes the model write both sides of the conversation.
pub fn stop_token_ids(config: &Value, generation_config: Option<&Value>) -> Vec<u32> {
    let mut ids = Vec::new();
    collect(config.get("eos_token_id"), "config.json", &mut ids);
    if let Some(text_config) = config.get("text_config") {
        collect(
            text_config.get("eos_token_id"),
            "config.json text_config",
            &mut ids,
        );
    }
    if let Some(generation_config) = generation_config {
        collect(
            generation_config.get("eos_token_id"),
            "generation_config.json",
            &mut ids,
        );
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn collect(value: Option<&Value>, origin: &str, out: &mut Vec<u32>) {
    match value {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                push_id(item, origin, out);
            }
        }
        Some(item) => push_id(item, origin, out),
    }
}

/// A value that cannot be a token id is skipped with a warning rather than
/// failing the load: the remaining ids still stop generation correctly.
fn push_id(value: &Value, origin: &str, out: &mut Vec<u32>) {
    match value.as_u64().and_then(|id| u32::try_from(id).ok()) {
        Some(id) => out.push(id),
        None => {
            tracing::warn!(%origin, %value, "ignoring eos_token_id entry that is not a token id")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn union_of_both_files() {
        let config = json!({"eos_token_id": [8160, 8167]});
        let generation = json!({"eos_token_id": [8169, 8160]});
        assert_eq!(
            stop_token_ids(&config, Some(&generation)),
            [8160, 8167, 8169]
        );
    }

    #[test]
    fn scalars_nulls_and_absence() {
        assert_eq!(stop_token_ids(&json!({"eos_token_id": 2}), None), [2]);
        assert_eq!(
            stop_token_ids(&json!({"eos_token_id": null}), Some(&json!({}))),
            Vec::<u32>::new()
        );
        assert_eq!(
            stop_token_ids(&json!({}), Some(&json!({"eos_token_id": 7}))),
            [7]
        );
    }

    #[test]
    fn text_config_is_included() {
        let config = json!({"text_config": {"eos_token_id": [5, 3]}, "eos_token_id": 5});
        assert_eq!(stop_token_ids(&config, None), [3, 5]);
    }

    #[test]
    fn non_ids_are_skipped_not_fatal() {
        let config = json!({"eos_token_id": [1, -1, "x", 1.5, 4294967296u64, 9]});
        assert_eq!(stop_token_ids(&config, None), [1, 9]);
    }
}
