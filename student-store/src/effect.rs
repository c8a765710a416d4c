//! The effects a Student transaction can decide on, and how each is stored in an outbox
//! row: an `effect_type` and a JSON payload carrying its own format `version`.
//!
//! Adding an effect means: a variant here and in [`EffectType`], with its payload type and
//! the [`Operation`] it is, a Users RPC, and one arm in the relay's delivery; the compiler
//! points at each `match` that must learn it. Every row decodes through [`Effect::decode`];
//! a row that does not (a type or payload version this code does not know) fails visibly,
//! on its own.

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use uuid::Uuid;

/// `effect_type` of the row that asks Users for a student's login user.
pub const CREATE_USER: &str = "create-user";
/// `effect_type` of the row that carries a student's changed names or e-mail to its user.
pub const UPDATE_USER: &str = "update-user";
/// `effect_type` of the row that disables the user of a deactivated student.
pub const DISABLE_USER: &str = "disable-user";

/// The kinds of effect, as a row names them in `effect_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectType {
    CreateUser,
    UpdateUser,
    DisableUser,
}

/// What an effect does to Users, which is what the tools that send rows again after
/// something went wrong (`relay retry-failed --new-key`, `relay resend`) must know to do it
/// safely. Every [`EffectType`] says which it is; an effect that is neither needs a variant
/// here, and the compiler then points at each tool's `match` that must decide for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Creates the student's one user. Users knows a repeat only by its key: under a new
    /// key, or resent after Users forgot the key, it would create a second user, so the
    /// tools look for the student's user first.
    CreatesTheUser,
    /// Changes the user the student is linked to, to a student version. Users applies each
    /// version at most once whatever the key, so a new key or a resend cannot apply it
    /// twice; it goes to the linked user, so the student must be linked first.
    ChangesTheLinkedUser,
}

impl EffectType {
    /// The type a row names, if this code knows it.
    pub fn parse(effect_type: &str) -> Option<Self> {
        match effect_type {
            CREATE_USER => Some(Self::CreateUser),
            UPDATE_USER => Some(Self::UpdateUser),
            DISABLE_USER => Some(Self::DisableUser),
            _ => None,
        }
    }

    /// The `effect_type` a row of this type is stored under.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreateUser => CREATE_USER,
            Self::UpdateUser => UPDATE_USER,
            Self::DisableUser => DISABLE_USER,
        }
    }

    /// What an effect of this type does to Users.
    pub fn operation(self) -> Operation {
        match self {
            Self::CreateUser => Operation::CreatesTheUser,
            Self::UpdateUser | Self::DisableUser => Operation::ChangesTheLinkedUser,
        }
    }
}

/// One effect on Users, decided by a Student transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    CreateUser(CreateUserPayload),
    UpdateUser(UpdateUserPayload),
    DisableUser(DisableUserPayload),
}

/// Why a stored row does not decode into an [`Effect`]. Either way no attempt can ever
/// deliver it, so the relay fails the row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectError {
    #[error("effect type {0:?} is not known to this relay")]
    UnknownEffect(String),
    /// The payload is not valid for its type, or has a format version this code does not
    /// read. (The reason never quotes the payload: it holds personal data.)
    #[error("the stored payload cannot be decoded: {0}")]
    UnreadablePayload(String),
}

impl EffectError {
    /// The stable reason recorded on the row.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownEffect(_) => "UNKNOWN_EFFECT",
            Self::UnreadablePayload(_) => "UNREADABLE_PAYLOAD",
        }
    }
}

impl Effect {
    /// This effect's type.
    pub fn kind(&self) -> EffectType {
        match self {
            Self::CreateUser(_) => EffectType::CreateUser,
            Self::UpdateUser(_) => EffectType::UpdateUser,
            Self::DisableUser(_) => EffectType::DisableUser,
        }
    }

    /// The `effect_type` this effect is stored under.
    pub fn effect_type(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The payload as stored.
    pub fn payload(&self) -> serde_json::Value {
        let encoded = match self {
            Self::CreateUser(payload) => serde_json::to_value(payload),
            Self::UpdateUser(payload) => serde_json::to_value(payload),
            Self::DisableUser(payload) => serde_json::to_value(payload),
        };
        // Plain structs of strings and numbers always encode.
        encoded.unwrap_or(serde_json::Value::Null)
    }

    /// Decodes a stored row's effect, checking its payload format version.
    pub fn decode(effect_type: &str, payload: &serde_json::Value) -> Result<Self, EffectError> {
        let Some(kind) = EffectType::parse(effect_type) else {
            return Err(EffectError::UnknownEffect(effect_type.to_owned()));
        };
        Ok(match kind {
            EffectType::CreateUser => Self::CreateUser(read(payload, CreateUserPayload::VERSION)?),
            EffectType::UpdateUser => Self::UpdateUser(read(payload, UpdateUserPayload::VERSION)?),
            EffectType::DisableUser => {
                Self::DisableUser(read(payload, DisableUserPayload::VERSION)?)
            }
        })
    }
}

/// Decodes a payload of format `version`.
fn read<T: DeserializeOwned>(payload: &serde_json::Value, version: u32) -> Result<T, EffectError> {
    let found = payload.get("version").and_then(serde_json::Value::as_u64);
    if found != Some(u64::from(version)) {
        return Err(EffectError::UnreadablePayload(match found {
            Some(found) => format!("payload version {found}, this code reads version {version}"),
            None => "no payload version".to_owned(),
        }));
    }
    // The serde error is not kept: it may quote the payload's personal data.
    serde_json::from_value(payload.clone()).map_err(|err| {
        EffectError::UnreadablePayload(format!(
            "invalid at line {} column {}",
            err.line(),
            err.column()
        ))
    })
}

/// The `create-user` payload: a snapshot of what Users needs, taken when the student was
/// created, so every delivery attempt sends exactly the same request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateUserPayload {
    /// Payload format version, so old rows stay readable after the format changes.
    pub version: u32,
    pub email: String,
    pub first_name: String,
    pub last_name: String,
    pub document_number: String,
    pub student_id: Uuid,
}

