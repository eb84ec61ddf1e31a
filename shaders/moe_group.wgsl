// SPDX-License-Identifier: Apache-2.0
// moe_group: a counting sort of a mixture-of-experts layer's (token, slot) rows by expert, on the
// GPU after moe_route, so moe_matmul_grouped decodes each expert's weights once for up to R =
// params.tile_rows of its rows and no index goes through the host. It writes a tile table:
// tile i (in expert order) holds up to R rows of one expert, every tile of an expert full but
// its last.
//
// Bindings (group 0)
//   0 params  uniform     Params                     mirrors gpu::kernels::moe::GroupParams
//   1 ids     read        u32 (rows)                 each (token, slot) row's expert
//   2 tiles   read_write  u32 (1 + max tiles, 2 + R)  row 0: word 0 the number of tiles;
//                                                    row 1 + i: tile i's expert, its row
//                                                    count c (1..R), then its c rows
// Workgroup: one of 256 invocations: count each expert's rows (workgroup atomics), then
//   invocation 0 gives each expert its first tile (a serial loop over the experts, at most
//   MAX_EXPERTS: cheaper on CPU drivers than a scan's barriers), then every invocation places
//   rows r = lid, lid + 256, ...: rank p among its expert's rows (an atomic counter), slot
//   p % R of the expert's tile p / R; the rank-0 row of each tile writes its expert and count.
// Grid: (1, 1, 1).
// A row whose id is not below params.experts is left out of every tile.
// Which slot a row lands in depends on the order the atomics ran in; nothing reads that order:
//   moe_matmul_grouped sums each row alone, whatever rows share its tile.

struct Params {
    rows: u32,
    experts: u32,
    tile_rows: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> tiles: array<u32>;

const WG: u32 = 256u;
// Mirrors gpu::kernels::moe::MAX_EXPERTS (12 KiB of workgroup memory for the three tables).
const MAX_EXPERTS: u32 = 1024u;

var<workgroup> counts: array<atomic<u32>, MAX_EXPERTS>;  // rows of each expert
var<workgroup> placed: array<atomic<u32>, MAX_EXPERTS>;  // rows of each expert placed so far
var<workgroup> first_tile: array<u32, MAX_EXPERTS>;      // each expert's first tile

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    let r_tile = params.tile_rows;
    let words = 2u + r_tile;
    for (var e = lid; e < params.experts; e += WG) {
        atomicStore(&counts[e], 0u);
        atomicStore(&placed[e], 0u);
    }
    workgroupBarrier();
    for (var r = lid; r < params.rows; r += WG) {
        let e = ids[r];
        if (e < params.experts) {
            atomicAdd(&counts[e], 1u);
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        var t = 0u;
        for (var e = 0u; e < params.experts; e++) {
            first_tile[e] = t;
            t += (atomicLoad(&counts[e]) + r_tile - 1u) / r_tile;
        }
        tiles[0] = t;
    }
    workgroupBarrier();
    for (var r = lid; r < params.rows; r += WG) {
        let e = ids[r];
        if (e < params.experts) {
            let p = atomicAdd(&placed[e], 1u);
            let at = (1u + first_tile[e] + p / r_tile) * words;
            let slot = p % r_tile;
            if (slot == 0u) {
                tiles[at] = e;
                tiles[at + 1u] = min(r_tile, atomicLoad(&counts[e]) - p);
            }
            tiles[at + 2u + slot] = r;
        }
    }
}
