//! One TCP connection between two endpoints: incremental framing on the
//! receive side, a queue of pending messages on the send side.
//!
//! Receiving reads exactly the bytes of the part in hand (frame header,
//! body, fragment header, payload), so a fragment payload goes from the
//! kernel straight into the buffer its batch will keep: no staging copy.
//! Sending writes straight from the RU's MEP buffer with vectored writes.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::rc::Rc;

use evb_core::wire::{
    FragmentHeader, FrameHeader, Kind, Message, WireError, FRAGMENT_HEADER_LEN, FRAME_HEADER_LEN,
};
use evb_core::{MepId, NodeId};
use mio::net::TcpStream;

use super::RxHandler;
use crate::mepbuf::MepBuf;
use crate::process::PeerProcess;

enum Rx {
    Frame {
        buf: [u8; FRAME_HEADER_LEN],
        got: usize,
    },
    Body {
        frame: FrameHeader,
        buf: [u8; 32],
        got: usize,
    },
    Payload {
        header: FragmentHeader,
        dest: Option<Vec<u8>>,
        got: usize,
        /// The CRC-32C of what arrived so far, when the handler wants it.
        crc: Option<u32>,
    },
}

enum TxItem {
    /// Encoded control messages, coalesced.
    Control(Vec<u8>),
    /// A fragment: frame + fragment header, then the payload from `data`.
    Fragment {
        head: [u8; FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN],
        data: Rc<MepBuf>,
        mep: MepId,
    },
}

impl TxItem {
    fn len(&self) -> usize {
        match self {
            TxItem::Control(b) => b.len(),
            TxItem::Fragment { head, data, .. } => head.len() + data.len(),
        }
    }
}

/// Outcome of servicing a readable connection.
#[derive(Debug, PartialEq, Eq)]
pub enum RxStatus {
    Open,
    /// Stopped at its budget: call again without waiting for readiness.
    MoreToRead,
    /// The peer closed its sending side.
    Closed,
}

pub struct Conn {
    pub stream: TcpStream,
    /// Known once its Hello arrived (or at once for connections we opened).
    pub peer: Option<NodeId>,
    rx: Rx,
    tx: VecDeque<TxItem>,
    /// Bytes of the front item already written.
    tx_offset: usize,
    pub tx_bytes_queued: usize,
    max_body: u64,
    discard: Vec<u8>,
    pub write_shut: bool,
    /// Closed after an error or the peer's close; kept for its token.
    pub closed: bool,
    /// When bytes last arrived (heartbeats included).
    pub last_rx: std::time::Instant,
    /// When the peer last took bytes we sent (our writes progressed).
    pub last_tx_progress: std::time::Instant,
    /// The peer's Hello has arrived on this connection (for an opened
    /// connection: the peer has accepted it and is set up).
    pub hello_seen: bool,
    /// The peer's process, as its Hello named it (default until then).
    pub peer_process: PeerProcess,
    /// The peer said Goodbye (it finished the run, its close is orderly)
    /// and the transport has not reported it yet.
    pub goodbye_seen: bool,
    /// Goodbye is queued: shut our sending side once it is written.
    pub shut_when_flushed: bool,
}

