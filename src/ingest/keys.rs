//! Sensor keys and the admin secret (DESIGN §6): minting, signing and constant-time checks.
//!
//! Owns the ingest's signing secret (32 random bytes; with SQLite persisted beside the database
//! so tokens survive a restart, with PostgreSQL given to every replica, see [`SecretSetting`]),
//! the token signature `base64url(HMAC-SHA256(secret, "obs1.<keyId>"))`, and
//! the admin secret check. Goes in: a parsed [`SensorToken`] or a presented admin secret. Comes
//! out: yes or no. It never compares a secret with `==` (every check is `ring::hmac::verify`,
//! constant time), never logs a secret, and never regenerates a secret file it cannot read (that
//! would silently invalidate every token in the field).
//!
//! A secret file is written whole or not at all: into a temporary file beside it (0600),
//! fsynced, then published under its name with `link(2)`, and the directory fsynced. A crash or
//! a full disk midway leaves no file, never a truncated one that the next start would have to
//! refuse as malformed. `link`, unlike `rename`, fails when the name exists: of two ingests
//! starting at once, the second reads the first one's secret instead of replacing it under it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;

use super::IngestError;
use crate::event::filter::check_actor_id;
use crate::random;
use crate::token::{default_actor, SensorToken, TOKEN_PREFIX};

/// Signing secret length: the HMAC-SHA256 block-size-independent recommendation (= output size).
const SIGNING_SECRET_BYTES: usize = 32;
/// Random bytes in a key id: 80 bits is plenty for ids that are looked up, not guessed (the
/// signature is what cannot be guessed); hex keeps ids free of a leading `-` that a CLI would
/// take for a flag.
const KEY_ID_RANDOM_BYTES: usize = 10;
/// Prefix of minted key ids, so a key id is recognisable in logs and evidence.
pub const KEY_ID_PREFIX: &str = "k_";
/// Random bytes in a generated admin secret (256 bits).
const ADMIN_SECRET_BYTES: usize = 32;
/// Prefix of generated admin secrets: never `obs1.`, so one can never parse as a sensor token.
const ADMIN_SECRET_PREFIX: &str = "adm_";
/// Shortest admin secret accepted from the environment; anything shorter is guessable.
pub const MIN_ADMIN_SECRET_LEN: usize = 16;

/// The file beside `db` that holds the signing secret.
pub fn signing_secret_path(db: &Path) -> PathBuf {
    beside(db, "signing-key")
}

/// The file beside `db` that holds a generated admin secret.
pub fn admin_secret_path(db: &Path) -> PathBuf {
    beside(db, "admin-secret")
}

fn beside(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "bounded-ingest.db".into());
    name.push(".");
    name.push(suffix);
    db.with_file_name(name)
}

/// Where a secret comes from when the operator gives it: its text, or a file holding it. A
/// given file is only read, never created: replicas sharing a database must share the secret,
/// and one generated per replica would split them (tokens minted on one refused by the other).
#[derive(Clone, PartialEq, Eq)]
pub enum SecretSetting {
    Value(String),
    File(PathBuf),
}

impl std::fmt::Debug for SecretSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretSetting::Value(_) => f.write_str("Value(<redacted>)"),
            SecretSetting::File(p) => f.debug_tuple("File").field(p).finish(),
        }
    }
}

impl SecretSetting {
    /// The secret's text, trimmed.
    fn read(&self) -> Result<String, IngestError> {
        match self {
            SecretSetting::Value(v) => Ok(v.trim().to_string()),
            SecretSetting::File(path) => fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .map_err(|source| IngestError::SecretFile {
                    path: path.clone(),
                    source,
                }),
        }
    }
}

/// A fresh signing secret as its file holds it (base64url, no padding); what
/// `bounded-ingest secret` prints.
pub fn new_signing_secret_text() -> Result<String, IngestError> {
    Ok(URL_SAFE_NO_PAD.encode(random::bytes::<SIGNING_SECRET_BYTES>()?))
}

/// A fresh admin secret (`adm_` + 256 random bits, base64url).
pub fn new_admin_secret_text() -> Result<String, IngestError> {
    Ok(format!(
        "{ADMIN_SECRET_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(random::bytes::<ADMIN_SECRET_BYTES>()?)
    ))
}

/// The 32 bytes of a signing secret written as base64, either alphabet, padded or not (the
/// `<db>.signing-key` file, or `openssl rand -base64 32`).
fn decode_signing_secret(text: &str) -> Option<Vec<u8>> {
    let normal: String = text
        .trim()
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    URL_SAFE_NO_PAD
        .decode(normal.as_bytes())
        .ok()
        .filter(|s| s.len() == SIGNING_SECRET_BYTES)
}

