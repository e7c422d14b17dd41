"""Sequence parallelism: each rank holds a contiguous slice of the sequence.

``ulysses_attention`` swaps sequence shards for head shards with two all-to-alls and runs
the device's own SDPA kernel; it needs the number of heads divisible by the group size.
``ring_attention`` passes K/V blocks around the ranks with point-to-point sends and merges
partial results by log-sum-exp; it works for any number of heads and bounds its score
memory with ``chunk_size``. Both are differentiable, take any process group, and run the
same code on gloo (CPU) and NCCL (GPU).

Around them, what a sequence-parallel training step needs besides attention:
:mod:`swift_nb.parallel.inputs` splits a model's call into this rank's shard
(``CallSplit``), and :mod:`swift_nb.parallel.gradients` averages the gradients across the
ranks before each optimizer step and reports the whole sequence's loss. The
``sequence_parallel`` toggle applies all of it to a notebook's model.

On CUDA, should these delegate to ``torch.distributed.tensor.experimental.context_parallel``?
Not from inside these functions. That API is a prototype (its interface changes between
releases); it is a context manager that replaces ``F.scaled_dot_product_attention`` for the
whole process and shards the buffers it is given in place, by default with its own
load-balanced layout (each rank holding an early and a late piece of the sequence) and,
by default, an all-gather of K/V rather than a ring, needing a ``DeviceMesh``. Its fused
kernels are faster and lighter on GPU than the fp32 tiles here, but behind the same call it
would give a different token layout, different communication and different numerics than
the CPU path (where it does not run at all in torch 2.13: there is no sharding strategy for
the CPU flash SDPA op), so code tested on CPU would not be the code that runs on GPU. Jobs
that want PyTorch's fused path on GPU should use ``context_parallel`` directly in their
training code; profiling it with swift_nb needs nothing from this module.
"""

from swift_nb.parallel._sequence import gather_sequence, shard_sequence
from swift_nb.parallel.ring import ring_attention
from swift_nb.parallel.ulysses import ulysses_attention

__all__ = ["gather_sequence", "ring_attention", "shard_sequence", "ulysses_attention"]
