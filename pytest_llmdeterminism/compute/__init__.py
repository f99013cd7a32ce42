"""How the process computes: the CPU numerics the plugin pins (``numerics``), the kernels float32
linears and attention run on (``kernels``, made of ``tensor_ops`` and the fixed-order kernel in
``fixed_order``), torch's threads, seeds and determinism flags, and how every change to the process
is put back.

The engines (``engines/``) run models on top of this; nothing here loads a model.
"""
