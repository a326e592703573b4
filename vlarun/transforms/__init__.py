"""Model -> model transforms (a new model is returned; the original is not patched).

layer_prune.py   EfficientVLA's training-free layer pruning: importance of each LM layer on
                 calibration samples, removal of the least important (non-contiguous) layers
mlp_sparsity.py  MLP channel selection (EfficientVLA's optional extra)
int8.py          weight-only per-output-channel int8 of the LM's and the action head's
                 projections (``Int8Linear``: PyTorch's int8-weight kernel on the CPU)

CPU weight prepacking (``LlamaLM.prepack``) is the engine's own, since it swaps modules in
place for oneDNN and is a no-op off the CPU.
"""
