//! Everything a Users use case can fail with, and the one mapping to gRPC statuses.

use platform::validate::FieldViolation;
use sea_orm::DbErr;
use tonic::{Code, Status};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("user {0} not found")]
    NotFound(Uuid),
    #[error(
        "idempotency_key is not in the inbox (never executed, or purged); replay-only requests never create"
    )]
    NotInInbox,
    #[error("idempotency_key was already used with a different request")]
    KeyReused,
    #[error("database error")]
    Db(#[from] DbErr),
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        match err {
            Error::InvalidArgument(violation) => Status::invalid_argument(violation.to_string()),
            Error::NotFound(_) | Error::NotInInbox => Status::not_found(err.to_string()),
            Error::KeyReused => Status::failed_precondition(err.to_string()),
            Error::Db(ref cause) => {
                // The cause goes to the log, never to the caller: it may hold SQL or data.
                tracing::error!(error = %cause, "database error");
                Status::new(Code::Internal, "internal error")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_the_code_a_client_acts_on() {
        let cases = [
            (
                Error::InvalidArgument(FieldViolation::new(
                    "student_id",
                    "must be a hyphenated UUID",
                )),
                Code::InvalidArgument,
            ),
            (Error::NotFound(Uuid::nil()), Code::NotFound),
            (Error::NotInInbox, Code::NotFound),
            (Error::KeyReused, Code::FailedPrecondition),
            (
                Error::Db(DbErr::Custom("relation \"users\" does not exist".into())),
                Code::Internal,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(Status::from(err).code(), code);
        }
    }

    #[test]
    fn messages_name_the_field_and_never_leak_internals() {
        let status = Status::from(Error::InvalidArgument(FieldViolation::new(
            "email",
            "must not be empty",
        )));
        assert_eq!(status.message(), "invalid email: must not be empty");
        let status = Status::from(Error::Db(DbErr::Custom(
            "duplicate key value violates unique constraint".into(),
        )));
        assert_eq!(status.message(), "internal error");
    }
}
