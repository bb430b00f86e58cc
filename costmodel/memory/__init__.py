"""Per-GPU memory model: training states, activations, MoE / MLA / MTP terms, offloading."""
