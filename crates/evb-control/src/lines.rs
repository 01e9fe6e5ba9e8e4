//! The control lines between a launcher and the processes it starts, on
//! their stdin and stdout: `evb run` and its nodes, `evb bench` and its
//! workers. One line per message, a tag and its payload:
//!
//! | line | from | meaning |
//! | --- | --- | --- |
//! | `LISTEN <token>` | node, worker | how the others reach it (a TCP port, or hex bytes of an engine address) |
//! | `PEERS <token> <token> ...` | launcher | every endpoint's address, by rank |
//! | `STATS <json>` | node | a periodic [`NodeReport`] (every 250 ms) |
//! | `FINAL <json>` | node | the last [`NodeReport`] |
//! | `RESULT <json>` | worker | a benchmark worker's [`WorkerResult`] |
//! | `STOP` | launcher | drain and end the run (Ctrl-C on `evb run`) |
//!
//! A token is one word: no whitespace, not empty. Every line is built by
//! [`ToLauncher::encode`] or [`ToNode::encode`] and read by their `parse`,
//! so both sides agree by construction; `parse` never panics, and says
//! what is wrong with a line it cannot read.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::report::NodeReport;
use crate::worker::WorkerResult;

/// What a node or a benchmark worker writes on its stdout for its launcher.
#[derive(Debug, Clone, PartialEq)]
pub enum ToLauncher {
    /// `LISTEN <token>`: how the other endpoints reach this one.
    Listen(String),
    /// `STATS <json>`: the node's report so far.
    Stats(Box<NodeReport>),
    /// `FINAL <json>`: the node's last report.
    Final(Box<NodeReport>),
    /// `RESULT <json>`: a benchmark worker's result.
    Result(Box<WorkerResult>),
}

/// What a launcher writes on the stdin of a node or a benchmark worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToNode {
    /// `PEERS <token>...`: every endpoint's token, by rank.
    Peers(Vec<String>),
    /// `STOP`: drain and end the run.
    Stop,
}

