//! The state machine alone: two or three `Links` pass their control
//! messages to each other as the engines would (through the wire tag and
//! `parse_control`), with no library underneath.

use super::*;
use crate::wire::{epoch_of, parse_control, seq_of, wire_tag, Control};
use proptest::prelude::*;

const MASK: u64 = 0xff;

/// An endpoint's `Links` with rejoin enabled and its peers added.
fn links(own: u64, peers: &[&[u8]]) -> Links {
    let mut l = Links::new("test", MASK);
    l.enable_rejoin(own);
    for (i, a) in peers.iter().enumerate() {
        l.peer_added(i, a);
    }
    l
}

/// Adds the next peer at `address`; returns its index.
fn add(l: &mut Links, address: &[u8]) -> PeerId {
    let p = l.num_peers();
    l.peer_added(p, address);
    p
}

fn data(buf: u8, tag: u64) -> Completion {
    Completion::Received {
        buf: vec![buf],
        len: 1,
        tag,
    }
}

/// What `out` holds, as (first byte, tag) of each message and (peer,
/// source) of each join.
fn seen(out: &[Completion]) -> Vec<(char, u64, u64)> {
    out.iter()
        .map(|c| match c {
            Completion::Received { buf, tag, .. } => ('m', u64::from(buf[0]), *tag),
            Completion::PeerJoined { peer, source } => ('j', *peer as u64, *source),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// A data message with wire tag `wire` arrives at `l` (carrying `byte`):
/// handed to its stream unless stale.
fn deliver(l: &mut Links, wire: u64, byte: u8, out: &mut Vec<Completion>) -> Arrival {
    let a = l.arrival(wire);
    if let Arrival::Data { tag, source, seq } = a {
        l.finished(source, seq, Some(data(byte, tag)), out);
    }
    a
}

/// A control message arrives at `l`, whose engine opens peers at the
/// addresses JOINs carry: the answer to send back, if any.
fn deliver_control(
    l: &mut Links,
    msg: &ControlMessage,
    out: &mut Vec<Completion>,
) -> Option<Accepted> {
    let Arrival::Control { source, seq, .. } = l.arrival(msg.wire_tag) else {
        panic!("a control message taken for data or stale");
    };
    match parse_control(&msg.bytes) {
        Control::Join {
            joiner,
            their_index,
            address,
            reply_epoch,
        } => {
            let peer = add(l, address);
            let accepted = l.accept_join(joiner, their_index, peer, reply_epoch, out);
            l.debug_check();
            Some(accepted)
        }
        Control::Ack { epoch, index } => {
            assert!(l.accept_ack(source, seq, epoch, index as PeerId, out));
            l.debug_check();
            None
        }
        Control::Unknown => panic!("not understood"),
    }
}

#[test]
fn sends_carry_the_peer_epoch_and_one_sequence_per_destination_and_sender() {
    let mut l = Links::new("test", MASK);
    l.peer_added(0, b"a");
    l.peer_added(1, b"b");
    let w = l.wire_tag(0, 0x107);
    assert_eq!((epoch_of(w), seq_of(w), w & TAG_MASK), (0, 0, 0x107));
    l.sent(0, 0x107);
    assert_eq!(
        seq_of(l.wire_tag(0, 0x207)),
        1,
        "same sender bits: same stream"
    );
    assert_eq!(seq_of(l.wire_tag(0, 0x106)), 0, "other sender bits");
    assert_eq!(seq_of(l.wire_tag(1, 0x107)), 0, "other destination");
    // A message the library refused (no `sent`) takes no place.
    assert_eq!(seq_of(l.wire_tag(0, 0x107)), 1);
}

#[test]
#[should_panic(expected = "index order")]
fn peers_are_added_in_index_order() {
    let mut l = Links::new("test", MASK);
    l.peer_added(1, b"a");
}

#[test]
fn joining_needs_rejoin_enabled() {
    let l = Links::new("test", MASK);
    let e = l.require_rejoin("add_peer_rejoining").unwrap_err();
    assert_eq!(
        e.to_string(),
        "add_peer_rejoining needs enable_rejoin first"
    );
    assert!(l.relink_wanted(0, 1).is_none(), "no relink without rejoin");
}

/// A sender restarts: its new epoch replaces the old one at the live
/// endpoint, what the old incarnation left held back is handed back to
/// recycle, its late messages are dropped, and the new incarnation's
/// messages are handed out from sequence 0 once it has the answer.
#[test]
fn a_rejoin_replaces_the_old_incarnation() {
    const LIVE: u64 = 1;
    const SENDER: u64 = 2;
    let mut live = links(LIVE, &[b"sender-old"]);
    let mut out = Vec::new();
    // The old incarnation's messages 0 and 2 arrive; 2 waits for 1.
    for seq in [0, 2] {
        let w = wire_tag(0, seq, SENDER);
        assert!(matches!(
            deliver(&mut live, w, seq as u8, &mut out),
            Arrival::Data { .. }
        ));
    }
    assert_eq!(seen(&out), [('m', 0, SENDER)]);
    assert_eq!(live.held(), 1);

    // The new incarnation asks to be taken back.
    let mut new = links(SENDER, &[]);
    let to_live = add(&mut new, b"live");
    let join = new.join_request(to_live, b"sender-new");
    assert_eq!(
        join.wire_tag,
        CTRL_BIT | SENDER,
        "a JOIN has no epoch nor sequence"
    );
    out.clear();
    let accepted = deliver_control(&mut live, &join, &mut out).expect("answered");
    let new_at_live = accepted.answer.peer;
    assert_eq!(new_at_live, 1, "a new peer index for the new address");
    assert_eq!(seen(&out), [('j', 1, SENDER)], "PeerJoined at once");
    assert_eq!(accepted.restart.epoch, 1);
    assert_eq!(live.current_epoch(SENDER), 1);
    assert_eq!(
        accepted.restart.recycle.len(),
        1,
        "message 2 comes back to recycle"
    );
    assert_eq!(seen(&accepted.restart.recycle), [('m', 2, SENDER)]);
    assert_eq!(live.held(), 0);
    assert_eq!(live.stale_dropped(), 1);
    assert_eq!(accepted.superseded, None);
    // The ACK opens live's stream to the new incarnation, with no epoch
    // asked for (a JOIN, not a RELINK).
    let ack = &accepted.answer;
    assert_ne!(ack.wire_tag & CTRL_BIT, 0);
    assert_eq!((epoch_of(ack.wire_tag), seq_of(ack.wire_tag)), (0, 0));
    assert_eq!(ack.wire_tag & TAG_MASK, LIVE);

    // The old incarnation's message 1, late, is dropped: its epoch is gone.
    out.clear();
    assert_eq!(
        deliver(&mut live, wire_tag(0, 1, SENDER), 1, &mut out),
        Arrival::Stale
    );
    assert_eq!(live.stale_dropped(), 2);
    assert!(out.is_empty());

    // The new incarnation gets the answer: joined, and it stamps epoch 1.
    assert!(deliver_control(&mut new, ack, &mut out).is_none());
    assert_eq!(seen(&out), [('j', to_live as u64, LIVE)]);
    let w = new.wire_tag(to_live, SENDER);
    assert_eq!((epoch_of(w), seq_of(w)), (1, 0));
    new.sent(to_live, SENDER);
    let w1 = new.wire_tag(to_live, SENDER);
    out.clear();
    // Its messages finish out of order and are handed out in order.
    deliver(&mut live, w1, 11, &mut out);
    deliver(&mut live, w, 10, &mut out);
    assert_eq!(seen(&out), [('m', 10, SENDER), ('m', 11, SENDER)]);
    // The old link, given up now, leaves the new stream be.
    assert!(matches!(
        live.forget_peer(0, SENDER),
        Forget::Replaced { old_epoch: 0 }
    ));
    match live.forget_peer(new_at_live, SENDER) {
        Forget::Forgotten { held, epoch } => assert!(held.is_empty() && epoch == 1),
        other => panic!("{other:?}"),
    }
    live.debug_check();
}

/// An ACK for a request this endpoint did not make is dropped, and its
/// place in the sender's stream is taken (what follows is not held).
#[test]
fn an_answer_nobody_asked_for_is_dropped_in_its_place() {
    let mut l = links(1, &[b"peer"]);
    let mut out = Vec::new();
    let ack = wire::ack_message(3, 0);
    let w = CTRL_BIT | wire_tag(0, 0, 2);
    let Arrival::Control { source, seq, .. } = l.arrival(w) else {
        panic!("control");
    };
    let Control::Ack { epoch, index } = parse_control(&ack) else {
        panic!("ack");
    };
    assert!(!l.accept_ack(source, seq, epoch, index as PeerId, &mut out));
    assert!(out.is_empty());
    deliver(&mut l, wire_tag(0, 1, 2), 7, &mut out);
    assert_eq!(seen(&out), [('m', 7, 2)]);
    assert_eq!(
        seq_of(l.wire_tag(0, 1)),
        0,
        "our epoch for the peer unchanged"
    );
    assert_eq!(epoch_of(l.wire_tag(0, 1)), 0);
}

/// Between two live endpoints the higher source asks for the link again;
/// both directions move to new epochs, and what the old link still
/// delivers is dropped on both sides.
#[test]
fn a_relink_moves_both_directions_to_a_new_epoch() {
    const LOW: u64 = 3;
    const HIGH: u64 = 5;
    let mut low = links(LOW, &[b"high"]);
    let mut high = links(HIGH, &[b"low"]);
    let mut out = Vec::new();
    assert!(low.relink_wanted(0, HIGH).is_none(), "the lower waits");
    let due = high.relink_wanted(0, LOW).expect("the higher asks");
    assert_eq!((due.source, &due.address[..]), (LOW, &b"low"[..]));
    assert_eq!(due.attempt, RelinkAttempt::FIRST);
    let high_to_low = add(&mut high, &due.address);
    let (restart, request) = high.relink_opened(&due, high_to_low, b"high");
    high.debug_check();
    assert_eq!((restart.source, restart.epoch), (LOW, 1));
    assert!(high.relinks_pending());
    assert!(
        high.relink_wanted(0, LOW).is_none(),
        "one request at a time"
    );
    // The old link's message from low is dropped at high from now on.
    assert_eq!(
        deliver(&mut high, wire_tag(0, 0, LOW), 0, &mut out),
        Arrival::Stale
    );

    // Low answers the RELINK as a JOIN, and stamps the asker's epoch.
    let accepted = deliver_control(&mut low, &request, &mut out).expect("answered");
    let low_to_high = accepted.answer.peer;
    assert_eq!(seen(&out), [('j', low_to_high as u64, HIGH)]);
    assert_eq!(
        epoch_of(accepted.answer.wire_tag),
        1,
        "the ACK carries high's epoch"
    );
    assert_eq!(low.current_epoch(HIGH), 1);
    let w = low.wire_tag(low_to_high, LOW);
    assert_eq!(
        (epoch_of(w), seq_of(w)),
        (1, 1),
        "after the ACK, in high's epoch"
    );
    low.sent(low_to_high, LOW);
    // High's messages on the old link (epoch 0) are dropped at low.
    assert_eq!(
        deliver(&mut low, wire_tag(0, 5, HIGH), 0, &mut out),
        Arrival::Stale
    );

    // High gets the ACK: linked again under the new peer index.
    out.clear();
    assert!(deliver_control(&mut high, &accepted.answer, &mut out).is_none());
    assert_eq!(seen(&out), [('j', high_to_low as u64, LOW)]);
    assert!(!high.relinks_pending());
    let hw = high.wire_tag(high_to_low, HIGH);
    assert_eq!(
        (epoch_of(hw), seq_of(hw)),
        (1, 0),
        "low's new epoch for high"
    );
    out.clear();
    deliver(&mut high, w, 42, &mut out);
    assert_eq!(seen(&out), [('m', 42, LOW)]);
    out.clear();
    deliver(&mut low, hw, 43, &mut out);
    assert_eq!(seen(&out), [('m', 43, HIGH)]);
    low.debug_check();
    high.debug_check();
}

/// A RELINK whose endpoint fails is made again from a new one after a
/// doubling backoff, and given up after RELINK_ATTEMPTS failures.
#[test]
fn a_failing_relink_backs_off_and_is_given_up() {
    let mut high = links(5, &[b"low"]);
    let t0 = Instant::now();
    let mut due = high.relink_wanted(0, 3).unwrap();
    let mut now = t0;
    let mut backoffs = Vec::new();
    loop {
        let peer = add(&mut high, &due.address);
        let (_restart, request) = high.relink_opened(&due, peer, b"high");
        assert_eq!(request.peer, peer);
        high.debug_check();
        assert!(
            high.relinks_due(&[], now + Duration::from_secs(60))
                .is_empty(),
            "not failed: waits for the answer"
        );
        // The new endpoint fails: due again after the backoff, not before.
        assert!(high.relinks_due(&[peer], now).is_empty());
        let wait = due.attempt.backoff;
        assert!(high
            .relinks_due(&[], now + wait - Duration::from_millis(1))
            .is_empty());
        now += wait;
        let again = high.relinks_due(&[], now);
        if again.is_empty() {
            break;
        }
        assert_eq!(again.len(), 1);
        due = again.into_iter().next().unwrap();
        backoffs.push((due.attempt.backoff.as_millis(), due.attempt.failures));
    }
    assert!(!high.relinks_pending(), "given up");
    let expected: Vec<(u128, u32)> = (1..RELINK_ATTEMPTS)
        .map(|f| (if f == 1 { 500 } else { 1000 }, f))
        .collect();
    assert_eq!(backoffs, expected);
    assert_eq!(
        high.current_epoch(3),
        RELINK_ATTEMPTS as u8,
        "each request a new epoch"
    );
}

/// A peer that cannot be reached at all is asked again for as long as it
/// takes: no failures are counted.
#[test]
fn an_unreachable_peer_is_asked_again_and_again() {
    let mut high = links(5, &[b"low"]);
    let mut due = high.relink_wanted(0, 3).unwrap();
    let mut now = Instant::now();
    for _ in 0..3 * RELINK_ATTEMPTS {
        high.relink_not_sent(due.clone(), &"no route", now);
        high.debug_check();
        assert!(high.relink_wanted(0, 3).is_none(), "one request at a time");
        now += RELINK_BACKOFF_MAX;
        let again = high.relinks_due(&[], now);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempt.failures, 0);
        assert!(again[0].attempt.backoff <= RELINK_BACKOFF_MAX);
        due = again.into_iter().next().unwrap();
    }
    assert_eq!(
        high.current_epoch(3),
        0,
        "no stream restarted without a request out"
    );
}

/// A JOIN from a source whose link this endpoint was asking for again (it
/// restarted meanwhile) supersedes the request: the peer the request went
/// to is named, for an engine that queued messages to it.
#[test]
fn a_join_supersedes_a_pending_relink() {
    let mut high = links(5, &[b"low"]);
    let due = high.relink_wanted(0, 3).unwrap();
    let asked = add(&mut high, &due.address);
    let _ = high.relink_opened(&due, asked, b"high");
    let mut restarted_low = links(3, &[]);
    let to_high = add(&mut restarted_low, b"high");
    let join = restarted_low.join_request(to_high, b"low-new");
    let mut out = Vec::new();
    let accepted = deliver_control(&mut high, &join, &mut out).unwrap();
    assert_eq!(accepted.superseded, Some(asked));
    assert!(!high.relinks_pending());
    assert_eq!(
        high.current_epoch(3),
        2,
        "one epoch for the relink, one for the join"
    );
}

/// What an old incarnation left held back comes back, buffers and all, to
/// be posted again, and is counted as stale; its sender is no longer
/// taken for alive on its account.
#[test]
fn held_back_completions_are_recycled_and_counted_on_restart() {
    let mut live = links(1, &[b"a"]);
    let mut out = Vec::new();
    for seq in 1..4 {
        deliver(&mut live, wire_tag(0, seq, 2), seq as u8, &mut out);
    }
    assert!(out.is_empty());
    assert!(live.waiting(2));
    let peer = add(&mut live, b"a2");
    let accepted = live.accept_join(2, 0, peer, None, &mut out);
    assert_eq!(accepted.restart.recycle.len(), 3);
    assert!(accepted
        .restart
        .recycle
        .into_iter()
        .all(|c| c.into_buffer().is_some()));
    assert_eq!(live.stale_dropped(), 3);
    assert!(!live.waiting(2));
}

proptest! {
    /// Whatever the order in which an old incarnation's and a new one's
    /// messages arrive around the join, only the new incarnation's are
    /// handed out after it, all of them, in order; everything of the old
    /// one after the join is dropped or recycled, and counted.
    #[test]
    fn a_join_separates_the_incarnations_whatever_the_order(
        old_count in 1u32..20,
        new_count in 1u32..20,
        before_join in proptest::collection::vec(any::<bool>(), 20),
        order in Just((0u32..40).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        let mut live = links(1, &[b"old"]);
        let mut out = Vec::new();
        // Some of the old incarnation's messages arrive before the join,
        // in sequence order or not (a hole holds the rest back).
        let early: Vec<u32> = (0..old_count).filter(|&s| before_join[s as usize]).collect();
        for &s in &early {
            deliver(&mut live, wire_tag(0, s, 2), 0, &mut out);
        }
        let handed_before = out.len();
        let held_at_join = live.held();
        prop_assert_eq!(handed_before + held_at_join, early.len());
        let peer = add(&mut live, b"new");
        let accepted = live.accept_join(2, 0, peer, None, &mut out);
        prop_assert_eq!(accepted.restart.recycle.len(), held_at_join);
        out.clear();
        // The rest of the old and all of the new arrive, mixed.
        let late: Vec<u32> = (0..old_count).filter(|&s| !before_join[s as usize]).collect();
        let mut arrivals: Vec<(u8, u32)> = late.iter().map(|&s| (0, s)).collect();
        arrivals.extend((0..new_count).map(|s| (1, s)));
        // (At most 38 arrivals: the shuffled 0..40 covers them all.)
        let mixed: Vec<(u8, u32)> = order.iter().filter_map(|&i| arrivals.get(i as usize).copied()).collect();
        for (epoch, s) in mixed {
            deliver(&mut live, wire_tag(epoch, s, 2), (s as u8) | (epoch << 7), &mut out);
        }
        let expected: Vec<(char, u64, u64)> = (0..new_count).map(|s| ('m', u64::from(s as u8 | 0x80), 2)).collect();
        prop_assert_eq!(seen(&out), expected);
        prop_assert_eq!(live.stale_dropped(), (held_at_join + late.len()) as u64);
        prop_assert_eq!(live.held(), 0);
    }
}
