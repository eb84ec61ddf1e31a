// SPDX-License-Identifier: Apache-2.0
// Weight source for CPU adapters (lavapipe): the same raw bytes, uploaded unchanged into an
// rgba32uint texture 8192 texels (128 KiB) wide, so word i sits in texel t = i / 4 at
// (t % 8192, t / 8192), component i % 4, bound as a read-only storage texture (core WebGPU).
// On Mesa 22.3 llvmpipe an image load is a vector gather for 8 lanes, while every storage-buffer
// load is a per-lane loop with two branches (matmuls read their weights ~2.5-3.5x faster this
// way); a sampled texture's texel fetch costs more than the image load, since it looks up each
// lane's mip level (the matmul at m = 1 ran 1.5x faster reading the same texture as an image).
// Upload: queue.write_texture (bytes_per_row = 131072) or copy_buffer_to_texture from the mmap'd
// file bytes; pad the last texel row with zeros. Height = ceil(bytes / 131072) <= 8192 (1 GiB).
// Rows are interleaved in groups of W_INTERLEAVE (`GpuTensorFactory` permutes them on upload):
// a group holds unit 0 of each of its rows, one after another, then unit 1, and so on, a unit
// being one block of the format (one super-block for the k-quants; W_UNIT_BYTES); a last group
// of fewer rows is padded with zero rows. A matmul's lanes own consecutive rows, so at each step
// of k they read adjacent bytes and the CPU's prefetchers keep up; in row-major order one
// workgroup streamed 128 rows at once, which they do not follow (weights not in cache: 1.6x
// slower at m = 1). 16 rows: two tile columns of 8 lanes, or one of 16, read one stream; a
// decode step ran 10% faster than with groups of 8, and no faster with 32 or 64.
@group(0) @binding(2) var wt: texture_storage_2d<rgba32uint, read>;

const W_INTERLEAVE: u32 = 16u;

// Byte of unit 0 of `row` (counted from the part's first row, a whole group).
fn w_row_byte(row: u32, row_bytes: u32) -> u32 {
    return (row / W_INTERLEAVE) * W_INTERLEAVE * row_bytes + (row % W_INTERLEAVE) * W_UNIT_BYTES;
}

// Byte of unit u of the row whose unit 0 is at row_byte.
fn w_unit_byte(row_byte: u32, u: u32) -> u32 {
    return row_byte + u * (W_UNIT_BYTES * W_INTERLEAVE);
}

fn wtexel(t: u32) -> vec4<u32> {
    return textureLoad(wt, vec2<u32>(t & 8191u, t >> 13u));
}

fn wload(i: u32) -> u32 {
    let v = wtexel(i >> 2u);
    return select(select(v.x, v.y, (i & 3u) == 1u), select(v.z, v.w, (i & 3u) == 3u), (i & 3u) >= 2u);
}

fn wload4a(i: u32) -> vec4<u32> {
    return wtexel(i >> 2u);
}

// Word o + j of a window p0 p1 p2 p3 for o = i % 4 in 0..3: three selects, no dynamic indexing.
fn wpick(o: u32, p0: u32, p1: u32, p2: u32, p3: u32) -> u32 {
    return select(select(p0, p1, o == 1u), select(p2, p3, o == 3u), o >= 2u);
}

fn wspan5(i: u32) -> array<u32, 5> {
    let o = i & 3u;
    let a = wtexel(i >> 2u);
    let b = wtexel((i >> 2u) + 1u);
    return array<u32, 5>(
        wpick(o, a.x, a.y, a.z, a.w),
        wpick(o, a.y, a.z, a.w, b.x),
        wpick(o, a.z, a.w, b.x, b.y),
        wpick(o, a.w, b.x, b.y, b.z),
        wpick(o, b.x, b.y, b.z, b.w));
}

fn wspan9(i: u32) -> array<u32, 9> {
    let o = i & 3u;
    let a = wtexel(i >> 2u);
    let b = wtexel((i >> 2u) + 1u);
    let c = wtexel((i >> 2u) + 2u);
    return array<u32, 9>(
        wpick(o, a.x, a.y, a.z, a.w),
        wpick(o, a.y, a.z, a.w, b.x),
        wpick(o, a.z, a.w, b.x, b.y),
        wpick(o, a.w, b.x, b.y, b.z),
        wpick(o, b.x, b.y, b.z, b.w),
        wpick(o, b.y, b.z, b.w, c.x),
        wpick(o, b.z, b.w, c.x, c.y),
        wpick(o, b.w, c.x, c.y, c.z),
        wpick(o, c.x, c.y, c.z, c.w));
}
