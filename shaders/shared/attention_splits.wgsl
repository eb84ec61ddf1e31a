// SPDX-License-Identifier: Apache-2.0
// How split-K attention shares one query token's context among workgroups, for
// flash_attention (which computes the splits) and attention_merge (which joins them); the
// CPU family's paged_attention, which never splits, takes the window and NEG_MAX from here. A
// token whose last position seen is pos attends to positions first ..= pos; with split_min > 0
// and more than split_min of them, up to SPLITS workgroups take consecutive spans of at least
// split_min positions (a multiple of 8) each. The layout depends only on the token's own
// range, never on its batch, so split results stay batch invariant.

const SPLITS: u32 = 8u;
// -f32::MAX written exactly: browsers reject a longer decimal (like 3.4028235e38) that lies above it.
const NEG_MAX: f32 = -3.4028234663852886e38;

// The first position a token at `pos` sees (window 0: no sliding window).
fn first_position(pos: u32, window: u32) -> u32 {
    if (window > 0u && pos + 1u > window) {
        return pos + 1u - window;
    }
    return 0u;
}

// (positions per split, number of splits) for n positions; split_min 0 keeps one split.
fn split_layout(n: u32, split_min: u32) -> vec2<u32> {
    if (split_min == 0u || n <= split_min) {
        return vec2<u32>(n, 1u);
    }
    let span = max(split_min, ((n + SPLITS - 1u) / SPLITS + 7u) / 8u * 8u);
    return vec2<u32>(span, (n + span - 1u) / span);
}
