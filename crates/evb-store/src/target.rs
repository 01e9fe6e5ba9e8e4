//! Where a store lives, parsed from one configuration string so that a run
//! configuration, the command line and the environment all name it alike:
//! a filesystem path, or `s3://bucket/prefix` with the endpoint and
//! credentials from explicit fields or the standard `AWS_*` variables.

use std::fmt;
use std::path::PathBuf;

use crate::StoreError;

/// A store: a local directory or an S3 bucket and key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreTarget {
    Dir(PathBuf),
    S3(S3Target),
}

/// An S3 bucket, key prefix, endpoint and credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Target {
    pub bucket: String,
    /// Key prefix without leading or trailing `/` (may be empty).
    pub prefix: String,
    /// `http(s)://host[:port]` of an S3-compatible server; `None` for AWS.
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Target {
    // Never print the secret (errors and logs may show a target).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Target")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl S3Target {
    /// The key of `name` (relative to the store root) in the bucket.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }
}

/// Endpoint and credentials for `s3://` targets. Fields left `None` are
/// taken from the environment by [`S3Options::from_env`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
}

impl S3Options {
    /// `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, `AWS_REGION` or
    /// `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`.
    pub fn from_env() -> S3Options {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        S3Options {
            endpoint: var("AWS_ENDPOINT_URL_S3").or_else(|| var("AWS_ENDPOINT_URL")),
            region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
            access_key_id: var("AWS_ACCESS_KEY_ID"),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY"),
            session_token: var("AWS_SESSION_TOKEN"),
        }
    }

    /// These options, with the environment filling what they leave unset.
    pub fn or_env(self) -> S3Options {
        let env = S3Options::from_env();
        S3Options {
            endpoint: self.endpoint.or(env.endpoint),
            region: self.region.or(env.region),
            access_key_id: self.access_key_id.or(env.access_key_id),
            secret_access_key: self.secret_access_key.or(env.secret_access_key),
            session_token: self.session_token.or(env.session_token),
        }
    }
}

impl StoreTarget {
    /// Parses a target, S3 settings from the environment.
    pub fn parse(spec: &str) -> Result<StoreTarget, StoreError> {
        StoreTarget::parse_with(spec, S3Options::from_env())
    }

    /// Parses a target. `s3://bucket/prefix?endpoint=URL&region=R` takes
    /// its endpoint and region from the query if present, else from
    /// `options`; credentials only from `options` (never from a string that
    /// may end up in a log). Anything else is a directory path.
    pub fn parse_with(spec: &str, options: S3Options) -> Result<StoreTarget, StoreError> {
        let bad = |why: String| StoreError::Target {
            spec: spec.to_string(),
            reason: why,
        };
        if spec.trim().is_empty() {
            return Err(bad(
                "empty target (expected a directory or s3://bucket/prefix)".into(),
            ));
        }
        let Some(rest) = spec.strip_prefix("s3://") else {
            if spec.contains("://") {
                return Err(bad(
                    "unknown scheme (expected a directory or s3://bucket/prefix)".into(),
                ));
            }
            return Ok(StoreTarget::Dir(PathBuf::from(spec)));
        };
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if !valid_bucket(bucket) {
            return Err(bad(format!(
                "bucket `{bucket}`: 3 to 63 characters of a-z, 0-9, `.` and `-`"
            )));
        }
        let mut endpoint = options.endpoint;
        let mut region = options.region;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("endpoint", v)) if !v.is_empty() => endpoint = Some(v.to_string()),
                Some(("region", v)) if !v.is_empty() => region = Some(v.to_string()),
                _ => {
                    return Err(bad(format!(
                        "query `{pair}`: only endpoint=URL and region=NAME are accepted"
                    )))
                }
            }
        }
        if let Some(e) = &endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(bad(format!(
                    "endpoint `{e}` must start with http:// or https://"
                )));
            }
        }
        let access_key_id = options
            .access_key_id
            .ok_or_else(|| bad("no access key: set AWS_ACCESS_KEY_ID".into()))?;
        let secret_access_key = options
            .secret_access_key
            .ok_or_else(|| bad("no secret key: set AWS_SECRET_ACCESS_KEY".into()))?;
        Ok(StoreTarget::S3(S3Target {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            endpoint: endpoint.map(|e| e.trim_end_matches('/').to_string()),
            region: region.unwrap_or_else(|| "us-east-1".to_string()),
            access_key_id,
            secret_access_key,
            session_token: options.session_token,
        }))
    }
}

impl fmt::Display for StoreTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreTarget::Dir(p) => write!(f, "{}", p.display()),
            StoreTarget::S3(t) if t.prefix.is_empty() => write!(f, "s3://{}", t.bucket),
            StoreTarget::S3(t) => write!(f, "s3://{}/{}", t.bucket, t.prefix),
        }
    }
}

fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> S3Options {
        S3Options {
            access_key_id: Some("AK".into()),
            secret_access_key: Some("SK".into()),
            ..S3Options::default()
        }
    }

    #[test]
    fn paths_and_urls() {
        assert_eq!(
            StoreTarget::parse_with("/data/evb", creds()).unwrap(),
            StoreTarget::Dir("/data/evb".into())
        );
        let StoreTarget::S3(t) = StoreTarget::parse_with(
            "s3://my-bucket/a/b/?endpoint=http://127.0.0.1:9000/&region=eu-west-1",
            creds(),
        )
        .unwrap() else {
            panic!("not s3")
        };
        assert_eq!(t.bucket, "my-bucket");
        assert_eq!(t.prefix, "a/b");
        assert_eq!(t.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(t.region, "eu-west-1");
        assert_eq!(t.key("run1/x"), "a/b/run1/x");
        assert!(!format!("{t:?}").contains("SK"), "secret in Debug");
    }

    #[test]
    fn bad_targets_say_why() {
        let err = |s: &str, o: S3Options| StoreTarget::parse_with(s, o).unwrap_err().to_string();
        assert!(err("", creds()).contains("empty"));
        assert!(err("ftp://x", creds()).contains("unknown scheme"));
        assert!(err("s3://A_B", creds()).contains("bucket `A_B`"));
        assert!(err("s3://bucket?x=1", creds()).contains("query `x=1`"));
        assert!(err("s3://bucket?endpoint=host:9", creds()).contains("http://"));
        assert!(err("s3://bucket", S3Options::default()).contains("AWS_ACCESS_KEY_ID"));
    }
}
