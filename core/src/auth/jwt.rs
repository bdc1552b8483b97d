//! etcd 3.4's token providers as `--auth-token` names them (etcd/auth/store.go
//! NewTokenProvider, auth/options.go, auth/jwt.go), and JWT tokens as etcd signs and checks them
//! with golang-jwt.
//!
//! A JWT token is `base64url(header).base64url(claims).base64url(signature)` with the header
//! `{"alg":"<sign-method>","typ":"JWT"}` and the claims `{"exp":<unix s>,"revision":<auth
//! revision>,"username":"<user>"}`, byte for byte as etcd writes them (Go sorts map keys), so a
//! token Keel signs verifies in etcd and one etcd signs verifies here, given the same keys.
//! Nothing about a JWT token is kept on the member: it survives restarts, and a member that
//! did not sign it checks it as well as the one that did.
//!
//! A token is valid when its `alg` is the configured method, its signature verifies, and its
//! time claims pass golang-jwt's MapClaims rules (`exp` after now, `iat` and `nbf` not after
//! now; a missing or zero claim passes, any other type fails). Its user and auth revision are
//! then the call's credentials: a token signed before the auth store last changed is "revision
//! of auth store is old" for every permission check, as in etcd, until the client logs in again.
//!
//! Keys are read at start the way golang-jwt reads them: the first PEM block of each file;
//! RSA private keys as PKCS#1 or PKCS#8, ECDSA private keys as SEC1 or PKCS#8, public keys as
//! PKIX or inside a certificate; an HMAC key is the private-key file's bytes as they are. With
//! a private key, verification uses its public half (etcd ignores `pub-key` then, beyond
//! parsing it); with only a public key, the member verifies and cannot sign (etcd's
//! verify-only mode). The crypto is ring's (through the `jsonwebtoken` crate), which has no
//! P-521, signs with 2048- to 4096-bit RSA keys and verifies with 2048 to 8192 bits: ES512 and
//! RSA keys outside those sizes, which etcd serves, are refused at start with the reason. So is
//! an ECDSA key on another curve than the method's, which etcd accepts at start and then fails
//! every login and token with.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use ring::signature::KeyPair;

use super::AuthInfo;

/// etcd's startup errors for `--auth-token` (auth/store.go), the text its fatal log line shows.
pub const ERR_INVALID_AUTH_OPTS: &str = "auth: invalid auth options";
pub const ERR_INVALID_AUTH_METHOD: &str = "auth: invalid auth signature method";
pub const ERR_MISSING_KEY: &str = "auth: missing key data";
pub const ERR_KEY_MISMATCH: &str = "auth: public and private keys don't match";

/// etcd's JWT options (auth/options.go); any other is warned about and ignored.
const OPT_SIGN_METHOD: &str = "sign-method";
const OPT_PUBLIC_KEY: &str = "pub-key";
const OPT_PRIVATE_KEY: &str = "priv-key";
const OPT_TTL: &str = "ttl";
const KNOWN_OPTIONS: [&str; 4] = [OPT_SIGN_METHOD, OPT_PUBLIC_KEY, OPT_PRIVATE_KEY, OPT_TTL];

/// etcd's DefaultTTL for JWT tokens when `ttl` is not given.
pub const TTL_DEFAULT_NS: i64 = 5 * 60 * 1_000_000_000;

/// Longest token `verify` looks at. etcd has no such limit; a token is a few hundred bytes
/// (an RSA-4096 signature is 683 base64 characters), and gRPC metadata is bounded anyway.
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;
const _: () = assert!(TOKEN_BYTES_MAX >= 4096);

/// Which tokens a member assigns and accepts (`--auth-token`).
#[derive(Debug, Clone)]
pub enum TokenProvider {
    /// etcd's default: random tokens known only to the members that applied their login.
    Simple,
    /// Signed, self-contained tokens.
    Jwt(Arc<Jwt>),
    /// `--auth-token ""`: etcd's no-op provider. No token is ever valid and Authenticate fails,
    /// so only client certificates (`--client-cert-auth`) name a user.
    Nop,
}

impl TokenProvider {
    /// Parses `--auth-token` as etcd's NewTokenProvider does, reading and checking the key files
    /// now. Returns the provider and warnings for the startup log (unknown JWT options).
    pub fn parse(flag: &str) -> Result<(TokenProvider, Vec<String>), String> {
        let invalid =
            |why: String| format!("--auth-token {flag:?}: {ERR_INVALID_AUTH_OPTS} ({why})");
        let (token_type, opts) = decompose(flag).map_err(invalid)?;
        match token_type {
            "simple" => Ok((TokenProvider::Simple, Vec::new())),
            "" => Ok((TokenProvider::Nop, Vec::new())),
            "jwt" => {
                let mut warnings = Vec::new();
                let mut unknown: Vec<&str> = opts
                    .keys()
                    .map(String::as_str)
                    .filter(|k| !KNOWN_OPTIONS.contains(k))
                    .collect();
                unknown.sort_unstable();
                if !unknown.is_empty() {
                    warnings.push(format!("--auth-token: unknown JWT options {unknown:?}"));
                }
                let jwt =
                    Jwt::from_options(&opts, &|path| std::fs::read(path)).map_err(|e| match e {
                        OptionsError::Invalid(why) => invalid(why),
                        OptionsError::Key(why) => format!("--auth-token {flag:?}: {why}"),
                    })?;
                Ok((TokenProvider::Jwt(Arc::new(jwt)), warnings))
            }
            other => Err(invalid(format!("unknown token type {other:?}"))),
        }
    }
}

