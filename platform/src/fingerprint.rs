//! Request fingerprints: SHA-256 over validated fields in a fixed order, each prefixed by
//! its length, so `("ab", "c")` and `("a", "bc")` never collide. A fingerprint covers what
//! the caller asked for, never the idempotency key, metadata or delivery facts.

use sha2::{Digest, Sha256};

/// Builds a fingerprint field by field.
#[derive(Default)]
pub struct Fingerprint(Sha256);

impl Fingerprint {
    /// Starts an empty fingerprint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one field: its byte length (8 bytes, big-endian), then its bytes.
    pub fn field(mut self, value: &str) -> Self {
        self.0.update((value.len() as u64).to_be_bytes());
        self.0.update(value.as_bytes());
        self
    }

    /// The fingerprint of `fields`, in order: what the request types' layouts are
    /// checked against.
    pub fn of(fields: &[&str]) -> String {
        fields
            .iter()
            .fold(Self::new(), |fingerprint, field| fingerprint.field(field))
            .finish()
    }

    /// Returns the digest as 64 lowercase hex characters.
    pub fn finish(self) -> String {
        self.0
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefix_keeps_field_boundaries_apart() {
        let a = Fingerprint::new().field("ab").field("c").finish();
        let b = Fingerprint::new().field("a").field("bc").finish();
        assert_ne!(a, b);
    }

    #[test]
    fn same_fields_give_the_same_known_digest() {
        let digest = Fingerprint::new().field("").finish();
        // SHA-256 of eight zero bytes: the length prefix of one empty field.
        assert_eq!(
            digest,
            "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc"
        );
        assert_eq!(digest.len(), 64);
    }

    #[test]
    fn of_is_field_by_field() {
        let by_field = Fingerprint::new().field("a").field("").field("bc").finish();
        assert_eq!(Fingerprint::of(&["a", "", "bc"]), by_field);
    }

    #[test]
    fn field_order_matters() {
        let a = Fingerprint::new().field("x").field("y").finish();
        let b = Fingerprint::new().field("y").field("x").finish();
        assert_ne!(a, b);
    }
}
