"""Code the emulated tests append to the kernel probes they run under qemu."""

# A left-padded row's row-wise attention and the row alone, at 1, 2 and 4 threads: appended to the
# kernel probes the cross-CPU and cross-arch tests run under emulation (``found``: their results).
ATTENTION_PROBE = """
from types import SimpleNamespace
q, k, v = (torch.randn(3, 4, 24, 16) for _ in range(3))
mask = torch.ones(24, 24, dtype=torch.bool).tril()[None, None].repeat(3, 1, 1, 1)
mask[1, :, :, :10] = False
for threads in (1, 2, 4):
    torch.set_num_threads(threads)
    padded, _ = tensor_ops.rowwise_attention(SimpleNamespace(), q, k, v, mask, scaling=0.25)
    alone, _ = tensor_ops.rowwise_attention(SimpleNamespace(), q[1:2, :, 10:], k[1:2, :, 10:],
                                            v[1:2, :, 10:], None, scaling=0.25)
    found[f"attention at {threads} threads: rows equal"] = torch.equal(padded[1, 10:], alone[0])
    found[f"attention at {threads} threads"] = xxhash.xxh3_64_hexdigest(alone.numpy().tobytes())
# position-canonical attention at SmolLM2's heads: a position decoded alone is the prefill's row
q, k, v = torch.randn(9, 40, 64), torch.randn(3, 40, 64), torch.randn(3, 40, 64)
once = tensor_ops.canonical_attention(q, k, v, 0.125)
found["attention decode rows equal"] = all(torch.equal(
    tensor_ops.canonical_attention(q[:, p:p + 1], k[:, :p + 1], v[:, :p + 1], 0.125)[:, 0], once[:, p])
    for p in range(0, 40, 3))
found["attention at SmolLM2's heads"] = xxhash.xxh3_64_hexdigest(once.numpy().tobytes())
"""
