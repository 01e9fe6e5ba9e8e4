//! Proof that a connecting peer belongs to the run: a shared run key and a
//! challenge-response in the TCP handshake (HMAC-SHA256), so that a
//! stranger who knows the run id and a node number still cannot join.
//!
//! With a key, the handshake is (c: the connecting side, a: the accepting):
//!
//! 1. c -> a: Hello, nonce_c (16 random bytes);
//! 2. a -> c: Hello, nonce_a, HMAC(key, "evb-accept" | run | a | c | nonce_c | nonce_a);
//! 3. c -> a: HMAC(key, "evb-connect" | run | c | a | nonce_a | nonce_c).
//!
//! Each side proves the key over the other's fresh nonce, so replaying a
//! recorded handshake fails. The key comes from `transport.run_key_file`
//! or the `EVB_RUN_KEY` environment variable (hex); `evb run` makes a
//! fresh one for every run. Without a key the handshake is Hello only.

use anyhow::{bail, Context, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const NONCE_LEN: usize = 16;
pub const MAC_LEN: usize = 32;
/// The environment variable `evb run` passes the run key in (hex).
pub const KEY_ENV: &str = "EVB_RUN_KEY";

/// The run key, if one is configured.
pub fn load_key(run_key_file: &str) -> Result<Option<Vec<u8>>> {
    if !run_key_file.is_empty() {
        let key = std::fs::read(run_key_file)
            .with_context(|| format!("transport.run_key_file: reading {run_key_file}"))?;
        let key = trim_ascii(&key).to_vec();
        if key.len() < 16 {
            bail!("transport.run_key_file {run_key_file}: a run key needs at least 16 bytes");
        }
        return Ok(Some(key));
    }
    match std::env::var(KEY_ENV) {
        Ok(hex) => {
            let key = crate::msg::from_hex(hex.trim())
                .with_context(|| format!("{KEY_ENV} is not hex"))?;
            if key.len() < 16 {
                bail!("{KEY_ENV}: a run key needs at least 16 bytes");
            }
            Ok(Some(key))
        }
        Err(_) => Ok(None),
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

pub fn nonce() -> [u8; NONCE_LEN] {
    rand::random()
}

/// A fresh random key, hex-encoded (for `evb run`).
pub fn fresh_key_hex() -> String {
    let key: [u8; 32] = rand::random();
    crate::msg::to_hex(&key)
}

/// The proof one side gives: `role` is "evb-accept" or "evb-connect".
pub fn proof(
    key: &[u8],
    role: &str,
    run_id: u32,
    me: u16,
    peer: u16,
    their_nonce: &[u8; NONCE_LEN],
    my_nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(role.as_bytes());
    mac.update(&run_id.to_le_bytes());
    mac.update(&me.to_le_bytes());
    mac.update(&peer.to_le_bytes());
    mac.update(their_nonce);
    mac.update(my_nonce);
    mac.finalize().into_bytes().into()
}

/// Checks a proof in constant time.
#[allow(clippy::too_many_arguments)]
pub fn verify(
    key: &[u8],
    role: &str,
    run_id: u32,
    prover: u16,
    verifier: u16,
    verifier_nonce: &[u8; NONCE_LEN],
    prover_nonce: &[u8; NONCE_LEN],
    got: &[u8; MAC_LEN],
) -> bool {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(role.as_bytes());
    mac.update(&run_id.to_le_bytes());
    mac.update(&prover.to_le_bytes());
    mac.update(&verifier.to_le_bytes());
    mac.update(verifier_nonce);
    mac.update(prover_nonce);
    mac.verify_slice(got).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_key_roles_nodes_and_nonces() {
        let key = b"0123456789abcdef0123";
        let (na, nc) = (nonce(), nonce());
        let p = proof(key, "evb-accept", 7, 2, 1, &nc, &na);
        assert!(verify(key, "evb-accept", 7, 2, 1, &nc, &na, &p));
        assert!(!verify(
            b"another key of 20 b",
            "evb-accept",
            7,
            2,
            1,
            &nc,
            &na,
            &p
        ));
        assert!(!verify(key, "evb-connect", 7, 2, 1, &nc, &na, &p));
        assert!(!verify(key, "evb-accept", 8, 2, 1, &nc, &na, &p));
        assert!(!verify(key, "evb-accept", 7, 1, 2, &nc, &na, &p));
        assert!(!verify(key, "evb-accept", 7, 2, 1, &na, &nc, &p));
    }
}
