//! Which answers from Users are final and which are worth another attempt.

use student_store::entity::outbox::FailureKind;
use tonic::{Code, Status};

/// Whether a failed delivery should be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Users judged the request and said no; the same request with the same key will get
    /// the same answer, so retrying cannot help.
    Permanent,
    /// Users did not judge the request (down, overloaded, too slow, connection lost, the
    /// relay's token refused, or a code this relay does not know): try again later with
    /// the same key.
    Transient,
}

/// Classifies a CreateUser error status.
///
/// `UNAUTHENTICATED` and `PERMISSION_DENIED` are transient: Users' interceptor answers them
/// before the request reaches the inbox, so they say nothing about the operation, only
/// about the relay's token, and a fixed token (or a finished rotation) makes the same key
/// succeed. Failing rows for them would turn one typo into a whole backlog of FAILED
/// students.
pub fn classify(status: &Status) -> Failure {
    match status.code() {
        Code::InvalidArgument
        | Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::OutOfRange => Failure::Permanent,
        _ => Failure::Transient,
    }
}

/// The `ErrorInfo` reason Users gives a key older than its inbox retention that it does not
/// have: it cannot tell whether the key ran, so it executed nothing.
pub const DELIVERY_EXPIRED: &str = "DELIVERY_EXPIRED";

/// Why a permanent failure failed its row: `DELIVERY_EXPIRED` is a kind of its own, since
/// redriving it needs an operator's check first (see `retry-failed`).
pub fn permanent_failure_kind(reason: &str) -> FailureKind {
    if reason == DELIVERY_EXPIRED {
        FailureKind::Expired
    } else {
        FailureKind::Rejected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_are_permanent_and_everything_else_transient() {
        let permanent = [
            Code::InvalidArgument,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::OutOfRange,
        ];
        for code in permanent {
            assert_eq!(
                classify(&Status::new(code, "")),
                Failure::Permanent,
                "{code:?}"
            );
        }
        let transient = [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Unknown,
            Code::Internal,
            Code::NotFound,
            Code::Unimplemented,
            Code::DataLoss,
            Code::Unauthenticated,
            Code::PermissionDenied,
        ];
        for code in transient {
            assert_eq!(
                classify(&Status::new(code, "")),
                Failure::Transient,
                "{code:?}"
            );
        }
    }
}
