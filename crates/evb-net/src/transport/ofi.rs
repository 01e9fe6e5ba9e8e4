//! libfabric (`evb-ofi`: RDM endpoints, tagged messages) as a message
//! engine: a thin adapter from `evb_ofi::Endpoint` to
//! [`super::msg::Endpoint`]. Providers as users write them: `tcp`
//! (tcp;ofi_rxm), `udp` (udp;ofi_rxd), `shm`, `verbs`, or any `fi_info` name.

use std::time::Duration;

use anyhow::Result;

use super::msg::{Body, Completion, Endpoint};
use super::Progress;

pub struct OfiEndpoint {
    ep: evb_ofi::Endpoint,
    max_message: usize,
}

impl OfiEndpoint {
    pub fn open(provider: &str, progress: Progress, max_message: usize) -> Result<OfiEndpoint> {
        let mut opts = evb_ofi::Options::new(provider);
        opts.progress = match progress {
            Progress::Blocking => evb_ofi::Progress::Blocking,
            Progress::Busy => evb_ofi::Progress::Busy,
        };
        opts.max_message = max_message;
        Ok(OfiEndpoint {
            ep: evb_ofi::Endpoint::open(&opts)?,
            max_message,
        })
    }

    fn full_length(&self, buf: Vec<u8>) -> Vec<u8> {
        super::msg::full_length(buf, self.max_message)
    }
}

impl Endpoint for OfiEndpoint {
    fn name(&self) -> String {
        format!("ofi:{}", self.ep.provider())
    }

    fn local_address(&self) -> Vec<u8> {
        self.ep.local_address()
    }

    fn add_peer(&mut self, address: &[u8]) -> Result<usize> {
        Ok(self.ep.add_peer(address)?)
    }

    fn post_recv(&mut self, buf: Vec<u8>) -> Result<()> {
        Ok(self.ep.post_recv(buf)?)
    }

    fn send(&mut self, peer: usize, tag: u64, head: Vec<u8>, body: Body, ctx: u64) -> Result<bool> {
        Ok(self.ep.send(peer, tag, head, body, ctx)?)
    }

    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let mut done = Vec::new();
        self.ep.progress(&mut done)?;
        for c in done {
            match c {
                evb_ofi::Completion::Sent { ctx } => out.push(Completion::Sent { ctx }),
                evb_ofi::Completion::SendFailed { ctx, reason } => {
                    out.push(Completion::SendFailed { ctx, reason })
                }
                evb_ofi::Completion::Received { buf, len, tag } => {
                    let buf = self.full_length(buf);
                    out.push(Completion::Received { buf, len, tag });
                }
                evb_ofi::Completion::RecvFailed { buf, reason, .. } => {
                    eprintln!("evb ofi: a message could not be received: {reason}");
                    let buf = self.full_length(buf);
                    self.ep.post_recv(buf)?;
                }
            }
        }
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        Ok(self.ep.wait(timeout)?)
    }
}
