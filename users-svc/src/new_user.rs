//! A CreateUser request that passed validation.

use platform::{fingerprint::Fingerprint, validate};
use proto::users::v1::CreateUserRequest;
use uuid::Uuid;

use crate::error::Error;

/// The fields of a valid CreateUser request, exactly as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUser {
    pub idempotency_key: String,
    pub email: String,
    pub first_name: String,
    pub last_name: String,
    pub document_number: String,
    pub student_id: Uuid,
}

impl TryFrom<CreateUserRequest> for NewUser {
    type Error = Error;

    fn try_from(request: CreateUserRequest) -> Result<Self, Error> {
        validate::idempotency_key("idempotency_key", &request.idempotency_key)?;
        validate::email("email", &request.email)?;
        validate::name("first_name", &request.first_name)?;
        validate::name("last_name", &request.last_name)?;
        validate::document_number("document_number", &request.document_number)?;
        let student_id = validate::uuid("student_id", &request.student_id)?;
        Ok(Self {
            idempotency_key: request.idempotency_key,
            email: request.email,
            first_name: request.first_name,
            last_name: request.last_name,
            document_number: request.document_number,
            student_id,
        })
    }
}

impl NewUser {
    /// SHA-256 over the request fields in a fixed order, length-prefixed, with the student id
    /// as a lowercase hyphenated UUID. It never covers the key or any metadata, so a
    /// redelivery (new trace, new attempt number) fingerprints the same.
    pub fn request_hash(&self) -> String {
        Fingerprint::new()
            .field(&self.email)
            .field(&self.first_name)
            .field(&self.last_name)
            .field(&self.document_number)
            .field(&self.student_id.hyphenated().to_string())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CreateUserRequest {
        CreateUserRequest {
            idempotency_key: "0b6f7a8e-3d0c-4c39-9a57-1f3d2a4b5c6d".into(),
            email: "ana.perez@example.edu".into(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            document_number: "DOC-1001".into(),
            student_id: "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a".into(),
        }
    }

    #[test]
    fn the_fingerprint_is_the_documented_digest() {
        let user = NewUser::try_from(request()).expect("valid");
        let mut expected = Vec::new();
        for field in [
            "ana.perez@example.edu",
            "Ana",
            "Pérez",
            "DOC-1001",
            "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a",
        ] {
            expected.extend_from_slice(&(field.len() as u64).to_be_bytes());
            expected.extend_from_slice(field.as_bytes());
        }
        use sha2::Digest as _;
        let digest: String = sha2::Sha256::digest(&expected)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(user.request_hash(), digest);
    }

    #[test]
    fn the_fingerprint_ignores_the_key_and_the_uuid_spelling() {
        let base = NewUser::try_from(request()).expect("valid");
        let mut other = request();
        other.idempotency_key = "another-key".into();
        other.student_id = other.student_id.to_uppercase();
        let other = NewUser::try_from(other).expect("valid");
        assert_eq!(base.request_hash(), other.request_hash());
    }

    #[test]
    fn a_missing_key_is_named() {
        let mut bad = request();
        bad.idempotency_key.clear();
        match NewUser::try_from(bad) {
            Err(Error::InvalidArgument(violation)) => {
                assert_eq!(violation.field, "idempotency_key")
            }
            other => panic!("expected an idempotency_key violation, got {other:?}"),
        }
    }

    #[test]
    fn a_malformed_student_id_is_named() {
        let mut bad = request();
        bad.student_id = "student-42".into();
        match NewUser::try_from(bad) {
            Err(Error::InvalidArgument(violation)) => assert_eq!(violation.field, "student_id"),
            other => panic!("expected a student_id violation, got {other:?}"),
        }
    }
}
