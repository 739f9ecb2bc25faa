"""Data: from raw trace files to frozen, hash-verified windows (imports only :mod:`portbench.core`).

``registry`` (the official files, the data mirror, verified copies), ``traces`` (one adapter per
format -> the canonical request table), ``synth`` (seeded arrival processes and length models),
``standins`` (labelled stand-ins built from the real evidence; counterfactual windows),
``window_table`` (the window table and its hash), ``windows`` (stride sampling, the committed
manifest, verification, the window cache).
"""
