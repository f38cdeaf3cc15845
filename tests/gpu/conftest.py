"""pytest setup for tests/gpu: make the helper modules (graphs, reference_models,
compare) importable by their plain names under any pytest import mode."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
