"""The seams of dbspec: one small Protocol per extension point, and the registry of its kinds.

``compute`` (where training runs), ``sources`` (where data comes from), ``gates`` (promotion
conditions) and ``targets`` (where a model is served). Each kind is one module in
``dbspec/compute``, ``dbspec/sources``, ``dbspec/gates`` or ``dbspec/targets``, or in an
installed plugin (see :mod:`dbspec.plugins`).
"""
