"""Presentation: figures and text for the notebooks, the terminal and the README (imports every layer
below, and the validation's results; the only place with matplotlib and seaborn).

``figures`` (the one figure helper: style, byte-reproducible PNG + PDF, the index), ``plots_data``
(notebooks 01-02), ``plots_sim`` (notebook 03), ``plots_analysis`` (notebooks 04-07, and the
``portbench analyze`` stage), ``text`` (generated Markdown and terminal reports), ``report`` (the
README's results block), ``validation_report`` and ``plots_validation`` (notebook 08: the validation's prose,
tables and figures).
"""
