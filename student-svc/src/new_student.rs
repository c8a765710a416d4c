//! Student requests that passed validation: CreateStudent, UpdateStudent and
//! DeactivateStudent.

use platform::{fingerprint::Fingerprint, validate};
use proto::student::v1::{CreateStudentRequest, DeactivateStudentRequest, UpdateStudentRequest};
use student_store::students::Change;
use uuid::Uuid;

use crate::error::Error;

/// The fields of a valid CreateStudent request, exactly as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewStudent {
    pub first_name: String,
    pub last_name: String,
    pub email: String,
    pub document_number: String,
    /// The caller's key for retrying this CreateStudent, if any.
    pub client_key: Option<String>,
}

impl TryFrom<CreateStudentRequest> for NewStudent {
    type Error = Error;

    fn try_from(request: CreateStudentRequest) -> Result<Self, Error> {
        validate::name("first_name", &request.first_name)?;
        validate::name("last_name", &request.last_name)?;
        validate::email("email", &request.email)?;
        validate::document_number("document_number", &request.document_number)?;
        if let Some(key) = &request.idempotency_key {
            validate::idempotency_key("idempotency_key", key)?;
        }
        Ok(Self {
            first_name: request.first_name,
            last_name: request.last_name,
            email: request.email,
            document_number: request.document_number,
            client_key: request.idempotency_key,
        })
    }
}

impl NewStudent {
    /// Student's own rule for names ([`validate::student_name`]), newer than some stored
    /// requests: checked once the request is known not to be a retry of one accepted
    /// before the rule.
    pub fn names_follow_students_rule(&self) -> Result<(), validate::FieldViolation> {
        validate::student_name("first_name", &self.first_name)?;
        validate::student_name("last_name", &self.last_name)
    }

    /// Fingerprint of what was asked for (never the key), to tell a retry of this request
    /// from the same key reused for another one.
    pub fn request_hash(&self) -> String {
        Fingerprint::new()
            .field(&self.first_name)
            .field(&self.last_name)
            .field(&self.email)
            .field(&self.document_number)
            .finish()
    }
}

/// A valid UpdateStudent or DeactivateStudent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StudentChange {
    pub id: Uuid,
    pub change: Change,
    /// Apply only at this version; `None` for any (the request's 0).
    pub expected_version: Option<i64>,
    /// The caller's key for retrying this call, if any.
    pub client_key: Option<String>,
}

impl TryFrom<UpdateStudentRequest> for StudentChange {
    type Error = Error;

    fn try_from(request: UpdateStudentRequest) -> Result<Self, Error> {
        let id = validate::uuid("id", &request.id)?;
        validate::name("first_name", &request.first_name)?;
        validate::name("last_name", &request.last_name)?;
        validate::email("email", &request.email)?;
        if let Some(key) = &request.idempotency_key {
            validate::idempotency_key("idempotency_key", key)?;
        }
        let expected_version = match request.expected_version {
            0 => None,
            version => Some(i64::try_from(version).map_err(|_| {
                validate::FieldViolation::new("expected_version", "is not a version")
            })?),
        };
        Ok(Self {
            id,
            change: Change::Update {
                first_name: request.first_name,
                last_name: request.last_name,
                email: request.email,
            },
            expected_version,
            client_key: request.idempotency_key,
        })
    }
}

impl TryFrom<DeactivateStudentRequest> for StudentChange {
    type Error = Error;

    fn try_from(request: DeactivateStudentRequest) -> Result<Self, Error> {
        let id = validate::uuid("id", &request.id)?;
        if let Some(key) = &request.idempotency_key {
            validate::idempotency_key("idempotency_key", key)?;
        }
        Ok(Self {
            id,
            change: Change::Deactivate,
            expected_version: None,
            client_key: request.idempotency_key,
        })
    }
}

impl StudentChange {
    /// As [`NewStudent::names_follow_students_rule`], for an update's names.
    pub fn names_follow_students_rule(&self) -> Result<(), validate::FieldViolation> {
        match &self.change {
            Change::Update {
                first_name,
                last_name,
                ..
            } => {
                validate::student_name("first_name", first_name)?;
                validate::student_name("last_name", last_name)
            }
            Change::Deactivate => Ok(()),
        }
    }