/// etcd's decomposeOpts: "type,k=v,k=v"; each option exactly one '=', no option twice.
pub fn decompose(flag: &str) -> Result<(&str, HashMap<String, String>), String> {
    let mut parts = flag.split(',');
    let token_type = parts.next().unwrap_or("");
    let mut opts = HashMap::new();
    for opt in parts {
        let pair: Vec<&str> = opt.split('=').collect();
        let [key, value] = pair[..] else {
            return Err(format!("invalid token specific option {opt:?}"));
        };
        if opts.insert(key.to_string(), value.to_string()).is_some() {
            return Err(format!("duplicated parameter {key:?}"));
        }
    }
    Ok((token_type, opts))
}

/// Why JWT options were refused: etcd's ErrInvalidAuthOpts (bad ttl, unreadable file, unknown
/// method), or a key error it reports as it is.
#[derive(Debug, PartialEq, Eq)]
enum OptionsError {
    Invalid(String),
    Key(String),
}

/// How a method signs, and the key material it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Hmac,
    Rsa,
    Ec(Curve),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Curve {
    P256,
    P384,
}

impl Curve {
    fn oid(self) -> &'static [u8] {
        match self {
            Curve::P256 => OID_P256,
            Curve::P384 => OID_P384,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Curve::P256 => "P-256",
            Curve::P384 => "P-384",
        }
    }

    fn signing(self) -> &'static ring::signature::EcdsaSigningAlgorithm {
        match self {
            Curve::P256 => &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            Curve::P384 => &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING,
        }
    }
}

/// golang-jwt's method names, as `sign-method` and a token's `alg` spell them.
fn method(name: &str) -> Option<Result<(Algorithm, Family), String>> {
    let m = match name {
        "HS256" => (Algorithm::HS256, Family::Hmac),
        "HS384" => (Algorithm::HS384, Family::Hmac),
        "HS512" => (Algorithm::HS512, Family::Hmac),
        "RS256" => (Algorithm::RS256, Family::Rsa),
        "RS384" => (Algorithm::RS384, Family::Rsa),
        "RS512" => (Algorithm::RS512, Family::Rsa),
        "PS256" => (Algorithm::PS256, Family::Rsa),
        "PS384" => (Algorithm::PS384, Family::Rsa),
        "PS512" => (Algorithm::PS512, Family::Rsa),
        "ES256" => (Algorithm::ES256, Family::Ec(Curve::P256)),
        "ES384" => (Algorithm::ES384, Family::Ec(Curve::P384)),
        "ES512" => {
            return Some(Err(
                "sign-method ES512 (ECDSA P-521) is not supported by Keel's crypto (ring): use ES256 or ES384"
                    .into(),
            ))
        }
        // Registered in golang-jwt, refused by etcd's Key() as it is here.
        "none" => return Some(Err("unsupported signing method: *jwt.signingMethodNone".into())),
        "EdDSA" => {
            return Some(Err(
                "unsupported signing method: *jwt.SigningMethodEd25519".into(),
            ))
        }
        _ => return None,
    };
    Some(Ok(m))
}

/// A member's JWT signer and verifier.
pub struct Jwt {
    /// The `sign-method` name, which a token's `alg` must equal.
    alg_name: String,
    alg: Algorithm,
    /// None: only a public key was given (etcd's verify-only mode).
    signing: Option<EncodingKey>,
    verifying: DecodingKey,
    /// `ttl`: a token's `exp` is its signing time plus this. Zero or negative is allowed, as
    /// in etcd (such tokens are born expired).
    ttl_ns: i64,
}

impl fmt::Debug for Jwt {
    // Key material stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jwt")
            .field("sign_method", &self.alg_name)
            .field("verify_only", &self.signing.is_none())
            .field("ttl_ns", &self.ttl_ns)
            .finish()
    }
}

/// Why a token could not be signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignError {
    /// etcd's ErrVerifyOnly.
    VerifyOnly,
    /// The crypto failed (ring refused the key or the random source).
    Crypto,
}

