"""Tensor (and expert) parallelism: the group state layers read and the collectives
they call (``parallel_state``)."""
from core_runner.distributed.parallel_state import (
    GroupCoordinator,
    destroy_tensor_parallel,
    divide,
    expert_parallel_enabled,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    init_tensor_parallel,
    set_tp_group,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    use_tp_group,
)

__all__ = [
    "GroupCoordinator", "destroy_tensor_parallel", "divide", "expert_parallel_enabled",
    "get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size", "get_tp_group",
    "init_tensor_parallel", "set_tp_group", "tensor_model_parallel_all_gather", "tensor_model_parallel_all_reduce",
    "use_tp_group",
]