    /// Fingerprint of what was asked for (never the key): a tag naming the RPC, then its
    /// fields, so a key reused across RPCs or with other fields is told from a retry.
    pub fn request_hash(&self) -> String {
        let id = self.id.hyphenated().to_string();
        let expected = self.expected_version.unwrap_or(0).to_string();
        match &self.change {
            Change::Update {
                first_name,
                last_name,
                email,
            } => Fingerprint::new()
                .field("update-student")
                .field(&id)
                .field(first_name)
                .field(last_name)
                .field(email)
                .field(&expected)
                .finish(),
            Change::Deactivate => Fingerprint::new()
                .field("deactivate-student")
                .field(&id)
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CreateStudentRequest {
        CreateStudentRequest {
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            email: "ana.perez@example.edu".into(),
            document_number: "DOC-1001".into(),
            idempotency_key: Some("enrol-1001".into()),
        }
    }

    #[test]
    fn a_valid_request_is_kept_as_sent() {
        let student = NewStudent::try_from(request()).expect("valid");
        assert_eq!(student.last_name, "Pérez");
        assert_eq!(student.client_key.as_deref(), Some("enrol-1001"));
    }

    type Spoil = fn(&mut CreateStudentRequest);

    #[test]
    fn each_invalid_field_is_named() {
        let cases: [(Spoil, &str); 5] = [
            (|r| r.first_name = String::new(), "first_name"),
            (|r| r.last_name = "x\u{7}".into(), "last_name"),
            (|r| r.email = "not-an-email".into(), "email"),
            (|r| r.document_number = "12 34".into(), "document_number"),
            (|r| r.idempotency_key = Some(" k".into()), "idempotency_key"),
        ];
        for (spoil, field) in cases {
            let mut bad = request();
            spoil(&mut bad);
            assert_eq!(violated_field(NewStudent::try_from(bad)), field);
        }
    }

    fn update() -> UpdateStudentRequest {
        UpdateStudentRequest {
            id: "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a".into(),
            first_name: "Ana".into(),
            last_name: "Gómez".into(),
            email: "ana.gomez@example.edu".into(),
            expected_version: 2,
            idempotency_key: Some("k-1".into()),
        }
    }

    /// The field a request was refused for.
    fn violated_field<T: std::fmt::Debug>(request: Result<T, Error>) -> &'static str {
        match request {
            Err(Error::InvalidArgument(violation)) => violation.field,
            other => panic!("expected a violation, got {other:?}"),
        }
    }

    #[test]
    fn a_valid_change_is_kept_as_sent() {
        let change = StudentChange::try_from(update()).expect("valid");
        assert_eq!(
            change.change,
            Change::Update {
                first_name: "Ana".into(),
                last_name: "Gómez".into(),
                email: "ana.gomez@example.edu".into(),
            }
        );
        assert_eq!(change.expected_version, Some(2));
        assert_eq!(change.client_key.as_deref(), Some("k-1"));
        // 0 asks for no version in particular.
        let any_version = StudentChange::try_from(UpdateStudentRequest {
            expected_version: 0,
            ..update()
        })
        .expect("valid");
        assert_eq!(any_version.expected_version, None);
        let deactivate = StudentChange::try_from(DeactivateStudentRequest {
            id: update().id,
            idempotency_key: None,
        })
        .expect("valid");
        assert_eq!(
            (
                deactivate.change,
                deactivate.expected_version,
                deactivate.client_key
            ),
            (Change::Deactivate, None, None)
        );
    }

    #[test]
    fn each_invalid_field_of_a_change_is_named() {
        type SpoilUpdate = fn(&mut UpdateStudentRequest);
        let cases: [(SpoilUpdate, &str); 6] = [
            (|r| r.id = "not-a-uuid".into(), "id"),
            (|r| r.first_name = String::new(), "first_name"),
            (|r| r.last_name = "x\u{7}".into(), "last_name"),
            (|r| r.email = "not-an-email".into(), "email"),
            (|r| r.expected_version = u64::MAX, "expected_version"),
            (|r| r.idempotency_key = Some(" k".into()), "idempotency_key"),
        ];
        for (spoil, field) in cases {
            let mut bad = update();
            spoil(&mut bad);
            assert_eq!(violated_field(StudentChange::try_from(bad)), field);
        }
        let deactivate = |id: &str, key: &str| DeactivateStudentRequest {
            id: id.into(),
            idempotency_key: Some(key.into()),
        };
        let valid_id = update().id;
        for (bad, field) in [
            (deactivate("", "k-1"), "id"),
            (deactivate(&valid_id, " k"), "idempotency_key"),
        ] {
            assert_eq!(violated_field(StudentChange::try_from(bad)), field);
        }
    }

    /// The layouts the README documents, field by field; a reordered field or a renamed
    /// tag would make every stored fingerprint look like another request after an upgrade.
    #[test]
    fn the_fingerprints_are_the_documented_layouts() {
        let create = NewStudent::try_from(request()).expect("valid");
        assert_eq!(
            create.request_hash(),
            Fingerprint::of(&["Ana", "Pérez", "ana.perez@example.edu", "DOC-1001"])
        );
        let id = "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a";
        // `expected_version` in decimal, 0 for "any version".
        for (expected_version, decimal) in [(3, "3"), (0, "0")] {
            let update = StudentChange::try_from(UpdateStudentRequest {
                id: id.to_uppercase(),
                first_name: "Ana".into(),
                last_name: "Gómez".into(),
                email: "ana.gomez@example.edu".into(),
                expected_version,
                idempotency_key: Some("k-1".into()),
            })
            .expect("valid");
            let fields = [
                "update-student",
                id,
                "Ana",
                "Gómez",
                "ana.gomez@example.edu",
            ];
            assert_eq!(
                update.request_hash(),
                Fingerprint::of(&[&fields[..], &[decimal]].concat())
            );
        }
        let deactivate = StudentChange::try_from(DeactivateStudentRequest {
            id: id.into(),
            idempotency_key: None,
        })
        .expect("valid");
        assert_eq!(
            deactivate.request_hash(),
            Fingerprint::of(&["deactivate-student", id])
        );
    }

    #[test]
    fn the_fingerprint_ignores_the_key_and_covers_every_field() {
        let base = NewStudent::try_from(request()).expect("valid");
        let other_key = NewStudent {
            client_key: Some("another".into()),
            ..base.clone()
        };
        assert_eq!(base.request_hash(), other_key.request_hash());
        let other_email = NewStudent {
            email: "ana@example.edu".into(),
            ..base.clone()
        };
        assert_ne!(base.request_hash(), other_email.request_hash());
    }
}