impl CreateUserPayload {
    /// The payload format this code writes and reads.
    pub const VERSION: u32 = 1;
}

/// The `update-user` payload: the student's names and e-mail as of `source_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateUserPayload {
    /// Payload format version.
    pub version: u32,
    pub student_id: Uuid,
    pub first_name: String,
    pub last_name: String,
    pub email: String,
    /// The student's version after the change; Users applies it only if it is newer than
    /// what the user already reflects.
    pub source_version: u64,
}

impl UpdateUserPayload {
    /// The payload format this code writes and reads.
    pub const VERSION: u32 = 1;
}

/// The `disable-user` payload: the student was deactivated at `source_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisableUserPayload {
    /// Payload format version.
    pub version: u32,
    pub student_id: Uuid,
    /// The student's version after the deactivation.
    pub source_version: u64,
}

impl DisableUserPayload {
    /// The payload format this code writes and reads.
    pub const VERSION: u32 = 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_user() -> Effect {
        Effect::CreateUser(CreateUserPayload {
            version: CreateUserPayload::VERSION,
            email: "ana@example.edu".into(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            document_number: "DOC-1".into(),
            student_id: Uuid::nil(),
        })
    }

    #[test]
    fn every_effect_round_trips_through_its_stored_form() {
        let effects = [
            create_user(),
            Effect::UpdateUser(UpdateUserPayload {
                version: UpdateUserPayload::VERSION,
                student_id: Uuid::nil(),
                first_name: "Ana".into(),
                last_name: "Gómez".into(),
                email: "ana.gomez@example.edu".into(),
                source_version: 2,
            }),
            Effect::DisableUser(DisableUserPayload {
                version: DisableUserPayload::VERSION,
                student_id: Uuid::nil(),
                source_version: 3,
            }),
        ];
        for effect in effects {
            assert_eq!(
                Effect::decode(effect.effect_type(), &effect.payload()),
                Ok(effect)
            );
        }
    }

    /// Rows written by this release (and the last ones, during a rolling deploy) stay
    /// readable: each type's stored form at format 1, written out as it is in the table.
    #[test]
    fn rows_stored_at_format_1_read_back() {
        let student = Uuid::nil();
        for (effect_type, stored) in [
            (
                CREATE_USER,
                serde_json::json!({"version": 1, "email": "ana@example.edu", "first_name": "Ana",
                    "last_name": "Gómez", "document_number": "DOC-1", "student_id": student}),
            ),
            (
                UPDATE_USER,
                serde_json::json!({"version": 1, "student_id": student, "first_name": "Ana",
                    "last_name": "Gómez", "email": "ana@example.edu", "source_version": 2}),
            ),
            (
                DISABLE_USER,
                serde_json::json!({"version": 1, "student_id": student, "source_version": 3}),
            ),
        ] {
            let effect = Effect::decode(effect_type, &stored);
            assert_eq!(
                effect.map(|effect| effect.payload()),
                Ok(stored),
                "{effect_type}"
            );
        }
    }

    /// The tools that send rows again treat only a creation as able to make a second user.
    #[test]
    fn each_type_reads_back_from_its_name_and_only_create_user_creates_the_user() {
        for (kind, operation) in [
            (EffectType::CreateUser, Operation::CreatesTheUser),
            (EffectType::UpdateUser, Operation::ChangesTheLinkedUser),
            (EffectType::DisableUser, Operation::ChangesTheLinkedUser),
        ] {
            assert_eq!(EffectType::parse(kind.as_str()), Some(kind));
            assert_eq!(kind.operation(), operation, "{kind:?}");
        }
        assert_eq!(EffectType::parse("send-flowers"), None);
    }

    #[test]
    fn unknown_types_and_unreadable_payloads_are_named() {
        let effect = create_user();
        assert_eq!(
            Effect::decode("send-flowers", &effect.payload()).map_err(|e| e.code()),
            Err("UNKNOWN_EFFECT")
        );
        let mut newer = effect.payload();
        newer["version"] = 2.into();
        assert_eq!(
            Effect::decode(CREATE_USER, &newer),
            Err(EffectError::UnreadablePayload(
                "payload version 2, this code reads version 1".into()
            ))
        );
        let mut broken = effect.payload();
        broken["email"] = 7.into();
        let err = Effect::decode(CREATE_USER, &broken).expect_err("unreadable");
        assert_eq!(err.code(), "UNREADABLE_PAYLOAD");
        assert!(!err.to_string().contains('7'), "never quotes the payload");
    }

    /// Only the exact format version is read: an older version or none at all is refused,
    /// saying which.
    #[test]
    fn a_payload_of_an_older_version_or_none_is_refused() {
        let effect = create_user();
        let mut older = effect.payload();
        older["version"] = 0.into();
        assert_eq!(
            Effect::decode(CREATE_USER, &older),
            Err(EffectError::UnreadablePayload(
                "payload version 0, this code reads version 1".into()
            ))
        );
        let mut unversioned = effect.payload();
        unversioned
            .as_object_mut()
            .expect("a payload is a JSON object")
            .remove("version");
        assert_eq!(
            Effect::decode(CREATE_USER, &unversioned),
            Err(EffectError::UnreadablePayload("no payload version".into()))
        );
    }
}
