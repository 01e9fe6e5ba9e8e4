//! A minimal blocking S3 client: the four calls the store needs (PUT and
//! GET an object, list a prefix, HEAD/PUT a bucket), signed with AWS
//! Signature Version 4 here rather than with the AWS SDK, whose async stack
//! would dwarf the rest of the workspace's build on a 2-core machine.
//!
//! Addressing is path-style (`endpoint/bucket/key`) when an endpoint is
//! given (MinIO, Ceph RGW, ...), virtual-hosted on AWS itself. Bodies are
//! sent as `UNSIGNED-PAYLOAD` with an `x-amz-checksum-crc32c` header, so the
//! server verifies every byte without a SHA-256 pass over the data.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::target::S3Target;
use crate::StoreError;

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    pub key: String,
    pub size: u64,
}

/// A client for one bucket of one endpoint.
pub struct S3Client {
    target: S3Target,
    agent: ureq::Agent,
}

/// Largest listing page accepted (S3 pages hold at most 1000 keys, ~300 KB).
const MAX_LIST_PAGE_BYTES: u64 = 16 << 20;
/// Largest error body read (S3 error documents are a few hundred bytes).
const MAX_ERROR_BODY_BYTES: u64 = 64 << 10;

impl S3Client {
    /// A client with a timeout on every call, so that a dead server yields
    /// an error rather than a hang.
    pub fn new(target: &S3Target, timeout: Duration) -> S3Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .new_agent();
        S3Client {
            target: target.clone(),
            agent,
        }
    }

    pub fn target(&self) -> &S3Target {
        &self.target
    }

    /// Stores `body` under `key` (relative to the bucket, prefix included).
    pub fn put_object(&self, key: &str, body: &[u8]) -> Result<(), StoreError> {
        let crc = base64(&crc32c::crc32c(body).to_be_bytes());
        let req = self.signed(
            "PUT",
            Some(key),
            &[],
            &[("x-amz-checksum-crc32c", crc.as_str())],
            "UNSIGNED-PAYLOAD",
        );
        let what = format!("PUT {}", self.describe(key));
        let resp = self
            .agent
            .put(&req.url)
            .headers(&req.headers)
            .send(body)
            .map_err(|e| StoreError::S3(format!("{what}: {e}")))?;
        self.check(resp, &what).map(drop)
    }

    /// Stores an empty object under `key` only if there is none yet (a
    /// conditional PUT, `If-None-Match: *`): true if this call made it,
    /// false if the key was taken (HTTP 412). Two such calls at once make
    /// one object; S3 may answer the loser 409 (a conditional request in
    /// conflict), asked again here until the winner's object is there. A
    /// server that ignores the condition makes both succeed.
    pub fn put_if_absent(&self, key: &str) -> Result<bool, StoreError> {
        let what = format!("conditional PUT {}", self.describe(key));
        let mut attempt = 0;
        loop {
            let resp = self.put_empty(Some(key), &[("if-none-match", "*")], &what)?;
            match resp.status().as_u16() {
                412 => return Ok(false),
                409 if attempt < 5 => {
                    std::thread::sleep(Duration::from_millis(20 << attempt));
                    attempt += 1;
                }
                _ => return self.check(resp, &what).map(|_| true),
            }
        }
    }

    /// Sends a signed `PUT` without a body (a bucket, or an empty object
    /// with `headers`), its answer unchecked: the caller reads the status.
    fn put_empty(
        &self,
        key: Option<&str>,
        headers: &[(&str, &str)],
        what: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, StoreError> {
        let req = self.signed("PUT", key, &[], headers, EMPTY_SHA256);
        self.agent
            .put(&req.url)
            .headers(&req.headers)
            .send_empty()
            .map_err(|e| StoreError::S3(format!("{what}: {e}")))
    }

    /// Sends a signed request without a body (`GET`, `HEAD` or `DELETE`)
    /// and checks its answer; `what` names it in errors.
    fn send_empty(
        &self,
        method: &str,
        key: Option<&str>,
        query: &[(&str, &str)],
        what: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, StoreError> {
        let req = self.signed(method, key, query, &[], EMPTY_SHA256);
        let builder = match method {
            "GET" => self.agent.get(&req.url),
            "HEAD" => self.agent.head(&req.url),
            "DELETE" => self.agent.delete(&req.url),
            other => unreachable!("{other} requests carry a body"),
        };
        let resp = builder
            .headers(&req.headers)
            .call()
            .map_err(|e| StoreError::S3(format!("{what}: {e}")))?;
        self.check(resp, what)
    }

    /// Deletes the object `key` (S3 answers success for a key absent).
    pub fn delete_object(&self, key: &str) -> Result<(), StoreError> {
        let what = format!("DELETE {}", self.describe(key));
        self.send_empty("DELETE", Some(key), &[], &what).map(drop)
    }

    /// Reads the object `key`, refusing one larger than `max_bytes`.
    pub fn get_object(&self, key: &str, max_bytes: u64) -> Result<Vec<u8>, StoreError> {
        let what = format!("GET {}", self.describe(key));
        let mut resp = self.send_empty("GET", Some(key), &[], &what)?;
        resp.body_mut()
            .with_config()
            .limit(max_bytes)
            .read_to_vec()
            .map_err(|e| StoreError::S3(format!("{what}: reading the body: {e}")))
    }

    /// Every object whose key starts with `prefix`, in key order.
    pub fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, StoreError> {
        let mut objects = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![
                ("list-type", "2".to_string()),
                ("prefix", prefix.to_string()),
            ];
            if let Some(t) = &token {
                query.push(("continuation-token", t.clone()));
            }
            let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let what = format!("list {}", self.describe(prefix));
            let mut resp = self.send_empty("GET", None, &query, &what)?;
            let xml = resp
                .body_mut()
                .with_config()
                .limit(MAX_LIST_PAGE_BYTES)
                .read_to_string()
                .map_err(|e| StoreError::S3(format!("{what}: reading the listing: {e}")))?;
            for contents in elements(&xml, "Contents") {
                let key = element(contents, "Key")
                    .map(unescape_xml)
                    .ok_or_else(|| StoreError::S3(format!("{what}: an entry has no <Key>")))?;
                let size = element(contents, "Size")
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or_else(|| StoreError::S3(format!("{what}: {key} has no valid <Size>")))?;
                objects.push(ListedObject { key, size });
            }
            let truncated = element(&xml, "IsTruncated").is_some_and(|t| t.trim() == "true");
            match element(&xml, "NextContinuationToken") {
                Some(next) if truncated => token = Some(unescape_xml(next)),
                None if truncated => {
                    return Err(StoreError::S3(format!(
                        "{what}: truncated listing without a continuation token"
                    )))
                }
                _ => break,
            }
        }
        Ok(objects)
    }

    /// Checks that the bucket exists and the credentials may use it.
    pub fn check_bucket(&self) -> Result<(), StoreError> {
        let what = format!("HEAD bucket {}", self.target.bucket);
        self.send_empty("HEAD", None, &[], &what).map(drop)
    }

    /// Creates the bucket (for tests and first use; existing is an error).
    pub fn create_bucket(&self) -> Result<(), StoreError> {
        let what = format!("create bucket {}", self.target.bucket);
        let resp = self.put_empty(None, &[], &what)?;
        self.check(resp, &what).map(drop)
    }

    fn describe(&self, key: &str) -> String {
        format!("s3://{}/{}", self.target.bucket, key)
    }

    /// Turns a non-2xx answer into an error carrying S3's code and message.
    fn check(
        &self,
        mut resp: ureq::http::Response<ureq::Body>,
        what: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, StoreError> {
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_ERROR_BODY_BYTES)
            .lossy_utf8(true)
            .read_to_string()
            .unwrap_or_default();
        let code = element(&body, "Code").unwrap_or("");
        let message = element(&body, "Message").unwrap_or("");
        let detail = if code.is_empty() && message.is_empty() {
            String::new()
        } else {
            format!(": {code} {message}")
        };
        Err(StoreError::S3(format!("{what}: HTTP {status}{detail}")))
    }

    /// The URL and headers of a signed request. `key` None addresses the
    /// bucket itself.
    fn signed(
        &self,
        method: &str,
        key: Option<&str>,
        query: &[(&str, &str)],
        extra_headers: &[(&str, &str)],
        payload_hash: &str,
    ) -> SignedRequest {
        let t = &self.target;
        let (scheme, host, path) = match &t.endpoint {
            Some(endpoint) => {
                let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
                let host = rest.trim_end_matches('/');
                let mut path = format!("/{}", uri_encode(&t.bucket, true));
                if let Some(k) = key {
                    path.push('/');
                    path.push_str(&uri_encode(k, false));
                }
                (scheme.to_string(), host.to_string(), path)
            }
            None => {
                let host = format!("{}.s3.{}.amazonaws.com", t.bucket, t.region);
                let path = format!("/{}", key.map(|k| uri_encode(k, false)).unwrap_or_default());
                ("https".to_string(), host, path)
            }
        };
        let mut query: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (uri_encode(k, true), uri_encode(v, true)))
            .collect();
        query.sort();
        let canonical_query = query
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let amz_date = amz_date(SystemTime::now());
        let mut headers: Vec<(String, String)> = vec![
            ("host".into(), host.clone()),
            ("x-amz-content-sha256".into(), payload_hash.into()),
            ("x-amz-date".into(), amz_date.clone()),
        ];
        if let Some(token) = &t.session_token {
            headers.push(("x-amz-security-token".into(), token.clone()));
        }
        for (k, v) in extra_headers {
            headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
        headers.sort();
        let signed_headers = headers
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let mut canonical = format!("{method}\n{path}\n{canonical_query}\n");
        for (k, v) in &headers {
            let _ = writeln!(canonical, "{k}:{v}");
        }
        let _ = write!(canonical, "\n{signed_headers}\n{payload_hash}");

        let date = &amz_date[..8];
        let scope = format!("{date}/{}/s3/aws4_request", t.region);
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let mut key = hmac(
            format!("AWS4{}", t.secret_access_key).as_bytes(),
            date.as_bytes(),
        );
        for part in [t.region.as_str(), "s3", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
        headers.push((
            "authorization".into(),
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
                t.access_key_id
            ),
        ));
        let url = if canonical_query.is_empty() {
            format!("{scheme}://{host}{path}")
        } else {
            format!("{scheme}://{host}{path}?{canonical_query}")
        };
        SignedRequest { url, headers }
    }
}

