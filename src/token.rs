//! Sensor tokens: `obs1.<keyId>.<sig>` (DESIGN §6).
//!
//! The sensor only checks the shape and reads `keyId` (for the default actor `mcp:<keyId>`); it
//! never verifies the signature, which needs the ingest's secret. Verification lives in
//! [`crate::ingest::keys`]. A token is a secret: its `Debug` form never shows the signature.

use std::fmt;

/// Token prefix; bumping it is how a future key format would be told apart.
pub const TOKEN_PREFIX: &str = "obs1";

/// Longest keyId we accept; keyIds are minted by the ingest and are short.
pub const MAX_KEY_ID_LEN: usize = 64;

/// A syntactically valid sensor token.
#[derive(Clone, PartialEq, Eq)]
pub struct SensorToken {
    raw: String,
    key_id_end: usize,
}

/// Why a token string is not a sensor token. The message never echoes the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("token must look like obs1.<keyId>.<sig>")]
    Shape,
    #[error("token keyId must be 1-64 characters of [A-Za-z0-9_-]")]
    KeyId,
    #[error("token signature must be non-empty base64url without padding")]
    Signature,
}

impl SensorToken {
    pub fn parse(s: &str) -> Result<Self, TokenError> {
        let s = s.trim();
        let mut parts = s.split('.');
        let (Some(prefix), Some(key_id), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Shape);
        };
        if prefix != TOKEN_PREFIX {
            return Err(TokenError::Shape);
        }
        if key_id.is_empty() || key_id.len() > MAX_KEY_ID_LEN || !key_id.bytes().all(is_b64url) {
            return Err(TokenError::KeyId);
        }
        if sig.is_empty() || !sig.bytes().all(is_b64url) {
            return Err(TokenError::Signature);
        }
        Ok(SensorToken {
            raw: s.to_string(),
            key_id_end: TOKEN_PREFIX.len() + 1 + key_id.len(),
        })
    }

    /// The key id between the dots.
    pub fn key_id(&self) -> &str {
        &self.raw[TOKEN_PREFIX.len() + 1..self.key_id_end]
    }

    /// `obs1.<keyId>`: the message the signature covers.
    pub fn signed_part(&self) -> &str {
        &self.raw[..self.key_id_end]
    }

    /// The base64url signature.
    pub fn signature(&self) -> &str {
        &self.raw[self.key_id_end + 1..]
    }

    /// The whole token, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.raw
    }
}

/// The actor a sensor reports when `--actor` is not given: `mcp:<keyId>` (DESIGN §3). The
/// ingest mints only key ids whose default actor the event filter accepts
/// ([`crate::ingest::keys::new_key_id`]).
pub fn default_actor(key_id: &str) -> String {
    format!("mcp:{key_id}")
}

/// A byte of the base64url alphabet without padding (RFC 4648 §5): `A-Z a-z 0-9 - _`. The
/// crate's one test for it: a token's keyId and signature, an event id (the schema's
/// `^[A-Za-z0-9_-]{8,64}$`, which hex and UUIDs fit), and the segments L4 reads as a JWT.
pub(crate) fn is_b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

impl fmt::Debug for SensorToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SensorToken(obs1.{}.<redacted>)", self.key_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_key_id() {
        let t = SensorToken::parse("obs1.k_123.c2ln-_x").expect("valid");
        assert_eq!(t.key_id(), "k_123");
        assert_eq!(t.signed_part(), "obs1.k_123");
        assert_eq!(t.signature(), "c2ln-_x");
    }

    #[test]
    fn rejects_bad_shapes() {
        for bad in [
            "",
            "obs1",
            "obs1.k",
            "obs2.k.sig",
            "obs1..sig",
            "obs1.k.",
            "obs1.k.s.x",
            "obs1.k/.sig",
            "obs1.k.si=",
        ] {
            assert!(
                SensorToken::parse(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn debug_never_shows_signature() {
        let t = SensorToken::parse("obs1.kid.SECRETSIG").expect("valid");
        assert!(!format!("{t:?}").contains("SECRETSIG"));
    }
}
