//! A batch as stored and shown: OpenAI's batch object, typed. Stored as its JSON (the same
//! field names OpenAI uses, so documents stored before this type read back); a stored document
//! that does not parse as one is a corrupt record, an error, never a default.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A batch's status, as OpenAI names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    /// Being checked (never stored: fairgate validates before it answers).
    Validating,
    /// Its input was refused; nothing ran.
    Failed,
    /// Lines are running.
    InProgress,
    /// Its completion window ended; running lines finish, then it is `expired`.
    Finalizing,
    /// Every line ran.
    Completed,
    /// Its completion window ended before every line ran.
    Expired,
    /// Cancelled; running lines finish, then it is `cancelled`.
    Cancelling,
    /// Cancelled and finalized.
    Cancelled,
}

impl BatchStatus {
    /// The name stored beside the document (the store's compare-and-set key).
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
        }
    }
}

/// `request_counts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Lines.
    pub total: u64,
    /// Answered 2xx.
    pub completed: u64,
    /// Answered otherwise.
    pub failed: u64,
}

/// OpenAI's batch object (every field, `null` where unset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// `batch_…`.
    pub id: String,
    /// `batch`.
    pub object: String,
    /// The endpoint every line calls.
    pub endpoint: String,
    /// Always `null` (lines may name different models).
    pub model: Option<String>,
    /// The validation errors of a `failed` batch (`{"object":"list","data":[…]}`).
    pub errors: Option<Value>,
    /// The input file.
    pub input_file_id: String,
    /// As the client gave it (`24h`…).
    pub completion_window: String,
    /// The status.
    pub status: BatchStatus,
    /// Answers 2xx, once finalized.
    pub output_file_id: Option<String>,
    /// Every other line, once finalized.
    pub error_file_id: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// Unix seconds.
    pub in_progress_at: Option<u64>,
    /// Unix seconds: `created_at` + the completion window.
    pub expires_at: Option<u64>,
    /// Unix seconds.
    pub finalizing_at: Option<u64>,
    /// Unix seconds.
    pub completed_at: Option<u64>,
    /// Unix seconds.
    pub failed_at: Option<u64>,
    /// Unix seconds.
    pub expired_at: Option<u64>,
    /// Unix seconds.
    pub cancelling_at: Option<u64>,
    /// Unix seconds.
    pub cancelled_at: Option<u64>,
    /// Line counts.
    pub request_counts: RequestCounts,
    /// The client's metadata, as given.
    pub metadata: Value,
}

impl Batch {
    /// The stored document `raw`, or `None` when it is not a batch (a corrupt record).
    pub fn parse(raw: &str) -> Option<Self> {
        serde_json::from_str(raw).ok()
    }

    /// The document to store.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// As a JSON value (an answer's body).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Marks the final `status` at `now` (`finalizing_at` and the status's own stamp; an
    /// expired batch's `expired_at` was stamped when its window ended).
    pub fn finalized(&mut self, status: BatchStatus, now: u64) {
        self.status = status;
        self.finalizing_at = Some(now);
        match status {
            BatchStatus::Completed => self.completed_at = Some(now),
            BatchStatus::Cancelled => self.cancelled_at = Some(now),
            BatchStatus::Failed => self.failed_at = Some(now),
            _ => {}
        }
    }
}