struct SignedRequest {
    url: String,
    headers: Vec<(String, String)>,
}

/// Adds a list of headers to a ureq request builder.
trait WithHeaders: Sized {
    fn headers(self, headers: &[(String, String)]) -> Self;
}

impl<B> WithHeaders for ureq::RequestBuilder<B> {
    fn headers(mut self, headers: &[(String, String)]) -> Self {
        for (k, v) in headers {
            self = self.header(k.as_str(), v.as_str());
        }
        self
    }
}

/// SHA-256 of the empty body, for requests without one.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// SigV4 URI encoding: everything but unreserved characters, and `/` too
/// unless it separates path segments.
fn uri_encode(s: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if !encode_slash => out.push('/'),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
fn amz_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// well-known algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The text of the first `<name>...</name>` in `xml`.
fn element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    elements(xml, name).next()
}

/// The texts of every `<name>...</name>` in `xml`, in order. S3 listings
/// are flat and attribute-free, which is all this handles.
fn elements<'a>(xml: &'a str, name: &str) -> impl Iterator<Item = &'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut rest = xml;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let text = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(text)
    })
}

fn unescape_xml(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_encodings() {
        assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
        // 2024-02-29 12:34:56 UTC, a leap day.
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096);
        assert_eq!(amz_date(t), "20240229T123456Z");
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
        assert_eq!(uri_encode("a b/c~", false), "a%20b/c~");
        assert_eq!(uri_encode("a b/c~", true), "a%20b%2Fc~");
    }

    #[test]
    fn sigv4_matches_the_documented_example() {
        // The GET Object example of the S3 SigV4 documentation ("Examples:
        // Signature Calculations"): signing key chain and final signature.
        let mut key = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", b"20130524");
        for part in ["us-east-1", "s3", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        let canonical = "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let sts = format!(
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        assert_eq!(
            hex(&hmac(&key, sts.as_bytes())),
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn listing_elements() {
        let xml = "<R><IsTruncated>true</IsTruncated><Contents><Key>a&amp;b</Key><Size>3</Size></Contents><Contents><Key>c</Key><Size>4</Size></Contents><NextContinuationToken>t</NextContinuationToken></R>";
        let keys: Vec<_> = elements(xml, "Contents")
            .map(|c| unescape_xml(element(c, "Key").unwrap()))
            .collect();
        assert_eq!(keys, ["a&b", "c"]);
        assert_eq!(element(xml, "NextContinuationToken"), Some("t"));
        assert_eq!(element(xml, "Missing"), None);
    }
}
