//! How many waterfalls an instance may run at once, at most: the routing
//! width's upper bound, from the buyers' slots.

use crate::config::BuyerSettings;

/// Waterfalls one instance runs at once, at least and at most (each walk
/// holds its lead in memory).
const FEWEST_WATERFALLS: usize = 256;
const MOST_WATERFALLS: usize = 4096;

/// Waterfalls an instance may run at once: twice its enabled buyers'
/// slots, within `FEWEST_WATERFALLS..=MOST_WATERFALLS`. A walk is in one
/// call at a time, and between calls it waits for its own writes: with
/// fewer walks than the buyers' slots, the walks, not the slots, bound the
/// routed rate, the more so the more buyers a lead is walked through (the
/// routing bench's three 64-slot buyers answering in 20 ms were held to
/// 0.74x what their slots allow by 256 walks).
pub fn widest<'a>(buyers: impl IntoIterator<Item = &'a BuyerSettings>) -> usize {
    let slots: usize = buyers
        .into_iter()
        .filter(|buyer| buyer.enabled)
        .map(|buyer| buyer.max_concurrency as usize)
        .sum();
    slots
        .saturating_mul(2)
        .clamp(FEWEST_WATERFALLS, MOST_WATERFALLS)
}
