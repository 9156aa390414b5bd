//! Stored Responses-API responses, for `previous_response_id` continuation and
//! `GET /v1/responses/{id}`. Bounded: past the capacity the oldest response is dropped (a
//! continuation of it then gets 404, as for any unknown id). In memory only: responses do not
//! survive a restart.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// One stored response.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    /// The conversation up to and including this response's output, as chat-template messages
    /// (instructions excluded: they do not carry over to a continuation).
    pub conversation: Vec<Value>,
    /// The response object as returned to the client.
    pub response: Value,
    /// The request's input items, each with an id (`GET /v1/responses/{id}/input_items`).
    pub input_items: Vec<Value>,
}

/// The store.
#[derive(Debug)]
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<(HashMap<String, StoredResponse>, VecDeque<String>)>,
}

impl ResponseStore {
    /// A store keeping at most `capacity` responses.
    pub fn new(capacity: usize) -> ResponseStore {
        ResponseStore {
            capacity: capacity.max(1),
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// Stores `r` under `id`.
    pub fn put(&self, id: String, r: StoredResponse) {
        // A poisoned lock only means another request panicked mid-insert; the map is still
        // usable, and one request's bug must not disable the store for the others.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        if map.insert(id.clone(), r).is_none() {
            order.push_back(id);
        }
        while order.len() > self.capacity {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// The response stored under `id`.
    pub fn get(&self, id: &str) -> Option<StoredResponse> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.get(id).cloned()
    }

    /// Forgets the response stored under `id`; `false` when there was none.
    pub fn remove(&self, id: &str) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        if map.remove(id).is_none() {
            return false;
        }
        order.retain(|k| k != id);
        true
    }

    /// Number of stored responses.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r(n: i64) -> StoredResponse {
        StoredResponse {
            conversation: vec![json!(n)],
            response: json!({"n": n}),
            input_items: vec![],
        }
    }

    #[test]
    fn oldest_is_dropped_past_capacity() {
        let s = ResponseStore::new(2);
        s.put("a".into(), r(1));
        s.put("b".into(), r(2));
        s.put("c".into(), r(3));
        assert!(s.get("a").is_none());
        assert_eq!(s.get("c").unwrap().response, json!({"n": 3}));
        assert_eq!(s.len(), 2);
        assert!(s.remove("b") && !s.remove("b"));
        assert!(s.get("b").is_none());
        assert_eq!(s.len(), 1);
    }
}