impl Jwt {
    /// etcd's jwtOptions.ParseWithDefaults then Key(), in that order of checks.
    /// `read` reads a key file (std::fs::read, or key material in memory for tests).
    fn from_options(
        opts: &HashMap<String, String>,
        read: &dyn Fn(&str) -> std::io::Result<Vec<u8>>,
    ) -> Result<Jwt, OptionsError> {
        let get = |k: &str| opts.get(k).map(String::as_str).unwrap_or("");
        let ttl_ns = match get(OPT_TTL) {
            "" => TTL_DEFAULT_NS,
            ttl => crate::compactor::parse_go_duration(ttl).map_err(OptionsError::Invalid)?,
        };
        let read = |path: &str| -> Result<Option<Vec<u8>>, OptionsError> {
            if path.is_empty() {
                return Ok(None);
            }
            read(path)
                .map(Some)
                .map_err(|e| OptionsError::Invalid(format!("open {path}: {e}")))
        };
        let public = read(get(OPT_PUBLIC_KEY))?;
        let private = read(get(OPT_PRIVATE_KEY))?;
        let name = get(OPT_SIGN_METHOD);
        let (alg, family) = match method(name) {
            None => return Err(OptionsError::Invalid(ERR_INVALID_AUTH_METHOD.into())),
            Some(Err(why)) => return Err(OptionsError::Key(why)),
            Some(Ok(m)) => m,
        };
        let key_err = |which: &str, why: String| {
            let path = get(which);
            OptionsError::Key(format!("{which} {path}: {why}"))
        };
        let (signing, verifying) = match family {
            Family::Hmac => match private {
                Some(secret) if !secret.is_empty() => (
                    Some(EncodingKey::from_secret(&secret)),
                    DecodingKey::from_secret(&secret),
                ),
                _ => return Err(OptionsError::Key(ERR_MISSING_KEY.into())),
            },
            Family::Rsa => {
                let private = match private.filter(|k| !k.is_empty()) {
                    Some(k) => Some(rsa_private(&k).map_err(|w| key_err(OPT_PRIVATE_KEY, w))?),
                    None => None,
                };
                let public = match public.filter(|k| !k.is_empty()) {
                    Some(k) => Some(rsa_public(&k).map_err(|w| key_err(OPT_PUBLIC_KEY, w))?),
                    None => None,
                };
                match (private, public) {
                    (None, None) => return Err(OptionsError::Key(ERR_MISSING_KEY.into())),
                    (None, Some(public)) => {
                        check_rsa_verify_size(&public).map_err(|w| key_err(OPT_PUBLIC_KEY, w))?;
                        (None, DecodingKey::from_rsa_der(&public))
                    }
                    (Some((signing, own_public)), public) => {
                        // etcd's check, kept as it is written: a mismatch only when both the
                        // exponent and the modulus differ.
                        if let Some(public) = public {
                            let (n1, e1) = rsa_components(&own_public).ok_or_else(|| {
                                key_err(OPT_PRIVATE_KEY, "unreadable public half".into())
                            })?;
                            let (n2, e2) = rsa_components(&public).ok_or_else(|| {
                                key_err(OPT_PUBLIC_KEY, "not a valid RSA public key".into())
                            })?;
                            if e1 != e2 && n1 != n2 {
                                return Err(OptionsError::Key(ERR_KEY_MISMATCH.into()));
                            }
                        }
                        (Some(signing), DecodingKey::from_rsa_der(&own_public))
                    }
                }
            }
            Family::Ec(curve) => {
                let private = match private.filter(|k| !k.is_empty()) {
                    Some(k) => {
                        Some(ec_private(&k, curve).map_err(|w| key_err(OPT_PRIVATE_KEY, w))?)
                    }
                    None => None,
                };
                let public = match public.filter(|k| !k.is_empty()) {
                    Some(k) => Some(ec_public(&k).map_err(|w| key_err(OPT_PUBLIC_KEY, w))?),
                    None => None,
                };
                match (private, public) {
                    (None, None) => return Err(OptionsError::Key(ERR_MISSING_KEY.into())),
                    (None, Some((public_curve, point))) => {
                        if public_curve != curve.oid() {
                            return Err(key_err(
                                OPT_PUBLIC_KEY,
                                format!("not a {} key, as {name} needs", curve.name()),
                            ));
                        }
                        (None, DecodingKey::from_ec_der(&point))
                    }
                    // etcd parses the public key and then verifies with the private key's own
                    // public half (its mismatch check cannot fire for keys of one curve).
                    (Some((signing, own_point)), _) => {
                        (Some(signing), DecodingKey::from_ec_der(&own_point))
                    }
                }
            }
        };
        let jwt = Jwt {
            alg_name: name.to_string(),
            alg,
            signing,
            verifying,
            ttl_ns,
        };
        // Prove the keys work together now rather than at the first login.
        if jwt.signing.is_some() {
            let token = jwt
                .sign_claims("keel-startup-check", 1, SystemTime::now())
                .map_err(|_| key_err(OPT_PRIVATE_KEY, "the key cannot sign".into()))?;
            let checked = jwt.check_signature(&token);
            if !checked {
                return Err(key_err(
                    OPT_PRIVATE_KEY,
                    "a token it signed does not verify".into(),
                ));
            }
        }
        Ok(jwt)
    }

    /// A provider from key material in memory (tests and fuzz targets), as if `pub-key` and
    /// `priv-key` named files holding these bytes.
    pub fn from_key_material(
        sign_method: &str,
        public: Option<&[u8]>,
        private: Option<&[u8]>,
        ttl_ns: i64,
    ) -> Result<Jwt, String> {
        const PUBLIC: &str = "(public key in memory)";
        const PRIVATE: &str = "(private key in memory)";
        let mut opts = HashMap::new();
        opts.insert(OPT_SIGN_METHOD.into(), sign_method.into());
        if public.is_some() {
            opts.insert(OPT_PUBLIC_KEY.into(), PUBLIC.into());
        }
        if private.is_some() {
            opts.insert(OPT_PRIVATE_KEY.into(), PRIVATE.into());
        }
        opts.insert(OPT_TTL.into(), format!("{ttl_ns}ns"));
        let read = |path: &str| match path {
            PUBLIC => Ok(public.unwrap_or_default().to_vec()),
            _ => Ok(private.unwrap_or_default().to_vec()),
        };
        Jwt::from_options(&opts, &read).map_err(|e| match e {
            OptionsError::Invalid(why) | OptionsError::Key(why) => why,
        })
    }

    pub fn verify_only(&self) -> bool {
        self.signing.is_none()
    }

    pub fn sign_method(&self) -> &str {
        &self.alg_name
    }

    /// etcd's tokenJWT.assign: a token for `user` at auth `revision`, expiring `ttl` after `now`.
    pub fn sign(&self, user: &str, revision: u64, now: SystemTime) -> Result<String, SignError> {
        self.sign_claims(user, revision, now)
    }