/// Why a line is not a control line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LineError {
    #[error("an empty line")]
    Empty,
    #[error("unknown tag `{tag}` in `{line}`")]
    UnknownTag { tag: String, line: String },
    #[error("`{tag}` without its {what}")]
    Missing {
        tag: &'static str,
        what: &'static str,
    },
    #[error("`{tag}` takes one token without spaces, not `{rest}`")]
    NotOneToken { tag: &'static str, rest: String },
    #[error("`{tag}` takes nothing after it, not `{rest}`")]
    Trailing { tag: &'static str, rest: String },
    #[error("`{tag}` carries unreadable JSON: {error}")]
    Json { tag: &'static str, error: String },
}

const LISTEN: &str = "LISTEN";
const PEERS: &str = "PEERS";
const STATS: &str = "STATS";
const FINAL: &str = "FINAL";
const RESULT: &str = "RESULT";
const STOP: &str = "STOP";

/// Characters of a bad line quoted in an error (a JSON line is long).
const QUOTED: usize = 80;

/// Whether `token` can stand in a line as one word.
pub fn is_token(token: &str) -> bool {
    !token.is_empty() && !token.contains(char::is_whitespace)
}

impl ToLauncher {
    /// The line, with its `\n`: written in one `write`, it cannot
    /// interleave with other writers of the same pipe.
    pub fn encode(&self) -> String {
        match self {
            ToLauncher::Listen(token) => {
                debug_assert!(is_token(token), "LISTEN token `{token}`");
                format!("{LISTEN} {token}\n")
            }
            ToLauncher::Stats(r) => json_line(STATS, r),
            ToLauncher::Final(r) => json_line(FINAL, r),
            ToLauncher::Result(r) => json_line(RESULT, r),
        }
    }

    /// Reads one line (with or without its line end).
    pub fn parse(line: &str) -> Result<ToLauncher, LineError> {
        let (tag, rest) = split(line)?;
        match tag {
            LISTEN => one_token(LISTEN, rest).map(ToLauncher::Listen),
            STATS => json(STATS, rest).map(ToLauncher::Stats),
            FINAL => json(FINAL, rest).map(ToLauncher::Final),
            RESULT => json(RESULT, rest).map(ToLauncher::Result),
            _ => Err(unknown(tag, line)),
        }
    }
}

impl ToNode {
    /// The line, with its `\n`.
    pub fn encode(&self) -> String {
        match self {
            ToNode::Peers(tokens) => {
                debug_assert!(tokens.iter().all(|t| is_token(t)), "PEERS {tokens:?}");
                format!("{PEERS} {}\n", tokens.join(" "))
            }
            ToNode::Stop => format!("{STOP}\n"),
        }
    }

    /// Reads one line (with or without its line end).
    pub fn parse(line: &str) -> Result<ToNode, LineError> {
        let (tag, rest) = split(line)?;
        match tag {
            PEERS => {
                let tokens: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
                if tokens.is_empty() {
                    return Err(LineError::Missing {
                        tag: PEERS,
                        what: "tokens",
                    });
                }
                Ok(ToNode::Peers(tokens))
            }
            STOP if rest.trim().is_empty() => Ok(ToNode::Stop),
            STOP => Err(LineError::Trailing {
                tag: STOP,
                rest: quoted(rest.trim()),
            }),
            _ => Err(unknown(tag, line)),
        }
    }
}

/// The tag and the rest of a line, its line end taken off.
fn split(line: &str) -> Result<(&str, &str), LineError> {
    let line = line.trim_end_matches(['\n', '\r']);
    let line = line.trim_start();
    if line.trim().is_empty() {
        return Err(LineError::Empty);
    }
    Ok(line.split_once(' ').unwrap_or((line.trim_end(), "")))
}

fn unknown(tag: &str, line: &str) -> LineError {
    LineError::UnknownTag {
        tag: quoted(tag),
        line: quoted(line.trim_end()),
    }
}

fn one_token(tag: &'static str, rest: &str) -> Result<String, LineError> {
    let token = rest.trim();
    if token.is_empty() {
        return Err(LineError::Missing { tag, what: "token" });
    }
    if !is_token(token) {
        return Err(LineError::NotOneToken {
            tag,
            rest: quoted(token),
        });
    }
    Ok(token.to_string())
}

fn json<T: DeserializeOwned>(tag: &'static str, rest: &str) -> Result<Box<T>, LineError> {
    if rest.trim().is_empty() {
        return Err(LineError::Missing { tag, what: "JSON" });
    }
    serde_json::from_str(rest).map_err(|e| LineError::Json {
        tag,
        error: e.to_string(),
    })
}

fn json_line<T: Serialize>(tag: &str, value: &T) -> String {
    // The report types are plain data: serialising them cannot fail.
    let json = serde_json::to_string(value).expect("a report serialises");
    format!("{tag} {json}\n")
}

/// `text`, cut to [`QUOTED`] characters for an error message.
fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Latency, PeerLoss};
    use crate::worker::SizeResult;

    fn report() -> NodeReport {
        NodeReport {
            node: 3,
            role: "RU+BU".into(),
            elapsed_s: 1.5,
            events_built: 4096,
            bytes_built: 1 << 30,
            latency_ns: Latency {
                p50: 1000,
                ..Default::default()
            },
            latency_buckets: vec![(1000, 3), (2000, 1)],
            peers_lost: vec![PeerLoss {
                peer: 2,
                reason: "silent for 800 ms".into(),
                at_unix_s: 1.7e9,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn every_line_reads_back_as_written() {
        let to_launcher = [
            ToLauncher::Listen("40123".into()),
            ToLauncher::Listen("127.0.0.1:40123,10.0.0.2:5000".into()),
            ToLauncher::Listen("0a1b2c".into()),
            ToLauncher::Stats(Box::new(report())),
            ToLauncher::Final(Box::new(report())),
            ToLauncher::Result(Box::new(WorkerResult {
                rank: 1,
                transport: "shm".into(),
                sizes: vec![SizeResult {
                    size: 4096,
                    rx_gbps: 12.5,
                    latency_p50_us: Some(3.25),
                    ..Default::default()
                }],
                lost_peers: vec![(0, 0.875)],
                ..Default::default()
            })),
        ];
        for m in to_launcher {
            let line = m.encode();
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            assert_eq!(ToLauncher::parse(&line), Ok(m.clone()), "{line}");
            assert_eq!(ToLauncher::parse(line.trim_end()), Ok(m), "{line}");
        }
        let to_node = [
            ToNode::Peers(vec!["127.0.0.1:1".into(), "ab".into(), "x,y".into()]),
            ToNode::Peers(vec!["one".into()]),
            ToNode::Stop,
        ];
        for m in to_node {
            let line = m.encode();
            assert_eq!(ToNode::parse(&line), Ok(m.clone()), "{line}");
            assert_eq!(ToNode::parse(&line.replace('\n', "\r\n")), Ok(m), "{line}");
        }
    }

    #[test]
    fn the_lines_are_the_documented_ones() {
        assert_eq!(ToLauncher::Listen("9".into()).encode(), "LISTEN 9\n");
        assert_eq!(
            ToNode::Peers(vec!["a:1".into(), "b:2".into()]).encode(),
            "PEERS a:1 b:2\n"
        );
        assert_eq!(ToNode::Stop.encode(), "STOP\n");
        assert!(ToLauncher::Final(Box::new(report()))
            .encode()
            .starts_with("FINAL {\"node\":3,"));
        assert!(ToLauncher::Stats(Box::new(report()))
            .encode()
            .starts_with("STATS {"));
    }

    #[test]
    fn what_the_readers_accepted_before_they_still_accept() {
        // The launcher trimmed the LISTEN token; the node took `STOP` with
        // blanks around it and split PEERS on any whitespace.
        assert_eq!(
            ToLauncher::parse("LISTEN  40123 "),
            Ok(ToLauncher::Listen("40123".into()))
        );
        assert_eq!(ToNode::parse("  STOP  \n"), Ok(ToNode::Stop));
        assert_eq!(
            ToNode::parse("PEERS a\tb  c"),
            Ok(ToNode::Peers(vec!["a".into(), "b".into(), "c".into()]))
        );
    }

    #[test]
    fn malformed_lines_are_errors_that_say_why() {
        let unknown = |tag: &str, line: &str| LineError::UnknownTag {
            tag: tag.into(),
            line: line.into(),
        };
        let from_node = [
            ("", LineError::Empty),
            ("  \n", LineError::Empty),
            (
                "LISTEN",
                LineError::Missing {
                    tag: "LISTEN",
                    what: "token",
                },
            ),
            (
                "LISTEN a b",
                LineError::NotOneToken {
                    tag: "LISTEN",
                    rest: "a b".into(),
                },
            ),
            (
                "STATS",
                LineError::Missing {
                    tag: "STATS",
                    what: "JSON",
                },
            ),
            ("listen 1", unknown("listen", "listen 1")),
            // What a node prints that is not a control line.
            (
                "evb node 1: preallocated 4 buffers",
                unknown("evb", "evb node 1: preallocated 4 buffers"),
            ),
            // The launcher's lines are not the node's.
            ("STOP", unknown("STOP", "STOP")),
        ];
        for (line, error) in from_node {
            assert_eq!(ToLauncher::parse(line), Err(error), "`{line}`");
        }
        let from_launcher = [
            ("", LineError::Empty),
            (
                "PEERS ",
                LineError::Missing {
                    tag: "PEERS",
                    what: "tokens",
                },
            ),
            (
                "STOP now",
                LineError::Trailing {
                    tag: "STOP",
                    rest: "now".into(),
                },
            ),
            ("LISTEN 1", unknown("LISTEN", "LISTEN 1")),
        ];
        for (line, error) in from_launcher {
            assert_eq!(ToNode::parse(line), Err(error), "`{line}`");
        }
        match ToLauncher::parse("FINAL {\"node\": \"three\"}") {
            Err(LineError::Json {
                tag: "FINAL",
                error,
            }) => {
                assert!(error.contains("invalid type"), "{error}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_error_quotes_a_long_line_cut_short() {
        let long = format!("NOISE {}", "é".repeat(500));
        let e = ToLauncher::parse(&long).unwrap_err();
        let LineError::UnknownTag { line, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(line.chars().count(), QUOTED + 3);
        assert!(e.to_string().len() < 300);
    }

    /// Lines of every shape: tags, cut JSON, blanks, control characters and
    /// multi-byte text at every length. None may panic either parser.
    #[test]
    fn no_line_makes_a_parser_panic() {
        let json = ToLauncher::Final(Box::new(report())).encode();
        let mut lines: Vec<String> = Vec::new();
        for prefix in [
            "LISTEN", "PEERS", "STATS", "FINAL", "RESULT", "STOP", "", " ", "\t",
        ] {
            for rest in [
                "", " ", "  ", "\n", "\r\n", " x", " \u{0}", " é ü", " {", " }",
            ] {
                lines.push(format!("{prefix}{rest}"));
            }
        }
        for cut in 0..json.len() {
            if json.is_char_boundary(cut) {
                lines.push(json[..cut].to_string());
            }
        }
        const ALPHABET: &[u8] = b" \t\nLISTENPEERSTOPFINAL{}\":,0123456789x\x00";
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ALPHABET[(state % ALPHABET.len() as u64) as usize]
                })
                .collect();
            lines.push(String::from_utf8_lossy(&bytes).into_owned());
        }
        for line in &lines {
            let _ = ToLauncher::parse(line);
            let _ = ToNode::parse(line);
            if let Ok(m) = ToLauncher::parse(line) {
                assert_eq!(ToLauncher::parse(&m.encode()), Ok(m));
            }
            if let Ok(m) = ToNode::parse(line) {
                assert_eq!(ToNode::parse(&m.encode()), Ok(m));
            }
        }
    }
}
