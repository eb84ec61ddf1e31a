// SPDX-License-Identifier: Apache-2.0
// The parameters every pass of the chunked (SSD) scan takes; mirrors gpu::kernels::ssm::SsdParams.
struct Params {
    heads: u32,
    head_dim: u32,
    state_size: u32,
    groups: u32,
    // Rows per chunk (Q).
    q: u32,
    num_chunks: u32,
    dt_stride: u32,
    dt_offset: u32,
}

// Columns of the runs table (as ssm_scan's seqs table), and its "no slot" entry.
const SEQ_COLS: u32 = 6u;
const NO_SLOT: u32 = 0xffffffffu;