    fn sign_claims(&self, user: &str, revision: u64, now: SystemTime) -> Result<String, SignError> {
        let now_ns = match now.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(e) => -(e.duration().as_nanos() as i128),
        };
        // Go's time.Now().Add(ttl).Unix(): whole seconds, rounded down.
        let exp = (now_ns + i128::from(self.ttl_ns)).div_euclid(1_000_000_000);
        let exp = i64::try_from(exp).unwrap_or(if exp < 0 { i64::MIN } else { i64::MAX });
        let claims = format!(
            "{{\"exp\":{exp},\"revision\":{revision},\"username\":{}}}",
            go_json_string(user)
        );
        self.sign_payload(claims.as_bytes())
    }

    /// Signs arbitrary claims bytes under this provider's header (tests and fuzz targets reach
    /// the claim checks behind the signature through it).
    pub fn sign_payload(&self, claims: &[u8]) -> Result<String, SignError> {
        let key = self.signing.as_ref().ok_or(SignError::VerifyOnly)?;
        let header = format!("{{\"alg\":\"{}\",\"typ\":\"JWT\"}}", self.alg_name);
        let mut message = URL_SAFE_NO_PAD.encode(header);
        message.push('.');
        message.push_str(&URL_SAFE_NO_PAD.encode(claims));
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), key, self.alg).map_err(|e| {
                tracing::warn!(error = %e, "failed to sign a JWT token");
                SignError::Crypto
            })?;
        message.push('.');
        message.push_str(&signature);
        Ok(message)
    }

    /// Whether the token's signature verifies under this provider's key and method (and
    /// nothing else: tests and the startup check).
    fn check_signature(&self, token: &str) -> bool {
        self.parse(token, i64::MIN).is_some_and(|p| p.signature_ok)
    }

    /// etcd's tokenJWT.info: the user and auth revision of a valid token at `now_unix_s`;
    /// None for anything else (etcd's "invalid auth token").
    pub fn verify(&self, token: &str, now_unix_s: i64) -> Option<AuthInfo> {
        let parsed = self.parse(token, now_unix_s)?;
        if !(parsed.signature_ok && parsed.times_ok) {
            tracing::debug!(
                signature_ok = parsed.signature_ok,
                times_ok = parsed.times_ok,
                "invalid JWT token"
            );
            return None;
        }
        // etcd asserts these types (and its request handler panics when a validly signed
        // token lacks them); here such a token is only invalid.
        let user = parsed.claims.get("username")?.as_str()?.to_string();
        let revision = go_f64_to_u64(parsed.claims.get("revision")?.as_f64()?);
        Some(AuthInfo { user, revision })
    }

    /// golang-jwt's Parser.ParseWithClaims into MapClaims with etcd's key function: the
    /// token's parts, whether its signature verifies and whether its time claims pass. None
    /// when it is malformed or its `alg` is not the configured method.
    fn parse(&self, token: &str, now_unix_s: i64) -> Option<Parsed> {
        if token.len() > TOKEN_BYTES_MAX {
            return None;
        }
        let mut parts = token.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let header: serde_json::Value = serde_json::from_slice(&go_b64_decode(header)?).ok()?;
        // golang-jwt decodes the claims with a json.Decoder: the first JSON value counts and
        // anything after it is not looked at.
        let claims_json = go_b64_decode(claims)?;
        let claims = serde_json::Deserializer::from_slice(&claims_json)
            .into_iter::<serde_json::Value>()
            .next()?
            .ok()?;
        let serde_json::Value::Object(claims) = claims else {
            return None;
        };
        if header.get("alg")?.as_str()? != self.alg_name {
            return None;
        }
        let times_ok = go_time_claims_valid(&claims, now_unix_s);
        // jsonwebtoken wants the signature in canonical unpadded base64url; golang-jwt also
        // accepts non-zero trailing bits, so decode as Go does and re-encode.
        let signature = URL_SAFE_NO_PAD.encode(go_b64_decode(signature)?);
        let message_len = token.len() - signature_len(token);
        let message = &token.as_bytes()[..message_len];
        let signature_ok =
            jsonwebtoken::crypto::verify(&signature, message, &self.verifying, self.alg)
                .unwrap_or(false);
        Some(Parsed {
            claims,
            signature_ok,
            times_ok,
        })
    }
}

/// The length of a token's signature part with its dot (the token has exactly two dots).
fn signature_len(token: &str) -> usize {
    token.len() - token.rfind('.').expect("a parsed token has two dots")
}

struct Parsed {
    claims: serde_json::Map<String, serde_json::Value>,
    signature_ok: bool,
    times_ok: bool,
}

/// `now` in whole Unix seconds, rounded down (golang-jwt's `TimeFunc().Unix()`).
pub fn unix_seconds(now: SystemTime) -> i64 {
    match now.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            let d = e.duration();
            let whole = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() > 0 {
                -whole - 1
            } else {
                -whole
            }
        }
    }
}

/// golang-jwt's DecodeSegment (RawURLEncoding, padding refused, trailing bits allowed), after
/// Go's base64 decoder drops '\r' and '\n'.
fn go_b64_decode(segment: &str) -> Option<Vec<u8>> {
    const GO_RAW_URL: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        GeneralPurposeConfig::new()
            .with_encode_padding(false)
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    if segment.contains(['\r', '\n']) {
        let cleaned: String = segment
            .chars()
            .filter(|c| !matches!(c, '\r' | '\n'))
            .collect();
        return GO_RAW_URL.decode(cleaned).ok();
    }
    GO_RAW_URL.decode(segment).ok()
}

/// golang-jwt's MapClaims.Valid as etcd 3.4 is built with it: `exp` must be after now, `iat`
/// and `nbf` not after now, each compared in whole seconds; an absent or zero claim passes, and
/// one that is not a number (null included) fails.
fn go_time_claims_valid(claims: &serde_json::Map<String, serde_json::Value>, now_s: i64) -> bool {
    let date = |name: &str| -> Result<Option<i64>, ()> {
        match claims.get(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(0.0) => Ok(None),
                Some(f) => Ok(Some(go_numeric_date_seconds(f))),
                None => Err(()),
            },
        }
    };
    let exp_ok = match date("exp") {
        Ok(None) => true,
        Ok(Some(exp)) => now_s < exp,
        Err(()) => false,
    };
    let not_after_now = |name: &str| match date(name) {
        Ok(None) => true,
        Ok(Some(t)) => now_s >= t,
        Err(()) => false,
    };
    exp_ok && not_after_now("iat") && not_after_now("nbf")
}

/// golang-jwt's newNumericDateFromSeconds truncated to seconds: the floor of `f`, through Go's
/// float to int64 conversion.
fn go_numeric_date_seconds(f: f64) -> i64 {
    let whole = f.trunc();
    let seconds = go_f64_to_i64(whole);
    let nanos = go_f64_to_i64((f - whole) * 1e9);
    // time.Unix borrows a second for negative nanoseconds; truncating to seconds drops them.
    if nanos < 0 {
        seconds.saturating_sub(1)
    } else {
        seconds
    }
}

