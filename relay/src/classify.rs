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

/// Classifies a Users error status.
///
/// `NOT_FOUND` is transient (a proxy's answer, say), except Users' own `USER_NOT_FOUND`
/// for a change: the relay names the user its student is linked to, a user Users created
/// and never deletes, so Users not finding it means Users lost it (restored from an older
/// backup, deleted by hand); nothing is saved under the key, but no retry brings the user
/// back, only a repair (`relay audit` names it).
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
        Code::NotFound if platform::status::reason(status).as_deref() == Some(USER_NOT_FOUND) => {
            Failure::Permanent
        }
        _ => Failure::Transient,
    }
}

/// The `ErrorInfo` reason Users gives a change naming a user it does not have.
pub const USER_NOT_FOUND: &str = "USER_NOT_FOUND";

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

    #[test]
    fn only_users_own_user_not_found_is_a_permanent_not_found() {
        let lost = platform::status::with_reason(
            Code::NotFound,
            "user 0190f3c4-0000-7000-8000-000000000000 not found",
            USER_NOT_FOUND,
            "users.v1",
        );
        assert_eq!(classify(&lost), Failure::Permanent);
        assert_eq!(
            permanent_failure_kind(USER_NOT_FOUND),
            FailureKind::Rejected
        );
        let other = platform::status::with_reason(Code::NotFound, "", "NOT_IN_INBOX", "users.v1");
        assert_eq!(classify(&other), Failure::Transient);
    }
}