/// A fresh key id: `k_` + 20 lower-case hex digits (fits `SensorToken`'s keyId rules), whose
/// default actor `mcp:<keyId>` the event filter accepts.
pub fn new_key_id() -> Result<String, IngestError> {
    clear_key_id(random::bytes::<KEY_ID_RANDOM_BYTES>)
}

/// The first drawn key id whose default actor passes [`check_actor_id`]. Random hex holds a
/// Luhn-valid run of 13 or more decimal digits in about one id in 400 (`k_0801084356246c5c60f6`),
/// and layer 4 reads that as a card number: every event of such a key's sensor would be
/// rejected, by the sensor's own filter and by ours. Redrawing costs one more draw in 400.
fn clear_key_id(
    mut draw: impl FnMut() -> Result<[u8; KEY_ID_RANDOM_BYTES], random::Unavailable>,
) -> Result<String, IngestError> {
    loop {
        let id = format!("{KEY_ID_PREFIX}{}", crate::event::hex_lower(&draw()?));
        if check_actor_id(&default_actor(&id)).is_ok() {
            return Ok(id);
        }
    }
}

/// Writes `contents` (and a newline) as a new secret file readable by the owner only. Fails
/// with `AlreadyExists` if the file exists, so two processes starting at once cannot each write
/// a different secret.
fn write_secret_file(path: &Path, contents: &str) -> std::io::Result<()> {
    write_secret_with(path, |f| {
        f.write_all(contents.as_bytes())?;
        f.write_all(b"\n")
    })
}

/// The publishing steps of [`write_secret_file`] (see the module docs), around `write`.
fn write_secret_with(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let suffix = random::bytes::<8>().map_err(std::io::Error::other)?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", crate::event::hex_lower(&suffix)));
    let tmp = dir.join(tmp_name);
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    let written = write(&mut f)
        .and_then(|()| f.sync_all())
        .and_then(|()| publish(&tmp, path));
    drop(f);
    // Published or not, the temporary name goes (after a link, the secret keeps its own name).
    let _ = fs::remove_file(&tmp);
    written?;
    sync_dir(dir)
}

/// Gives the finished temporary file its final name, never replacing an existing file.
fn publish(tmp: &Path, path: &Path) -> std::io::Result<()> {
    match fs::hard_link(tmp, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(e),
        // A filesystem without hard links: rename once nothing is there (a narrower race than
        // none, on filesystems that SQLite's WAL rarely lives on anyway).
        Err(_) => match fs::symlink_metadata(path) {
            Ok(_) => Err(std::io::ErrorKind::AlreadyExists.into()),
            Err(_) => fs::rename(tmp, path),
        },
    }
}

/// fsyncs a directory, so a name just linked into it survives a power cut. A filesystem that
/// cannot fsync a directory (EINVAL) has nothing more to give.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match fs::File::open(dir).and_then(|d| d.sync_all()) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

/// Reads a secret file, or creates it with `generate()` when it does not exist yet.
/// Returns the secret text and whether it was created now.
fn load_or_create_secret(
    path: &Path,
    generate: impl FnOnce() -> Result<String, IngestError>,
) -> Result<(String, bool), IngestError> {
    let io_err = |source| IngestError::SecretFile {
        path: path.to_path_buf(),
        source,
    };
    match fs::read_to_string(path) {
        Ok(s) => Ok((s.trim().to_string(), false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret = generate()?;
            match write_secret_file(path, &secret) {
                Ok(()) => Ok((secret, true)),
                // Lost a race with another process: use what it wrote.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let s = fs::read_to_string(path).map_err(io_err)?;
                    Ok((s.trim().to_string(), false))
                }
                Err(e) => Err(io_err(e)),
            }
        }
        Err(e) => Err(io_err(e)),
    }
}

/// Signs and verifies sensor tokens with the ingest's persisted secret.
pub struct Signer {
    key: hmac::Key,
}

impl Signer {
    /// Loads the signing secret beside `db`, creating it on first start.
    pub fn load_or_create(db: &Path) -> Result<Self, IngestError> {
        let path = signing_secret_path(db);
        let (text, _) = load_or_create_secret(&path, new_signing_secret_text)?;
        let secret = decode_signing_secret(&text).ok_or(IngestError::SecretMalformed { path })?;
        Ok(Signer::from_secret(&secret))
    }

    /// The signing secret the operator gave (32 bytes as base64); never generated.
    pub fn from_setting(setting: &SecretSetting) -> Result<Self, IngestError> {
        let text = setting.read()?;
        let secret = decode_signing_secret(&text).ok_or_else(|| match setting {
            SecretSetting::File(path) => IngestError::SecretMalformed { path: path.clone() },
            SecretSetting::Value(_) => IngestError::SigningSecretMalformed,
        })?;
        Ok(Signer::from_secret(&secret))
    }