/// Go's `int64(f)` on amd64 (CVTTSD2SI): truncation, and i64::MIN for anything out of range.
fn go_f64_to_i64(f: f64) -> i64 {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if (-TWO_63..TWO_63).contains(&f) {
        f as i64
    } else {
        i64::MIN
    }
}

/// Go's `uint64(f)` on amd64, which etcd applies to the `revision` claim.
fn go_f64_to_u64(f: f64) -> u64 {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f < TWO_63 {
        go_f64_to_i64(f) as u64
    } else {
        (go_f64_to_i64(f - TWO_63) as u64) ^ (1 << 63)
    }
}

/// A JSON string as Go's encoding/json writes it (HTML-safe: `<`, `>`, `&`, U+2028 and U+2029
/// escaped), so HMAC tokens come out byte for byte as etcd's.
fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---- Keys, read as golang-jwt reads them ----

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];

const TAG_INTEGER: u8 = 0x02;
const TAG_BIT_STRING: u8 = 0x03;
const TAG_OCTET_STRING: u8 = 0x04;
const TAG_OID: u8 = 0x06;
const TAG_SEQUENCE: u8 = 0x30;

/// ring's range for RSA verification keys.
const RSA_VERIFY_BITS_MIN: usize = 2048;
const RSA_VERIFY_BITS_MAX: usize = 8192;

/// Go's pem.Decode as golang-jwt uses it: the first PEM block in the file, whatever its label.
fn first_pem_block(file: &[u8]) -> Result<Vec<u8>, String> {
    pem::parse(file)
        .map(|p| p.into_contents())
        .map_err(|_| "Invalid Key: Key must be a PEM encoded PKCS1 or PKCS8 key".into())
}

/// One DER element: its tag, its contents and the bytes after it. Definite lengths only (DER).
pub fn der_next(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        // High tag numbers appear in none of the structures read here.
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |len, &b| (len << 8) | usize::from(b));
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

fn der_expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, body, rest) = der_next(input)?;
    (t == tag).then_some((body, rest))
}

fn der_tlv(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = body.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(body);
    out
}

/// A PKCS#8 PrivateKeyInfo: the algorithm's OID and the private key's bytes.
fn pkcs8_parts(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (info, _) = der_expect(der, TAG_SEQUENCE)?;
    let (_version, rest) = der_expect(info, TAG_INTEGER)?;
    let (alg_id, rest) = der_expect(rest, TAG_SEQUENCE)?;
    let (oid, _) = der_expect(alg_id, TAG_OID)?;
    let (key, _) = der_expect(rest, TAG_OCTET_STRING)?;
    Some((oid, key))
}

/// A SubjectPublicKeyInfo's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKeyInfo {
    /// The algorithm's OID (contents bytes).
    pub algorithm: Vec<u8>,
    /// The algorithm parameters' OID, when they are one (an EC key's curve).
    pub parameters: Option<Vec<u8>>,
    /// The key bits (RSA: a PKCS#1 RSAPublicKey; EC: the point).
    pub key: Vec<u8>,
}

/// A SubjectPublicKeyInfo, DER.
pub fn spki_parts(der: &[u8]) -> Option<PublicKeyInfo> {
    let (info, _) = der_expect(der, TAG_SEQUENCE)?;
    let (alg_id, rest) = der_expect(info, TAG_SEQUENCE)?;
    let (oid, params) = der_expect(alg_id, TAG_OID)?;
    let params = der_expect(params, TAG_OID).map(|(p, _)| p);
    let (bits, _) = der_expect(rest, TAG_BIT_STRING)?;
    // Key bits are whole bytes: the first byte (unused bits) is 0.
    let (&unused, key) = bits.split_first()?;
    (unused == 0).then(|| PublicKeyInfo {
        algorithm: oid.to_vec(),
        parameters: params.map(<[u8]>::to_vec),
        key: key.to_vec(),
    })
}

/// Go's ParsePKIXPublicKey, falling back to a certificate's key as golang-jwt does.
fn public_key_info(file: &[u8]) -> Result<PublicKeyInfo, String> {
    let der = first_pem_block(file)?;
    if let Some(info) = spki_parts(&der) {
        return Ok(info);
    }
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|_| "neither a PKIX public key nor a certificate".to_string())?;
    spki_parts(cert.public_key().raw).ok_or_else(|| "unreadable certificate public key".into())
}

/// An RSA private key (PKCS#1, or PKCS#8 holding one): the signing key and the PKCS#1
/// RSAPublicKey of its public half.
fn rsa_private(file: &[u8]) -> Result<(EncodingKey, Vec<u8>), String> {
    let der = first_pem_block(file)?;
    let pkcs1 = match pkcs8_parts(&der) {
        Some((oid, key)) if oid == OID_RSA => key.to_vec(),
        Some(_) => return Err("Key is not a valid RSA private key".into()),
        None => der,
    };
    let pair = ring::signature::RsaKeyPair::from_der(&pkcs1).map_err(|e| {
        format!("not an RSA private key ring can sign with (2048 to 4096 bits): {e}")
    })?;
    let public = pair.public_key().as_ref().to_vec();
    Ok((EncodingKey::from_rsa_der(&pkcs1), public))
}

/// An RSA public key (PKIX or a certificate's): its PKCS#1 RSAPublicKey.
fn rsa_public(file: &[u8]) -> Result<Vec<u8>, String> {
    let PublicKeyInfo { algorithm, key, .. } = public_key_info(file)?;
    if algorithm != OID_RSA || rsa_components(&key).is_none() {
        return Err("Key is not a valid RSA public key".into());
    }
    Ok(key)
}

