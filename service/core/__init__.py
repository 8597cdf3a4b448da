"""The bottom layer: settings, the domain exceptions, metrics, tracing, logging, the shutdown flag.

Imports nothing else of :mod:`service`; every other layer may import it.
"""