    /// A signer over raw secret bytes (tests, embedding).
    pub fn from_secret(secret: &[u8]) -> Self {
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// The full token for `key_id`: `obs1.<keyId>.<sig>`.
    pub fn token_for(&self, key_id: &str) -> String {
        let signed = format!("{TOKEN_PREFIX}.{key_id}");
        let tag = hmac::sign(&self.key, signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// True when the token's signature is ours. Constant time in the signature's contents.
    pub fn verify(&self, token: &SensorToken) -> bool {
        let Ok(sig) = URL_SAFE_NO_PAD.decode(token.signature().as_bytes()) else {
            return false;
        };
        hmac::verify(&self.key, token.signed_part().as_bytes(), &sig).is_ok()
    }
}

/// Where the admin secret came from, for the startup message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminSecretSource {
    /// Given by the embedder or `BOUNDED_INGEST_ADMIN_SECRET`.
    Provided,
    /// Read from, or generated into, this file (beside the SQLite database, or the one given).
    File { path: PathBuf, created: bool },
}

/// The admin secret, kept as an HMAC tag under a per-process random key so that checking a
/// presented secret is `hmac::verify` (constant time, and independent of the secret's length).
pub struct AdminSecret {
    key: hmac::Key,
    tag: hmac::Tag,
    text: String,
}

impl AdminSecret {
    /// Uses `provided` (must be at least [`MIN_ADMIN_SECRET_LEN`] characters), else the file
    /// beside `db`, generating it on first start.
    pub fn resolve(
        provided: Option<&str>,
        db: &Path,
    ) -> Result<(Self, AdminSecretSource), IngestError> {
        if let Some(p) = provided {
            let p = p.trim();
            if p.len() < MIN_ADMIN_SECRET_LEN {
                return Err(IngestError::WeakAdminSecret);
            }
            return Ok((AdminSecret::new(p)?, AdminSecretSource::Provided));
        }
        let path = admin_secret_path(db);
        let (text, created) = load_or_create_secret(&path, new_admin_secret_text)?;
        if text.len() < MIN_ADMIN_SECRET_LEN {
            return Err(IngestError::SecretMalformed { path });
        }
        Ok((
            AdminSecret::new(&text)?,
            AdminSecretSource::File { path, created },
        ))
    }

    /// The admin secret the operator gave; never generated (see [`SecretSetting`]).
    pub fn from_setting(setting: &SecretSetting) -> Result<(Self, AdminSecretSource), IngestError> {
        let text = setting.read()?;
        match setting {
            SecretSetting::Value(_) => Self::resolve(Some(&text), Path::new("")),
            SecretSetting::File(path) => {
                if text.len() < MIN_ADMIN_SECRET_LEN {
                    return Err(IngestError::SecretMalformed { path: path.clone() });
                }
                Ok((
                    AdminSecret::new(&text)?,
                    AdminSecretSource::File {
                        path: path.clone(),
                        created: false,
                    },
                ))
            }
        }
    }

    fn new(text: &str) -> Result<Self, IngestError> {
        let key = random::hmac_key()?;
        let tag = hmac::sign(&key, text.as_bytes());
        Ok(AdminSecret {
            key,
            tag,
            text: text.to_string(),
        })
    }

    /// True when `presented` is the admin secret. Constant time.
    pub fn verify(&self, presented: &str) -> bool {
        hmac::verify(&self.key, presented.as_bytes(), self.tag.as_ref()).is_ok()
    }

    /// The secret itself, for the embedder that needs to call the admin API.
    pub fn expose(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Debug for AdminSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminSecret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_id_whose_actor_reads_as_a_card_number_is_redrawn() {
        // 0801084356246 is Luhn-valid: the first draw's default actor fails the filter.
        let card = [0x08, 0x01, 0x08, 0x43, 0x56, 0x24, 0x6c, 0x5c, 0x60, 0xf6];
        let plain = [0xab; KEY_ID_RANDOM_BYTES];
        assert!(check_actor_id(&default_actor("k_0801084356246c5c60f6")).is_err());
        let mut draws = vec![Ok(plain), Ok(card)];
        let id = clear_key_id(|| draws.pop().expect("at most two draws")).expect("rng");
        assert_eq!(id, format!("k_{}", "ab".repeat(KEY_ID_RANDOM_BYTES)));
        assert!(
            draws.is_empty(),
            "the card-like id was drawn and passed over"
        );
        // A generator that fails is an error, not a loop.
        assert!(clear_key_id(|| Err(random::Unavailable)).is_err());
    }

    #[test]
    fn minted_token_verifies_and_a_forged_one_does_not() {
        let s = Signer::from_secret(&[7u8; 32]);
        let other = Signer::from_secret(&[8u8; 32]);
        let id = new_key_id().expect("rng");
        let tok = SensorToken::parse(&s.token_for(&id)).expect("shape");
        assert_eq!(tok.key_id(), id);
        assert!(s.verify(&tok));
        assert!(!other.verify(&tok));
        // Same signature moved onto another key id.
        let moved = format!("obs1.k_other.{}", tok.signature());
        assert!(!s.verify(&SensorToken::parse(&moved).expect("shape")));
        // A truncated signature.
        let sig = tok.signature();
        let cut = format!("obs1.{id}.{}", &sig[..sig.len() - 2]);
        assert!(!s.verify(&SensorToken::parse(&cut).expect("shape")));
    }

    #[test]
    fn signing_secret_survives_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        let a = Signer::load_or_create(&db).expect("create");
        let b = Signer::load_or_create(&db).expect("reload");
        let tok = SensorToken::parse(&a.token_for("k_1")).expect("shape");
        assert!(b.verify(&tok));
        assert!(signing_secret_path(&db).ends_with("x.db.signing-key"));
    }

    #[test]
    fn malformed_signing_secret_is_an_error_not_a_new_secret() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        fs::write(signing_secret_path(&db), "not base64 !!").expect("write");
        assert!(matches!(
            Signer::load_or_create(&db),
            Err(IngestError::SecretMalformed { .. })
        ));
    }

    #[test]
    fn a_secret_write_that_fails_midway_leaves_no_secret_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db.signing-key");
        let res = write_secret_with(&path, |f| {
            f.write_all(b"half a sec")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(res.is_err());
        assert!(
            !path.exists(),
            "a truncated secret would be refused as malformed on every later start"
        );
        assert_eq!(
            fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "no temporary file is left behind"
        );
        // The next start creates it whole.
        let db = dir.path().join("x.db");
        Signer::load_or_create(&db).expect("create");
        assert!(fs::read_to_string(&path).expect("read").ends_with('\n'));
    }

    #[cfg(unix)]
    #[test]
    fn secret_files_are_owner_only_and_nothing_else_is_left() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        Signer::load_or_create(&db).expect("create");
        AdminSecret::resolve(None, &db).expect("generate");
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["x.db.admin-secret", "x.db.signing-key"]);
        for n in names {
            let mode = fs::metadata(dir.path().join(&n))
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{n}");
        }
        // An existing file is never replaced.
        let before = fs::read(signing_secret_path(&db)).expect("read");
        let e = write_secret_file(&signing_secret_path(&db), "other").expect_err("exists");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(signing_secret_path(&db)).expect("read"), before);
    }

    #[test]
    fn a_given_signing_secret_is_read_in_either_base64_alphabet_and_never_generated() {
        let bytes: Vec<u8> = (0u8..32)
            .map(|b| b.wrapping_mul(37).wrapping_add(250))
            .collect();
        use base64::engine::general_purpose::STANDARD;
        let url_safe = Signer::from_setting(&SecretSetting::Value(URL_SAFE_NO_PAD.encode(&bytes)))
            .expect("base64url");
        let standard = Signer::from_setting(&SecretSetting::Value(STANDARD.encode(&bytes)))
            .expect("standard, padded (openssl rand -base64 32)");
        let tok = SensorToken::parse(&url_safe.token_for("k_1")).expect("shape");
        assert!(standard.verify(&tok), "both spellings are the same secret");
        assert!(matches!(
            Signer::from_setting(&SecretSetting::Value(URL_SAFE_NO_PAD.encode(&bytes[..31]))),
            Err(IngestError::SigningSecretMalformed)
        ));
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("signing");
        assert!(matches!(
            Signer::from_setting(&SecretSetting::File(missing.clone())),
            Err(IngestError::SecretFile { .. })
        ));
        assert!(!missing.exists(), "a given file is never created");
        assert!(!format!("{:?}", SecretSetting::Value("s3cret".into())).contains("s3cret"));
    }

    #[test]
    fn admin_secret_checks_exact_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        let (a, src) = AdminSecret::resolve(None, &db).expect("generate");
        assert!(matches!(src, AdminSecretSource::File { created: true, .. }));
        assert!(a.verify(a.expose()));
        assert!(!a.verify(""));
        assert!(!a.verify(&a.expose()[1..]));
        assert!(!format!("{a:?}").contains(a.expose()));
        let (b, src) = AdminSecret::resolve(None, &db).expect("reload");
        assert!(matches!(
            src,
            AdminSecretSource::File { created: false, .. }
        ));
        assert_eq!(a.expose(), b.expose());
        assert!(matches!(
            AdminSecret::resolve(Some("short"), &db),
            Err(IngestError::WeakAdminSecret)
        ));
    }
}
