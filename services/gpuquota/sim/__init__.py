"""Capacity planning (interface I8): replay a workload through the scheduling core in virtual time.

A shell around :mod:`gpuquota.core`, like the embedded and distributed schedulers, but with a virtual
clock and an event heap instead of a log and node agents: ``trace`` reads and writes workloads (JSON
Lines), ``engine`` replays one through one configuration, ``report`` and ``plot`` compare the runs.
"""
