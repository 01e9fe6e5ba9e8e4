//! The message engines' relink tests (evb-ucx, evb-ofi): what the two ends
//! of a re-established link reported.

/// The new link's peer ids at `low` and at `high` (`ends`; `old`: the old
/// link's ids there), from the joins the ends reported as (endpoint, new
/// peer id, the source that peer names): exactly one join at each end, new
/// ids, each naming the other end.
pub fn new_link(
    joins: &[(usize, usize, u64)],
    (low, high): (usize, usize),
    old: (usize, usize),
) -> (usize, usize) {
    let new_peer = |at: usize| {
        let j: Vec<_> = joins.iter().filter(|j| j.0 == at).collect();
        assert_eq!(j.len(), 1, "one join at {at}: {joins:?}");
        j[0].1
    };
    let (low_to_high, high_to_low) = (new_peer(low), new_peer(high));
    assert_ne!(low_to_high, old.0);
    assert_ne!(high_to_low, old.1);
    assert!(
        joins.contains(&(low, low_to_high, high as u64)),
        "{joins:?}"
    );
    assert!(
        joins.contains(&(high, high_to_low, low as u64)),
        "{joins:?}"
    );
    (low_to_high, high_to_low)
}