impl Conn {
    pub fn new(stream: TcpStream, peer: Option<NodeId>, max_body: u64) -> Conn {
        Conn {
            stream,
            peer,
            rx: Rx::Frame {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
            tx: VecDeque::new(),
            tx_offset: 0,
            tx_bytes_queued: 0,
            max_body,
            discard: Vec::new(),
            write_shut: false,
            closed: false,
            last_rx: std::time::Instant::now(),
            last_tx_progress: std::time::Instant::now(),
            hello_seen: false,
            peer_process: PeerProcess::default(),
            goodbye_seen: false,
            shut_when_flushed: false,
        }
    }

    pub fn queue_control(&mut self, msg: &Message) {
        if let Some(TxItem::Control(buf)) = self.tx.back_mut() {
            // Appending to the front item is fine: tx_offset counts from its start.
            let before = buf.len();
            msg.encode_into(buf);
            self.tx_bytes_queued += buf.len() - before;
            return;
        }
        let mut buf = Vec::with_capacity(64);
        msg.encode_into(&mut buf);
        self.tx_bytes_queued += buf.len();
        self.tx.push_back(TxItem::Control(buf));
    }

    pub fn queue_fragment(&mut self, header: &FragmentHeader, data: Rc<MepBuf>) {
        debug_assert_eq!(data.len(), header.payload_len as usize);
        let mut head = [0u8; FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN];
        head[..FRAME_HEADER_LEN].copy_from_slice(&header.frame_header().encode());
        head[FRAME_HEADER_LEN..].copy_from_slice(&header.encode());
        let item = TxItem::Fragment {
            head,
            data,
            mep: header.mep,
        };
        self.tx_bytes_queued += item.len();
        self.tx.push_back(item);
    }

    /// Drops everything queued (the connection is gone) and returns the
    /// MEPs whose fragments were among it, so their sends can be completed.
    pub fn abort_tx(&mut self) -> Vec<MepId> {
        self.tx_offset = 0;
        self.tx_bytes_queued = 0;
        self.tx
            .drain(..)
            .filter_map(|item| match item {
                TxItem::Fragment { mep, .. } => Some(mep),
                TxItem::Control(_) => None,
            })
            .collect()
    }

    pub fn has_pending_tx(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Writes as much as the socket takes. Returns the MEPs whose fragments
    /// were fully written (their send is complete).
    pub fn flush(&mut self, completed: &mut Vec<MepId>) -> io::Result<()> {
        while !self.tx.is_empty() {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(16);
            let mut skip = self.tx_offset;
            for item in self.tx.iter().take(8) {
                let parts: [&[u8]; 2] = match item {
                    TxItem::Control(b) => [b.as_slice(), &[]],
                    TxItem::Fragment { head, data, .. } => [head.as_slice(), &data[..]],
                };
                for part in parts {
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    slices.push(IoSlice::new(&part[skip..]));
                    skip = 0;
                }
            }
            let written = match self.stream.write_vectored(&slices) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "peer stopped reading",
                    ))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.tx_bytes_queued -= written;
            self.last_tx_progress = std::time::Instant::now();
            let mut left = self.tx_offset + written;
            while let Some(front) = self.tx.front() {
                let len = front.len();
                if left < len {
                    break;
                }
                left -= len;
                if let Some(TxItem::Fragment { mep, .. }) = self.tx.pop_front() {
                    completed.push(mep);
                }
            }
            self.tx_offset = left;
        }
        Ok(())
    }

    /// Reads everything available, handing complete messages to `handler`.
    /// Reads at most `max_steps` times (so that one busy connection, or a
    /// slow handler, cannot keep the node from its timers and heartbeats);
    /// `MoreToRead` when it stopped with data maybe left.
    pub fn read_ready(
        &mut self,
        handler: &mut dyn RxHandler,
        max_steps: usize,
    ) -> Result<RxStatus, String> {
        self.last_rx = std::time::Instant::now();
        if let Some(p) = self.peer {
            handler.on_alive(p);
        }
        let mut steps = 0;
        loop {
            if steps == max_steps {
                return Ok(RxStatus::MoreToRead);
            }
            steps += 1;
            match self.read_step(handler) {
                Ok(true) => continue,
                Ok(false) => return Ok(RxStatus::Open),
                Err(StepError::Closed) => return Ok(RxStatus::Closed),
                Err(StepError::Fatal(e)) => return Err(e),
            }
        }
    }

    /// One read; `Ok(false)` when the socket has nothing more now.
    fn read_step(&mut self, handler: &mut dyn RxHandler) -> Result<bool, StepError> {
        let max_body = self.max_body;
        match &mut self.rx {
            Rx::Frame { buf, got } => {
                let n = read_some(&mut self.stream, &mut buf[*got..], *got == 0)?;
                let Some(n) = n else { return Ok(false) };
                *got += n;
                if *got < FRAME_HEADER_LEN {
                    return Ok(true);
                }
                let frame = FrameHeader::decode(buf, max_body).map_err(wire_err)?;
                if matches!(frame.kind, Kind::Heartbeat | Kind::Goodbye) {
                    if frame.kind == Kind::Goodbye {
                        self.goodbye_seen = true;
                    }
                    self.rx = Rx::Frame {
                        buf: [0; FRAME_HEADER_LEN],
                        got: 0,
                    };
                    return Ok(true);
                }
                self.rx = Rx::Body {
                    frame,
                    buf: [0; 32],
                    got: 0,
                };
                Ok(true)
            }
            Rx::Body { frame, buf, got } => {
                let need = match frame.kind {
                    Kind::Fragment => FRAGMENT_HEADER_LEN,
                    _ => frame.body_len as usize,
                };
                let n = read_some(&mut self.stream, &mut buf[*got..need], false)?;
                let Some(n) = n else { return Ok(false) };
                *got += n;
                if *got < need {
                    return Ok(true);
                }
                let msg = Message::decode_body(frame, &buf[..need]).map_err(wire_err)?;
                let frame = *frame;
                match msg {
                    Message::Fragment(header) => self.start_payload(handler, header)?,
                    Message::Hello {
                        node, host, pid, ..
                    } if self.peer.is_none() => {
                        // Identifies the peer of an accepted connection.
                        self.peer = Some(node);
                        self.peer_process = PeerProcess { host, pid };
                        self.hello_seen = true;
                        self.reset_rx();
                    }
                    Message::Hello { host, pid, .. } => {
                        // The answer to our Hello: the peer is set up.
                        self.peer_process = PeerProcess { host, pid };
                        self.hello_seen = true;
                        self.reset_rx();
                    }
                    _ => {
                        let _ = frame;
                        let Some(peer) = self.peer else {
                            return Err(StepError::Fatal(format!(
                                "{} before Hello",
                                msg.kind().name()
                            )));
                        };
                        handler.on_control(peer, msg);
                        self.reset_rx();
                    }
                }
                Ok(true)
            }
            Rx::Payload {
                header,
                dest,
                got,
                crc,
            } => {
                let total = header.payload_len as usize;
                let n = read_payload_piece(
                    &mut self.stream,
                    &mut self.discard,
                    dest,
                    crc,
                    *got,
                    total,
                )?;
                let Some(n) = n else { return Ok(false) };
                *got += n;
                if *got == total {
                    self.finish_payload(handler)?;
                }
                Ok(true)
            }
        }
    }

