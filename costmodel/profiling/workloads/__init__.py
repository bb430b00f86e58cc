"""A real distributed training workload (GPT/Llama-style decoder in PyTorch) to measure on this machine.

Ground truth for ``planner validate``: data, tensor (Megatron column/row-parallel) and pipeline (1F1B)
parallelism over gloo, launched with ``python -m torch.distributed.run``. Only :mod:`.model`,
:mod:`.tensor_parallel`, :mod:`.pipeline` and :mod:`.train` import torch; :mod:`.config` and
:mod:`.runner` do not, so the rest of planner never imports torch.
"""