/// An RSAPublicKey's modulus and exponent, without leading zero bytes.
fn rsa_components(public: &[u8]) -> Option<(&[u8], &[u8])> {
    let (seq, _) = der_expect(public, TAG_SEQUENCE)?;
    let (n, rest) = der_expect(seq, TAG_INTEGER)?;
    let (e, _) = der_expect(rest, TAG_INTEGER)?;
    let trim = |x: &[u8]| -> usize { x.iter().take_while(|&&b| b == 0).count() };
    Some((&n[trim(n)..], &e[trim(e)..]))
}

fn check_rsa_verify_size(public: &[u8]) -> Result<(), String> {
    let (n, _) = rsa_components(public).ok_or("Key is not a valid RSA public key")?;
    let bits = n
        .first()
        .map_or(0, |&b| n.len() * 8 - b.leading_zeros() as usize);
    if !(RSA_VERIFY_BITS_MIN..=RSA_VERIFY_BITS_MAX).contains(&bits) {
        return Err(format!(
            "an RSA key of {bits} bits: Keel verifies with {RSA_VERIFY_BITS_MIN} to {RSA_VERIFY_BITS_MAX} bits"
        ));
    }
    Ok(())
}

/// An ECDSA private key (SEC1, or PKCS#8 holding one) on `curve`: the signing key (PKCS#8, as
/// jsonwebtoken takes it) and the public point.
fn ec_private(file: &[u8], curve: Curve) -> Result<(EncodingKey, Vec<u8>), String> {
    let der = first_pem_block(file)?;
    let pkcs8 = match pkcs8_parts(&der) {
        Some((oid, _)) if oid == OID_EC_PUBLIC_KEY => der,
        Some(_) => return Err("Key is not a valid ECDSA private key".into()),
        // SEC1 ECPrivateKey: wrap it in a PKCS#8 PrivateKeyInfo naming the method's curve
        // (ring checks the key's own curve parameters against it).
        None => {
            let mut alg_id = der_tlv(TAG_OID, OID_EC_PUBLIC_KEY);
            alg_id.extend(der_tlv(TAG_OID, curve.oid()));
            let mut info = der_tlv(TAG_INTEGER, &[0]);
            info.extend(der_tlv(TAG_SEQUENCE, &alg_id));
            info.extend(der_tlv(TAG_OCTET_STRING, &der));
            der_tlv(TAG_SEQUENCE, &info)
        }
    };
    let rng = ring::rand::SystemRandom::new();
    let pair =
        ring::signature::EcdsaKeyPair::from_pkcs8(curve.signing(), &pkcs8, &rng).map_err(|e| {
            format!(
                "not an ECDSA {} private key with its public key (SEC1 or PKCS#8): {e}",
                curve.name()
            )
        })?;
    let point = pair.public_key().as_ref().to_vec();
    Ok((EncodingKey::from_ec_der(&pkcs8), point))
}

