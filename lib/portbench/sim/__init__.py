"""Simulation: one continuously batched, paged-KV serving replica (imports :mod:`portbench.core` and
:mod:`portbench.data`).

``request`` (a request's state, what a scheduler sees), ``engine`` (the SimPy model, split by
concern), ``schedulers`` (the protocol, the registry, the 13 policies), ``profiles`` (the cost model
of an iteration and its calibration), ``regions`` (capacity, load rescaling, horizon), ``metrics``
(the metric registry and the one function computing them), ``settings`` (the ``simulation`` section
checked against the registries).
"""
