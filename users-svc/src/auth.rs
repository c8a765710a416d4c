//! Bearer-token authentication of the Users API. Users creates accounts, so when tokens are
//! configured only callers that present one of them (the relay, operators) may call any
//! UsersService method. Health and reflection stay open: they reveal nothing and
//! monitors need them.
//!
//! Several tokens may be accepted at once, so a token is rotated without a failed call:
//! accept old and new, move every caller to the new one, then drop the old one.

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tonic::{Request, Status, service::Interceptor};

/// A shared secret of at least [`AuthToken::MIN_BYTES`] bytes. Its `Debug` never shows it.
#[derive(Clone)]
pub struct AuthToken {
    digest: [u8; 32],
}

impl AuthToken {
    /// The shortest token accepted: shorter ones are guessable.
    pub const MIN_BYTES: usize = 16;

    /// Accepts `token` if it is long enough.
    pub fn new(token: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            token.len() >= Self::MIN_BYTES,
            "every USERS_AUTH_TOKEN token must be at least {} bytes long",
            Self::MIN_BYTES
        );
        Ok(Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    /// Compares in constant time. Both sides are hashed first, so not even the token's
    /// length leaks through timing.
    fn matches(&self, given: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        self.digest.ct_eq(&given).into()
    }
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(***)")
    }
}

/// The tokens users-svc accepts: one, or several while a token is being rotated.
#[derive(Clone, Debug)]
pub struct AcceptedTokens(Vec<AuthToken>);

impl AcceptedTokens {
    /// Parses a comma-separated list (`USERS_AUTH_TOKEN=old,new`); every token must be long
    /// enough, and there must be at least one.
    pub fn parse(list: &str) -> anyhow::Result<Self> {
        let tokens = list
            .split(',')
            .map(AuthToken::new)
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self(tokens))
    }

    /// How many tokens are accepted (2 during a rotation).
    pub fn count(&self) -> usize {
        self.0.len()
    }

    /// Tells whether `given` is one of the tokens. Every token is compared, in constant
    /// time, whichever matches: the timing reveals neither which one nor how many.
    fn accepts(&self, given: &str) -> bool {
        self.0
            .iter()
            .fold(false, |found, token| token.matches(given) | found)
    }
}

/// Rejects calls without `authorization: Bearer <token>` when tokens are configured.
#[derive(Clone, Debug)]
pub struct RequireToken(pub Option<AcceptedTokens>);

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(tokens) = &self.0 else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match presented {
            Some(given) if tokens.accepts(given) => Ok(request),
            // The same answer whether the header is missing, malformed or wrong.
            _ => {
                crate::metrics::rejected("UNAUTHENTICATED");
                Err(Status::unauthenticated("missing or invalid bearer token"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-secret";
    const NEXT: &str = "fedcba9876543210-rotated";

    fn call(tokens: Option<&str>, header: Option<&str>) -> Result<(), Status> {
        let mut interceptor =
            RequireToken(tokens.map(|t| AcceptedTokens::parse(t).expect("long enough")));
        let mut request = Request::new(());
        if let Some(header) = header {
            request
                .metadata_mut()
                .insert("authorization", header.parse().expect("ascii"));
        }
        interceptor.call(request).map(drop)
    }

    #[test]
    fn the_right_bearer_token_passes() {
        assert!(call(Some(TOKEN), Some(&format!("Bearer {TOKEN}"))).is_ok());
    }

    #[test]
    fn missing_malformed_or_wrong_tokens_get_one_answer() {
        for header in [
            None,
            Some("Bearer nope"),
            Some(TOKEN),
            Some("Basic abc"),
            Some("Bearer "),
        ] {
            let status = call(Some(TOKEN), header).expect_err("refused");
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
            assert_eq!(status.message(), "missing or invalid bearer token");
        }
    }

    #[test]
    fn during_a_rotation_both_tokens_pass_and_nothing_else() {
        let both = format!("{TOKEN},{NEXT}");
        assert!(call(Some(&both), Some(&format!("Bearer {TOKEN}"))).is_ok());
        assert!(call(Some(&both), Some(&format!("Bearer {NEXT}"))).is_ok());
        for header in [format!("Bearer {both}"), "Bearer nope".to_owned()] {
            assert!(call(Some(&both), Some(&header)).is_err(), "{header}");
        }
        let err = AcceptedTokens::parse(&format!("{TOKEN},short")).expect_err("one too short");
        assert_eq!(
            err.to_string(),
            "every USERS_AUTH_TOKEN token must be at least 16 bytes long"
        );
        assert!(
            AcceptedTokens::parse(&format!("{TOKEN},")).is_err(),
            "an empty entry"
        );
    }

    #[test]
    fn without_a_configured_token_everything_passes() {
        assert!(call(None, None).is_ok());
    }

    #[test]
    fn short_tokens_are_refused_and_debug_hides_the_token() {
        let err = AuthToken::new("short").expect_err("too short");
        assert_eq!(
            err.to_string(),
            "every USERS_AUTH_TOKEN token must be at least 16 bytes long"
        );
        let token = AuthToken::new(TOKEN).expect("long enough");
        assert_eq!(format!("{token:?}"), "AuthToken(***)");
    }

    /// The minimum length is inclusive: a token of exactly MIN_BYTES is accepted, one byte
    /// less is refused.
    #[test]
    fn a_token_of_exactly_the_minimum_length_is_accepted() {
        let exact = "a".repeat(AuthToken::MIN_BYTES);
        assert_eq!(exact.len(), 16);
        AuthToken::new(&exact).expect("16 bytes is long enough");
        let short = "a".repeat(AuthToken::MIN_BYTES - 1);
        let err = AuthToken::new(&short).expect_err("15 bytes is too short");
        assert_eq!(
            err.to_string(),
            "every USERS_AUTH_TOKEN token must be at least 16 bytes long"
        );
    }
}