    /// A fragment header arrived: its payload comes next, read into a
    /// buffer from the handler when it keeps the fragment (else discarded).
    fn start_payload(
        &mut self,
        handler: &mut dyn RxHandler,
        header: FragmentHeader,
    ) -> Result<(), StepError> {
        let Some(peer) = self.peer else {
            return Err(StepError::Fatal("fragment before Hello".into()));
        };
        // Pooled buffers stay initialised between uses, so
        // only a buffer that is too small is touched here.
        let total = header.payload_len as usize;
        let dest = handler
            .admit(peer, &header)
            .then(|| handler.spare_buffer(total));
        let crc = (dest.is_some() && handler.wants_crc(&header)).then_some(0);
        self.rx = Rx::Payload {
            header,
            dest,
            got: 0,
            crc,
        };
        if header.payload_len == 0 {
            self.finish_payload(handler)?;
        }
        Ok(())
    }

    fn finish_payload(&mut self, handler: &mut dyn RxHandler) -> Result<(), StepError> {
        let rx = std::mem::replace(
            &mut self.rx,
            Rx::Frame {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
        );
        if let Rx::Payload {
            header,
            dest: Some(payload),
            crc,
            ..
        } = rx
        {
            let peer = self.peer.expect("checked at the fragment header");
            handler.on_fragment(peer, header, crc, payload, 0);
        }
        Ok(())
    }

    fn reset_rx(&mut self) {
        self.rx = Rx::Frame {
            buf: [0; FRAME_HEADER_LEN],
            got: 0,
        };
    }
}

enum StepError {
    Closed,
    Fatal(String),
}

impl From<io::Error> for StepError {
    fn from(e: io::Error) -> Self {
        StepError::Fatal(e.to_string())
    }
}

fn wire_err(e: WireError) -> StepError {
    StepError::Fatal(format!("protocol error: {e}"))
}

/// Reads the next piece of a fragment's payload (`got` of its `total`
/// bytes are in): straight into the buffer the batch keeps (`dest`, and
/// the running CRC when one is wanted), or into `discard` for a fragment
/// the handler did not keep. `Ok(None)` when it would block.
fn read_payload_piece(
    stream: &mut TcpStream,
    discard: &mut Vec<u8>,
    dest: &mut Option<Vec<u8>>,
    crc: &mut Option<u32>,
    got: usize,
    total: usize,
) -> Result<Option<usize>, StepError> {
    Ok(match dest {
        Some(v) => {
            let n = read_some(stream, &mut v[got..total], false)?;
            if let (Some(n), Some(crc)) = (n, crc.as_mut()) {
                *crc = evb_core::checksum::crc32c_append(*crc, &v[got..got + n]);
            }
            n
        }
        None => {
            let want = (total - got).min(256 * 1024);
            if discard.len() < want {
                discard.resize(want, 0);
            }
            read_some(stream, &mut discard[..want], false)?
        }
    })
}

/// One read. `Ok(None)` when it would block; EOF is `Closed` at a message
/// boundary and an error in the middle of one.
fn read_some(
    stream: &mut TcpStream,
    buf: &mut [u8],
    at_boundary: bool,
) -> Result<Option<usize>, StepError> {
    loop {
        match stream.read(buf) {
            Ok(0) if at_boundary => return Err(StepError::Closed),
            Ok(0) => {
                return Err(StepError::Fatal(
                    "connection closed in the middle of a message".into(),
                ))
            }
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
