"""The read side: the read model projected from the decided events (``model``), its views of
quota shares (``shares``: the rows of ``gpuquota shares``) and nodes (``nodes``), and the
counters of the decided events (``tally``, the Prometheus counters).
"""
