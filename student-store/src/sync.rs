//! The state of a student's login user as clients see it, computed here and only here,
//! from the structured fields of its outbox row (status, failure kind, error code and
//! message), never by parsing a string.

use crate::entity::{
    outbox::{self, FailureKind, OutboxStatus},
    students,
};

/// Where the login user of a student is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// No create-user row and no user (a student from before the outbox existed).
    Unknown,
    /// Being created.
    Pending,
    /// Created and linked.
    Linked,
    /// Not created, for the reason given; an operator can act on it.
    Failed(LinkError),
}

/// Why a student has no login user: a stable reason and a readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkError {
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for LinkError {
    /// `REASON: message`, the form of the API's `link_error`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// The link state of a student, given its `create-user` row.
pub fn link_state(student: &students::Model, create_user: Option<&outbox::Model>) -> LinkState {
    let Some(row) = create_user else {
        // Linked without a row: created by `--link-mode direct`.
        return match student.user_id {
            Some(_) => LinkState::Linked,
            None => LinkState::Unknown,
        };
    };
    match row.status {
        OutboxStatus::Done => LinkState::Linked,
        OutboxStatus::Pending | OutboxStatus::Processing => LinkState::Pending,
        OutboxStatus::Failed => LinkState::Failed(failure(row)),
    }
}

/// Why a failed row failed. Running out of attempts shows a fixed sentence, never the
/// transport error the relay recorded for operators; a rejection shows its reason and
/// message.
fn failure(row: &outbox::Model) -> LinkError {
    if row.failure_kind == Some(FailureKind::Exhausted) {
        return LinkError {
            reason: "USERS_UNREACHABLE".to_owned(),
            message: "the login user could not be created; an operator can redrive it".to_owned(),
        };
    }
    LinkError {
        reason: row
            .error_code
            .clone()
            .unwrap_or_else(|| "REJECTED".to_owned()),
        message: row.last_error.clone().unwrap_or_default(),
    }
}
