//! The effects a Student transaction can decide on, and how each is stored in an outbox
//! row: an `effect_type` and a JSON payload carrying its own format `version`.
//!
//! Adding an effect means: a variant here with its payload type, a Users RPC, and one arm
//! in the relay's delivery. Every row decodes through [`Effect::decode`]; a row that does
//! not (a type or payload version this code does not know) fails visibly, on its own.

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use uuid::Uuid;

/// `effect_type` of the row that asks Users for a student's login user.
pub const CREATE_USER: &str = "create-user";

/// One effect on Users, decided by a Student transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    CreateUser(CreateUserPayload),
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
    /// The `effect_type` this effect is stored under.
    pub fn effect_type(&self) -> &'static str {
        match self {
            Self::CreateUser(_) => CREATE_USER,
        }
    }

    /// The payload as stored.
    pub fn payload(&self) -> serde_json::Value {
        let encoded = match self {
            Self::CreateUser(payload) => serde_json::to_value(payload),
        };
        // Plain structs of strings and numbers always encode.
        encoded.unwrap_or(serde_json::Value::Null)
    }

    /// Decodes a stored row's effect, checking its payload format version.
    pub fn decode(effect_type: &str, payload: &serde_json::Value) -> Result<Self, EffectError> {
        match effect_type {
            CREATE_USER => Ok(Self::CreateUser(read(payload, CreateUserPayload::VERSION)?)),
            other => Err(EffectError::UnknownEffect(other.to_owned())),
        }
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
    fn an_effect_round_trips_through_its_stored_form() {
        let effect = create_user();
        assert_eq!(
            Effect::decode(effect.effect_type(), &effect.payload()),
            Ok(effect)
        );
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
}