/// An ECDSA public key (PKIX or a certificate's): its curve's OID and its uncompressed point.
fn ec_public(file: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let PublicKeyInfo {
        algorithm: oid,
        parameters,
        key,
    } = public_key_info(file)?;
    let curve = parameters.unwrap_or_default();
    let point_len = if curve == OID_P256 {
        65
    } else if curve == OID_P384 {
        97
    } else {
        0
    };
    if oid != OID_EC_PUBLIC_KEY || key.len() != point_len || key.first() != Some(&0x04) {
        return Err("Key is not a valid ECDSA public key (P-256 or P-384, uncompressed)".into());
    }
    Ok((curve, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const HS_KEY: &[u8] = b"secret-key-123\n";

    fn at(unix_s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(unix_s)
    }

    fn hs256(ttl_s: i64) -> Jwt {
        Jwt::from_key_material("HS256", None, Some(HS_KEY), ttl_s * 1_000_000_000)
            .expect("an HMAC key")
    }

    #[test]
    fn options_parse_as_etcd_parses_them() {
        assert!(matches!(
            TokenProvider::parse("simple").unwrap().0,
            TokenProvider::Simple
        ));
        assert!(matches!(
            TokenProvider::parse("simple,x=y").unwrap().0,
            TokenProvider::Simple
        ));
        assert!(matches!(
            TokenProvider::parse("").unwrap().0,
            TokenProvider::Nop
        ));
        for bad in [
            "bogus",
            "jwt",
            "jwt,priv-key",
            "jwt,a=b=c,sign-method=HS256",
            "jwt,sign-method=HS256,sign-method=HS384",
            "jwt,sign-method=XX256",
            "jwt,sign-method=HS256,ttl=abc",
            "jwt,sign-method=HS256,priv-key=/nonexistent/key",
        ] {
            let e = TokenProvider::parse(bad).unwrap_err();
            assert!(e.contains(ERR_INVALID_AUTH_OPTS), "{bad}: {e}");
        }
        let e = TokenProvider::parse("jwt,sign-method=RS256").unwrap_err();
        assert!(e.ends_with(ERR_MISSING_KEY), "{e}");
        let e = TokenProvider::parse("jwt,sign-method=HS256").unwrap_err();
        assert!(e.ends_with(ERR_MISSING_KEY), "{e}");
        let e = TokenProvider::parse("jwt,sign-method=none,priv-key=").unwrap_err();
        assert!(e.contains("unsupported signing method"), "{e}");
        let e = TokenProvider::parse("jwt,sign-method=ES512,pub-key=").unwrap_err();
        assert!(e.contains("ES512"), "{e}");
    }

    #[test]
    fn unknown_options_are_warned_about_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("hs.key");
        std::fs::write(&key, HS_KEY).unwrap();
        let flag = format!(
            "jwt,foo=bar,priv-key={},sign-method=HS256,ttl=1m30s",
            key.display()
        );
        let (p, warnings) = TokenProvider::parse(&flag).unwrap();
        let TokenProvider::Jwt(jwt) = p else {
            panic!("a JWT provider")
        };
        assert_eq!(jwt.ttl_ns, 90_000_000_000);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("foo"));
        // A key that is not PEM is refused with golang-jwt's words.
        std::fs::write(&key, b"not a key").unwrap();
        let flag = format!("jwt,priv-key={},sign-method=RS256", key.display());
        let e = TokenProvider::parse(&flag).unwrap_err();
        assert!(e.contains("must be a PEM encoded"), "{e}");
    }

    #[test]
    fn hmac_tokens_are_byte_for_byte_etcds() {
        // Signed by etcd 3.4.23 with `--auth-token jwt,priv-key=<HS_KEY>,sign-method=HS256`.
        let etcd = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE3OTYwNjYxMzIsInJldmlzaW9uIjo0LCJ1c2VybmFtZSI6InJvb3QifQ.OfwT_vdMnC523RiJgqkq0uqybIqPgAHIZ5MA4gCLW7U";
        let jwt = hs256(10);
        let ours = jwt.sign("root", 4, at(1_796_066_122)).unwrap();
        assert_eq!(ours, etcd);
        let info = jwt.verify(etcd, 1_796_066_131).expect("valid until exp");
        assert_eq!((info.user.as_str(), info.revision), ("root", 4));
        // exp is the first second it is no longer valid (golang-jwt: now.Before(exp)).
        assert_eq!(jwt.verify(etcd, 1_796_066_132), None);
    }

    #[test]
    fn sign_verify_round_trip_expiry_and_tampering() {
        let jwt = hs256(60);
        let now = at(1_000_000);
        let t = jwt.sign("al<i>ce\"&", 7, now).unwrap();
        let info = jwt.verify(&t, 1_000_000).unwrap();
        assert_eq!(info.user, "al<i>ce\"&");
        assert_eq!(info.revision, 7);
        assert_eq!(jwt.verify(&t, 1_000_059).map(|i| i.revision), Some(7));
        assert_eq!(jwt.verify(&t, 1_000_060), None, "expired");
        // Tampered claims, signature or header.
        let parts: Vec<&str> = t.split('.').collect();
        let forged =
            URL_SAFE_NO_PAD.encode(br#"{"exp":9999999999,"revision":7,"username":"root"}"#);
        assert_eq!(
            jwt.verify(&format!("{}.{forged}.{}", parts[0], parts[2]), 1_000_000),
            None
        );
        let mut sig = parts[2].to_string();
        sig.replace_range(0..1, if sig.starts_with('A') { "B" } else { "A" });
        assert_eq!(
            jwt.verify(&format!("{}.{}.{sig}", parts[0], parts[1]), 1_000_000),
            None
        );
        let none = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        assert_eq!(
            jwt.verify(&format!("{none}.{}.", parts[1]), 1_000_000),
            None
        );
        // Another key, or another method with the same key.
        let other =
            Jwt::from_key_material("HS256", None, Some(b"another key"), 60_000_000_000).unwrap();
        assert_eq!(other.verify(&t, 1_000_000), None);
        let hs384 = Jwt::from_key_material("HS384", None, Some(HS_KEY), 60_000_000_000).unwrap();
        assert_eq!(hs384.verify(&t, 1_000_000), None);
        // Not tokens at all.
        for junk in [
            "",
            ".",
            "..",
            "a.b.c",
            "a.b.c.d",
            &"x".repeat(TOKEN_BYTES_MAX + 1),
        ] {
            assert_eq!(jwt.verify(junk, 1_000_000), None, "{junk:?}");
        }
    }

    #[test]
    fn claims_follow_golang_jwt() {
        let jwt = hs256(60);
        let now = 1_000_000i64;
        let check = |claims: &str| {
            let t = jwt.sign_payload(claims.as_bytes()).unwrap();
            jwt.verify(&t, now).map(|i| (i.user, i.revision))
        };
        let root = |rev| Some(("root".to_string(), rev));
        assert_eq!(
            check(r#"{"username":"root","revision":4}"#),
            root(4),
            "no exp"
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"exp":0}"#),
            root(4)
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4.7,"exp":1000001}"#),
            root(4)
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"exp":1000000.9}"#),
            None
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"exp":null}"#),
            None
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"exp":"9999999999"}"#),
            None
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"nbf":1000001}"#),
            None
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"nbf":1000000}"#),
            root(4)
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"iat":1000001}"#),
            None
        );
        assert_eq!(
            check(r#"{"username":"root","revision":4,"iat":999999}"#),
            root(4)
        );
        // Types etcd asserts (and panics on): invalid here.
        assert_eq!(check(r#"{"username":"root","revision":"4"}"#), None);
        assert_eq!(check(r#"{"username":7,"revision":4}"#), None);
        assert_eq!(check(r#"{"revision":4}"#), None);
        assert_eq!(check(r#"[1,2]"#), None);
        assert_eq!(check(r#"null"#), None);
        // Trailing bytes after the claims object are not looked at (json.Decoder).
        assert_eq!(
            check(r#"{"username":"root","revision":4} trailing"#),
            root(4)
        );
        // Go's float conversions.
        assert_eq!(
            check(r#"{"username":"root","revision":-1}"#),
            root(u64::MAX)
        );
        assert_eq!(check(r#"{"username":"root","revision":1e30}"#), root(0));
    }

    /// Test keys (testdata/README.md).
    fn key(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/auth/testdata")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// A provider from key files given as (pub-key, priv-key) names in testdata.
    fn with_keys(
        method: &str,
        public: Option<&str>,
        private: Option<&str>,
    ) -> Result<Jwt, OptionsError> {
        let mut opts = HashMap::new();
        opts.insert(OPT_SIGN_METHOD.to_string(), method.to_string());
        if let Some(p) = public {
            opts.insert(OPT_PUBLIC_KEY.to_string(), p.to_string());
        }
        if let Some(p) = private {
            opts.insert(OPT_PRIVATE_KEY.to_string(), p.to_string());
        }
        Jwt::from_options(&opts, &|name| Ok(key(name)))
    }

    #[test]
    fn etcds_rsa_and_ecdsa_tokens_verify_here_and_ours_round_trip() {
        let now = 1_800_000_000;
        let tokens = String::from_utf8(key("etcd-tokens.txt")).unwrap();
        for line in tokens.lines() {
            let (method, token) = line.split_once(' ').unwrap();
            let (private, public) = if method.starts_with('E') {
                ("ec.pem", "ec.pub")
            } else {
                ("rsa.pem", "rsa.pub")
            };
            let signer = with_keys(method, Some(public), Some(private)).unwrap();
            let info = signer
                .verify(token, now)
                .unwrap_or_else(|| panic!("{method}"));
            assert_eq!((info.user.as_str(), info.revision), ("root", 4), "{method}");
            // Verify-only: the public key alone checks it too, and cannot sign.
            let verifier = with_keys(method, Some(public), None).unwrap();
            assert!(verifier.verify_only());
            assert_eq!(verifier.verify(token, now).map(|i| i.revision), Some(4));
            assert_eq!(verifier.sign("root", 4, at(1)), Err(SignError::VerifyOnly));
            // Ours, checked by both, until it expires; tampered or under another key, never.
            let ours = signer.sign("alice", 9, at(now as u64)).unwrap();
            assert_eq!(
                verifier.verify(&ours, now).map(|i| i.user),
                Some("alice".into())
            );
            assert_eq!(signer.verify(&ours, now + 299).map(|i| i.revision), Some(9));
            assert_eq!(signer.verify(&ours, now + 300), None, "{method}: expired");
            let mut tampered = ours.clone().into_bytes();
            let i = ours.find('.').unwrap() + 3;
            tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
            let tampered = String::from_utf8(tampered).unwrap();
            assert_eq!(signer.verify(&tampered, now), None, "{method}: tampered");
        }
        // Another RSA key does not verify etcd's RS256 token; a certificate's key does.
        let (_, rs256) = tokens.lines().next().unwrap().split_once(' ').unwrap();
        let other = with_keys("RS256", None, Some("rsa-other.pem")).unwrap();
        assert_eq!(other.verify(rs256, now), None);
        let cert = with_keys("RS256", Some("rsa-cert.pem"), None).unwrap();
        assert_eq!(cert.verify(rs256, now).map(|i| i.revision), Some(4));
        // An RS256 token is not a PS256 one.
        let ps256 = with_keys("PS256", None, Some("rsa.pem")).unwrap();
        assert_eq!(ps256.verify(rs256, now), None);
    }

    #[test]
    fn keys_load_in_every_form_golang_jwt_reads() {
        for (method, public, private) in [
            ("RS256", None, Some("rsa-pkcs1.pem")),
            ("RS512", Some("rsa.pub"), Some("rsa.pem")),
            ("ES256", None, Some("ec-pkcs8.pem")),
            ("ES384", None, Some("ec384.pem")),
        ] {
            let jwt =
                with_keys(method, public, private).unwrap_or_else(|e| panic!("{method}: {e:?}"));
            let t = jwt.sign("u", 1, at(1_000)).unwrap();
            assert_eq!(
                jwt.verify(&t, 1_000).map(|i| i.user),
                Some("u".into()),
                "{method}"
            );
        }
        let refused = |method: &str, public: Option<&str>, private: Option<&str>| match with_keys(
            method, public, private,
        ) {
            Err(OptionsError::Key(why)) => why,
            other => panic!("{method} {public:?} {private:?}: {other:?}"),
        };
        assert!(refused("RS256", None, Some("rsa1024.pem")).contains("2048"));
        assert!(refused("RS256", None, Some("ec.pem")).contains("RSA"));
        assert!(refused("RS256", Some("ec.pub"), None).contains("not a valid RSA public key"));
        assert!(refused("ES256", None, Some("rsa.pem")).contains("ECDSA"));
        assert!(refused("ES256", None, Some("ec384.pem")).contains("P-256"));
        assert!(refused("ES384", Some("ec.pub"), None).contains("P-384"));
        assert!(refused("ES256", Some("rsa.pub"), None).contains("ECDSA public key"));
        assert_eq!(refused("ES256", None, None), ERR_MISSING_KEY);
        // etcd's mismatch check fires only when exponent and modulus both differ: two keys
        // with e = 65537 pass it, and the private key's own half verifies.
        let jwt = with_keys("RS256", Some("rsa.pub"), Some("rsa-other.pem")).unwrap();
        let t = jwt.sign("u", 1, at(1_000)).unwrap();
        assert!(jwt.verify(&t, 1_000).is_some());
    }

    #[test]
    fn go_conversions() {
        assert_eq!(go_f64_to_i64(1.9), 1);
        assert_eq!(go_f64_to_i64(-1.9), -1);
        assert_eq!(go_f64_to_i64(1e19), i64::MIN);
        assert_eq!(go_f64_to_u64(1.5e19), 15_000_000_000_000_000_000);
        assert_eq!(go_numeric_date_seconds(5.5), 5);
        assert_eq!(go_numeric_date_seconds(-1.5), -2);
        assert_eq!(go_json_string("a\u{1}<\n"), "\"a\\u0001\\u003c\\n\"");
        assert_eq!(unix_seconds(UNIX_EPOCH - Duration::from_millis(1)), -1);
        assert_eq!(unix_seconds(at(5) + Duration::from_millis(999)), 5);
    }

    #[test]
    fn der_reader_reads_what_it_writes() {
        let long = vec![7u8; 300];
        let tlv = der_tlv(TAG_OCTET_STRING, &long);
        let (tag, body, rest) = der_next(&tlv).unwrap();
        assert_eq!((tag, body, rest.len()), (TAG_OCTET_STRING, &long[..], 0));
        assert_eq!(der_next(&tlv[..tlv.len() - 1]), None, "short");
        assert_eq!(der_next(&[0x30, 0x80, 0, 0]), None, "indefinite length");
        assert_eq!(der_next(&[0x1f, 0x01, 0]), None, "high tag number");
    }
}
