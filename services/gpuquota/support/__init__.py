"""Small tools every layer may use: the clock, ids, ARNs, directory locks, the HTTP listener and
the exposure checks of listeners. They import nothing of gpuquota.
"""
