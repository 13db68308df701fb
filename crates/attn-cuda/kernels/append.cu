// Appends new rows (keys or values) to a KV cache in device memory: FlashAttention's
// `flash_attn_with_kvcache` writing k_new / v_new after each sequence's keys before it attends.
// attn_core::append_rows defines where each row lands (its host copy and this kernel agree bit
// for bit: tests/resident.rs); the host side is crates/attn-cuda/src/append.rs.
//
// Sequence b's new row t of KV head g lands at key j = seqused[b] + t of that sequence's cache:
// row j of sequence b (a dense cache), or row j % page_size of page block_table[b][j / page_size]
// (a paged one). One thread moves 16 bytes, 8 f16 or bf16 elements: a row of head_dim elements
// takes head_dim / 8 threads (the host checks head_dim and every stride are multiples of 8, and
// the addresses 16-byte aligned). The index arrays' contents come unchecked (they are device
// memory) and are clamped into the cache, as the attention kernels clamp them: a key count into
// [0, capacity], a page number into [0, pages); a row that would land past its sequence's
// capacity is not written.

struct AppendParams {
    unsigned long long dst;           // the cache tensor
    unsigned long long src;           // the new rows
    unsigned long long seqused;       // [batch] i32: keys each sequence holds before the append
    unsigned long long block_table;   // [batch, pages_per_seq] i32; 0 for a dense cache
    unsigned long long counts_after;  // [batch] i32, written: the counts after the append; 0: none
    long long dst_batch, dst_seq, dst_head;  // the cache's strides in elements (paged: page, row, head)
    long long src_batch, src_seq, src_head;  // the new rows' strides in elements
    int batch, len, heads_kv;
    int vectors;                      // head_dim / 8: 16-byte vectors in a row
    int capacity;                     // keys a sequence's cache holds (seq_k)
    int page_size, pages_per_seq, pages;  // a paged cache's; unused for a dense one
};

__device__ __forceinline__ int clamp_to(int x, int lo, int hi) { return min(max(x, lo), hi); }

extern "C" __global__ void append_rows(const AppendParams p) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int* seqused = reinterpret_cast<const int*>(p.seqused);
    if (p.counts_after && i < p.batch) {
        const int used = clamp_to(seqused[i], 0, p.capacity);
        reinterpret_cast<int*>(p.counts_after)[i] = min(used + p.len, p.capacity);
    }
    if (i >= (long long)p.batch * p.len * p.heads_kv * p.vectors) return;
    const int c = (int)(i % p.vectors);
    long long r = i / p.vectors;
    const int g = (int)(r % p.heads_kv);
    r /= p.heads_kv;
    const int t = (int)(r % p.len);
    const int b = (int)(r / p.len);
    const int j = clamp_to(seqused[b], 0, p.capacity) + t;
    if (j >= p.capacity) return;
    long long to;
    if (p.block_table) {
        const int* table = reinterpret_cast<const int*>(p.block_table);
        const int page = clamp_to(table[(long long)b * p.pages_per_seq + j / p.page_size], 0, p.pages - 1);
        to = page * p.dst_batch + (j % p.page_size) * p.dst_seq + g * p.dst_head;
    } else {
        to = b * p.dst_batch + (long long)j * p.dst_seq + g * p.dst_head;
    }
    const long long from = b * p.src_batch + t * p.src_seq + g * p.src_head;
    const uint4* src = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(p.src) + from);
    uint4* dst = reinterpret_cast<uint4*>(reinterpret_cast<unsigned short*>(p.dst) + to);
    dst[c] = src[c];
}
