//! Everything a Student use case can fail with, and the one mapping to gRPC statuses.

use platform::validate::FieldViolation;
use sea_orm::DbErr;
use tonic::{Code, Status};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("student {0} not found")]
    NotFound(Uuid),
    #[error("idempotency_key was already used with a different request")]
    KeyReused,
    #[error("a student with this document_number already exists")]
    DocumentNumberTaken,
    #[error("database error")]
    Db(#[from] DbErr),
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        match err {
            Error::InvalidArgument(violation) => Status::invalid_argument(violation.to_string()),
            Error::NotFound(_) => Status::not_found(err.to_string()),
            Error::KeyReused => Status::failed_precondition(err.to_string()),
            Error::DocumentNumberTaken => Status::already_exists(err.to_string()),
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
                Error::InvalidArgument(FieldViolation::new("email", "must not be empty")),
                Code::InvalidArgument,
                "invalid email: must not be empty",
            ),
            (
                Error::NotFound(Uuid::nil()),
                Code::NotFound,
                "student 00000000-0000-0000-0000-000000000000 not found",
            ),
            (
                Error::KeyReused,
                Code::FailedPrecondition,
                "idempotency_key was already used with a different request",
            ),
            (
                Error::DocumentNumberTaken,
                Code::AlreadyExists,
                "a student with this document_number already exists",
            ),
        ];
        for (err, code, message) in cases {
            let status = Status::from(err);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn database_errors_never_reach_the_caller() {
        let status = Status::from(Error::Db(DbErr::Custom(
            "UNIQUE constraint failed: students.email = 'ana@example.edu'".into(),
        )));
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "internal error");
    }
}
